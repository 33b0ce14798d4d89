-- One counted publish of a costed document in the inflight mode (store/inflight.py).
--
-- KEYS[1]: the client's in-flight list, "<prefix>{token}:i".
-- KEYS[2]: the client's tier key, "<prefix>{token}:t" (read only when ARGV[4] is "1").
-- ARGV[1]: the document's entry (its digest and its extra, inflight.member()).
-- ARGV[2]: the units its cost adds beyond 1 (a signed integer, store/costs.py).
-- ARGV[3]: the idle reset, milliseconds.
-- ARGV[4]: "1" to read the tier.
-- ARGV[5]: the extras entry's prefix (costs.SENTINEL).
-- Returns: {documents in flight, now this one too; the client's extras, now with this
--          document's; the stored tier or false}.
--
-- The extras live in one entry at the list's oldest end, so the list still holds the
-- documents in publish order before it and an end's LREM -1 meets the extras entry first
-- and passes it at once (a different length).

local list, prefix = KEYS[1], ARGV[5]
redis.call('LPUSH', list, ARGV[1])
local oldest = redis.call('LINDEX', list, -1)
local extras = tonumber(ARGV[2])
if string.sub(oldest, 1, #prefix) == prefix then
  extras = extras + tonumber(string.sub(oldest, #prefix + 1))
  redis.call('LSET', list, -1, prefix .. string.format('%d', extras))
else
  redis.call('RPUSH', list, prefix .. string.format('%d', extras))
end
redis.call('PEXPIRE', list, ARGV[3])
local tier = false
if ARGV[4] == '1' then
  tier = redis.call('GET', KEYS[2])
end
return {redis.call('LLEN', list) - 1, extras, tier}
