-- One client's gate (store/gate.py, docs/caps.md): admit a received document, or hold it;
-- end a document and release held ones.  Atomic per client: every key shares its hash tag.
--
-- KEYS[1]  run   ZSET  task id -> lease deadline (ms): documents running, or released and
--                      on their way back through the broker (a reservation)
-- KEYS[2]  held  LIST  task ids held, oldest first
-- KEYS[3]  msg   HASH  task id -> the held document's message, as the broker delivered it
-- KEYS[4]  gate  HASH  tk, ts: the rate's tokens and when they were counted (ms);
--                      sum: the units of cost running; u:<id> a running document's units;
--                      h:<id> a held document's units, at:<id> when it was held (ms)
--
-- ARGV[1]  "admit" or "end"
-- ARGV[2]  task id: the document received (admit) or ended (end; "" for a sweep)
-- ARGV[3]  now, ms (the caller's clock: every worker's clock drifts less than a lease)
-- ARGV[4]  lease, ms
-- ARGV[5]  max_in_flight, -1 for none
-- ARGV[6]  max_cost_in_flight in units (thousandths), -1 for none
-- ARGV[7]  the rate in tokens per ms, 0 for none
-- ARGV[8]  the rate's bucket, in tokens
-- ARGV[9]  end: how many documents may start beyond the caps now (borrowing: the caller saw
--          the queue empty and idle slots); for the end of a document, at most as many as
--          ran beyond the cap before it ended; 0 for none
-- ARGV[10] most documents to release in this call
-- ARGV[11] admit: the document's units; ARGV[12] admit: its message
--
-- Returns {verdict, state, due, id1, message1, id2, message2, ...}:
--   verdict  1 run it, 0 held (its message is stored), 2 already held (a redelivery), -1 end
--   state    what holds the client's oldest held document now: "cap" or "rate" (due: when
--            its token is due, ms); with nothing held, "lease" while documents run (due:
--            when the first lease runs out), else "none"
--   then the released documents: the caller publishes each again, then deletes its
--   message (HDEL msg id); a caller killed before that leaves it for the lease to return.

local run, held, msg, gate = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local mode, id = ARGV[1], ARGV[2]
local now, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local cap, max_units = tonumber(ARGV[5]), tonumber(ARGV[6])
local rate, bucket = tonumber(ARGV[7]), tonumber(ARGV[8])
local borrow, most = tonumber(ARGV[9]), tonumber(ARGV[10])
local ONE = 1000
local EPSILON = 1e-6

local function units_running()
  return tonumber(redis.call('HGET', gate, 'sum') or '0')
end

local function take(task, units)
  redis.call('ZADD', run, now + lease, task)
  redis.call('HSET', gate, 'u:' .. task, units)
  redis.call('HINCRBY', gate, 'sum', units)
end

local function drop(task)
  if redis.call('ZREM', run, task) == 0 then
    return false
  end
  local units = tonumber(redis.call('HGET', gate, 'u:' .. task) or ONE)
  redis.call('HDEL', gate, 'u:' .. task)
  local left = redis.call('HINCRBY', gate, 'sum', -units)
  if left < 0 then
    redis.call('HSET', gate, 'sum', 0)
  end
  return true
end

-- Leases that ran out: a crashed worker's documents.  One released but never published
-- again (its message is still here) goes back to the front of the held list.
local function expire()
  local lapsed = redis.call('ZRANGEBYSCORE', run, '-inf', now)
  for i = #lapsed, 1, -1 do
    local task = lapsed[i]
    drop(task)
    if redis.call('HEXISTS', msg, task) == 1 then
      redis.call('LPUSH', held, task)
    end
  end
end

local function tokens()
  local tk = tonumber(redis.call('HGET', gate, 'tk') or bucket)
  local ts = tonumber(redis.call('HGET', gate, 'ts') or now)
  local refilled = tk + (now - ts) * rate
  if refilled > bucket then
    refilled = bucket
  end
  return refilled
end

