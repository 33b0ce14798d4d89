-- The end of one document in the inflight mode, once costs are in use (store/costs.py).
--
-- KEYS[1]: the client's in-flight list, "<prefix>{token}:i"; once a costed document was
--          published on it, its oldest entry holds the client's extras (costs.sentinel()).
-- ARGV[1]: the document's entry (inflight.member(): its digest, and its extra if any).
-- ARGV[2]: the units its cost adds beyond 1 (a signed integer, 0 for cost 1).
-- ARGV[3]: the idle reset, milliseconds.
-- ARGV[4]: the extras entry's prefix (costs.SENTINEL).
-- Returns: 1 when this call ended the document, 0 when it was not in flight.
--
-- LREM removes the entry at most once, and only a removal gives the extra back, so each
-- counted document returns exactly its cost once, whatever the order of ends, duplicate
-- events or redeliveries.  A list left with its extras entry alone is deleted: nothing in
-- flight is a count of 0 exactly.  The TTL stays the idle reset.

local list, prefix = KEYS[1], ARGV[4]
local removed = redis.call('LREM', list, -1, ARGV[1])
local oldest = redis.call('LINDEX', list, -1)
if not oldest then
  return removed
end
if string.sub(oldest, 1, #prefix) == prefix then
  if redis.call('LLEN', list) == 1 then
    redis.call('DEL', list)
    return removed
  end
  local extra = tonumber(ARGV[2])
  if removed == 1 and extra ~= 0 then
    local extras = tonumber(string.sub(oldest, #prefix + 1)) - extra
    redis.call('LSET', list, -1, prefix .. string.format('%d', extras))
  end
end
redis.call('PEXPIRE', list, ARGV[3])
return removed
