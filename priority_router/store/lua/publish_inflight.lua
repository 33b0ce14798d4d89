-- One counted publish in the inflight mode (store/inflight.py).
--
-- KEYS[1]: the client's in-flight list, "<prefix>{token}:i".
-- KEYS[2]: the client's tier key, "<prefix>{token}:t" (read only when ARGV[4] is "1").
-- KEYS[3]: the client's order key, "<prefix>{token}:o": the units its newest document was
--          checked at, a space, and that document's entry.
-- KEYS[4]: the client's unconfirmed documents, "<prefix>{token}:u": entry -> the time (ms,
--          the store's clock) after which it is dropped unless its publisher confirmed it.
-- ARGV[1]: the document's entry (its digest and its extra, inflight.member()).
-- ARGV[2]: the units its cost adds beyond 1 (a signed integer, store/costs.py; 0 for cost 1).
-- ARGV[3]: the idle reset, milliseconds.
-- ARGV[4]: "1" to read the tier.
-- ARGV[5]: "1" to read the client's extras (some costed document was counted under the prefix).
-- ARGV[6]: the extras entry's prefix (costs.SENTINEL).
-- ARGV[7]: the units of a document of cost 1 (costs.RESOLUTION).
-- ARGV[8]: ms the document stays counted unless its publisher confirms that the broker took
--          it (the confirm removes it from KEYS[4]); "0": none asked (it is counted until
--          it ends, or the idle reset).
-- Returns: {the units the document is checked at, the stored tier or false}.
--
-- The units are the costs in flight before the document, and never fewer than its client's
-- newest document still in flight was checked at.  So among a client's documents in flight
-- the units never fall in publish order, nor do their priorities rise: a document published
-- while older ones of its client wait goes behind them, as it would on a plain queue.  When
-- the newest document has finished, every older one of its client has started (it was
-- published at the same priority or a more urgent one), and the count alone decides again.
-- A document checked at 0 (nothing in flight) leaves the order key as it was: no floor is
-- lower, and a key naming a finished document is never the list's newest entry.  So a
-- client sending one document at a time never has one.
--
-- The extras live in one entry at the list's oldest end, so the list still holds the
-- documents in publish order before it and an end's LREM -1 meets the extras entry first
-- and passes it at once (a different length).

local list, order, unconfirmed, entry = KEYS[1], KEYS[3], KEYS[4], ARGV[1]
local extra, prefix = tonumber(ARGV[2]), ARGV[6]
local window = tonumber(ARGV[8])

-- The units beyond 1 an entry stands for: its 4 trailing bytes, big-endian and signed.
local function extra_of(e)
  if #e ~= 12 then
    return 0
  end
  local b1, b2, b3, b4 = string.byte(e, 9, 12)
  local value = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
  if value >= 2147483648 then
    value = value - 4294967296
  end
  return value
end

-- Documents whose publisher never confirmed that the broker took them (killed between
-- this count and its send): no worker will ever end them, so they stop counting here.
local now = 0
if window > 0 or redis.call('EXISTS', unconfirmed) == 1 then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local lapsed = redis.call('ZRANGEBYSCORE', unconfirmed, '-inf', now)
  if #lapsed > 0 then
    for i = 1, #lapsed do
      local gone = extra_of(lapsed[i])
      if redis.call('LREM', list, -1, lapsed[i]) > 0 and gone ~= 0 then
        local oldest = redis.call('LINDEX', list, -1)
        if oldest and string.sub(oldest, 1, #prefix) == prefix then
          local extras = tonumber(string.sub(oldest, #prefix + 1)) - gone
          redis.call('LSET', list, -1, prefix .. string.format('%d', extras))
        end
      end
    end
    redis.call('ZREMRANGEBYSCORE', unconfirmed, '-inf', now)
  end
end

local floor = 0
local newest = redis.call('LINDEX', list, 0)
if newest then
  local kept = redis.call('GET', order)
  if kept then
    local space = string.find(kept, ' ', 1, true)
    if space and string.sub(kept, space + 1) == newest then
      floor = tonumber(string.sub(kept, 1, space - 1))
    end
  end
end

local documents = redis.call('LPUSH', list, entry) - 1
local extras = 0
if extra ~= 0 or ARGV[5] == '1' then
  local oldest = redis.call('LINDEX', list, -1)
  if string.sub(oldest, 1, #prefix) == prefix then
    documents = documents - 1
    extras = tonumber(string.sub(oldest, #prefix + 1))
    if extra ~= 0 then
      redis.call('LSET', list, -1, prefix .. string.format('%d', extras + extra))
    end
  elseif extra ~= 0 then
    redis.call('RPUSH', list, prefix .. string.format('%d', extra))
  end
end

local units = math.max(0, documents * tonumber(ARGV[7]) + extras, floor)
if units > 0 then
  redis.call('SET', order, string.format('%d', units) .. ' ' .. entry, 'PX', ARGV[3])
end
redis.call('PEXPIRE', list, ARGV[3])
if window > 0 then
  redis.call('ZADD', unconfirmed, now + window, entry)
  redis.call('PEXPIRE', unconfirmed, ARGV[3])
end
local tier = false
if ARGV[4] == '1' then
  tier = redis.call('GET', KEYS[2])
end
return {units, tier}
