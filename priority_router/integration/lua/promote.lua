-- Anti-starvation for one kombu Redis queue: serve documents that waited too long first.
--
-- KEYS: the queue's priority lists, most urgent first, exactly as kombu's Redis transport
--       names them and BRPOPs them: KEYS[1] is "<queue>" (step 0), KEYS[i] for i > 1 is
--       "<queue>\x06\x16<step>".  KEYS[1] is the target; KEYS[2..] are swept.
-- ARGV[1]: max_wait, seconds (a decimal number).
-- ARGV[2]: the most messages to move in this call (bounds the time the script holds Redis).
-- ARGV[3]: the header that holds the publish time (Unix seconds), e.g.
--          "priority_router_published_at".
-- Returns: the number of messages moved.
--
-- kombu LPUSHes every message and its worker BRPOPs, so the oldest message of each list
-- is its last element (LINDEX -1).  While the oldest of those tails was published more
-- than max_wait ago (by Redis's TIME), it is RPOPped from its list and LPUSHed onto
-- KEYS[1]: the list every worker polls first, where it queues behind the documents
-- promoted before it (all older) and ahead of every fresher document of KEYS[2..].
-- Globally oldest first, so KEYS[1] stays in publish order across calls and sweepers.
-- One script runs at a time, so any number of sweepers and consumers can run at once:
-- each message is moved whole or not at all, never lost or copied.  A tail without a
-- readable publish time (not JSON, no header) is left where it is, and so is its list
-- behind it, until a worker takes it.

if redis.replicate_commands then
  redis.replicate_commands() -- Redis < 5: replicate the writes, not the script (uses TIME)
end

local header = ARGV[3]

local function published_at(raw)
  if not raw then
    return nil
  end
  local ok, message = pcall(cjson.decode, raw)
  if not ok or type(message) ~= 'table' then
    return nil
  end
  local headers = message['headers']
  if type(headers) ~= 'table' then
    return nil
  end
  local at = headers[header]
  if type(at) ~= 'number' and type(at) ~= 'string' then
    return nil
  end
  return tonumber(at)
end

local time = redis.call('TIME')
local cutoff = tonumber(time[1]) + tonumber(time[2]) / 1000000 - tonumber(ARGV[1])
local limit = tonumber(ARGV[2])

local tails = {}
for i = 2, #KEYS do
  tails[i] = published_at(redis.call('LINDEX', KEYS[i], -1))
end

local moved = 0
while moved < limit do
  local oldest, oldest_at = nil, nil
  for i = 2, #KEYS do
    local at = tails[i]
    if at and at <= cutoff and (oldest_at == nil or at < oldest_at) then
      oldest, oldest_at = i, at
    end
  end
  if oldest == nil then
    break
  end
  local raw = redis.call('RPOP', KEYS[oldest])
  redis.call('LPUSH', KEYS[1], raw)
  moved = moved + 1
  tails[oldest] = published_at(redis.call('LINDEX', KEYS[oldest], -1))
end
return moved