-- What holds a document of `units` now: nil (nothing), "cap", or "rate" and when its token
-- is due.  A borrowed start passes the caps, never the rate.
local function blocker(units, borrowed)
  local running = redis.call('ZCARD', run)
  if not borrowed and cap >= 0 and running >= cap then
    return 'cap', 0
  end
  if not borrowed and max_units >= 0 and running > 0 and units_running() + units > max_units then
    return 'cap', 0
  end
  if rate > 0 then
    local tk = tokens()
    -- EPSILON: the sums of a rate's float steps land a hair under a whole token.
    if tk < 1 - EPSILON then
      return 'rate', now + math.ceil((1 - tk) / rate - EPSILON)
    end
  end
  return nil, 0
end

local function spend()
  if rate > 0 then
    redis.call('HSET', gate, 'tk', tokens() - 1, 'ts', now)
  end
end

local function release(out)
  local released = 0
  while released < most do
    local head = redis.call('LINDEX', held, 0)
    if not head then
      return 'none', 0
    end
    local units = tonumber(redis.call('HGET', gate, 'h:' .. head) or ONE)
    local borrowed = false
    local why, due = blocker(units, false)
    if why == 'cap' and borrow > 0 then
      borrowed = true
      why, due = blocker(units, true)
    end
    if why then
      return why, due
    end
    redis.call('LPOP', held)
    redis.call('HDEL', gate, 'h:' .. head, 'at:' .. head)
    local message = redis.call('HGET', msg, head)
    if message then
      take(head, units)
      spend()
      if borrowed then
        borrow = borrow - 1
      end
      released = released + 1
      out[#out + 1] = head
      out[#out + 1] = message
    end
  end
  if redis.call('LLEN', held) == 0 then
    return 'none', 0
  end
  local why, due = blocker(tonumber(redis.call('HGET', gate, 'h:' .. redis.call('LINDEX', held, 0)) or ONE), false)
  return why or 'cap', due
end

local function settle(verdict)
  local out = {}
  local state, due = release(out)
  if state == 'none' then
    -- Nothing held, but a reservation may be orphaned (its releaser died before publishing):
    -- the sweep looks again when the first lease runs out.
    local first = redis.call('ZRANGE', run, 0, 0, 'WITHSCORES')
    if first[1] then
      state, due = 'lease', tonumber(first[2]) + 1
    end
  end
  if redis.call('ZCARD', run) > 0 then
    redis.call('PEXPIRE', run, 2 * lease)
  end
  if redis.call('LLEN', held) == 0 and redis.call('ZCARD', run) == 0 then
    -- Nothing to hold the tokens for once the bucket would be full again.
    local refill = rate > 0 and math.ceil(bucket / rate) or 0
    redis.call('PEXPIRE', gate, refill + lease)
  else
    redis.call('PERSIST', gate)
  end
  local reply = {verdict, state, due}
  for i = 1, #out do
    reply[#reply + 1] = out[i]
  end
  return reply
end

local function park(units)
  redis.call('RPUSH', held, id)
  redis.call('HSET', msg, id, ARGV[12])
  redis.call('HSET', gate, 'h:' .. id, units, 'at:' .. id, now)
end

if mode == 'end' then
  if id ~= '' and cap >= 0 then
    local beyond = redis.call('ZCARD', run) - cap
    if borrow > beyond then
      borrow = beyond > 0 and beyond or 0
    end
  end
  if id ~= '' then
    drop(id)
  end
  expire()
  return settle(-1)
end

-- admit
if redis.call('ZSCORE', run, id) then
  -- A released document back from the broker, or one delivered again: it has its place.
  redis.call('ZADD', run, now + lease, id)
  redis.call('HDEL', msg, id)
  return settle(1)
end
if redis.call('HEXISTS', msg, id) == 1 then
  return settle(2)
end
expire()
local units = tonumber(ARGV[11])
if redis.call('LLEN', held) == 0 then
  borrow = 0
  local why = blocker(units, false)
  if not why then
    take(id, units)
    spend()
    return settle(1)
  end
end
park(units)
return settle(0)
