-- The end of one document in the inflight mode, once costs are in use (store/costs.py).
--
-- KEYS[1]: the client's in-flight list, "<prefix>{token}:i".
-- KEYS[2]: the client's extras, "<prefix>{token}:ic": what its costed documents in flight
--          add beyond 1 each, in thousandths.
-- ARGV[1]: the document's entry (store/inflight.py member(): digest, and its extra if any).
-- ARGV[2]: the units its cost adds beyond 1 (a signed integer, 0 for cost 1).
-- ARGV[3]: the idle reset, milliseconds.
-- Returns: 1 when this call ended the document, 0 when it was not in flight.
--
-- LREM removes the entry at most once, and only a removal gives the extra back, so each
-- counted document returns exactly its cost once, whatever the order of ends, duplicate
-- events or redeliveries.  A list that empties takes its extras with it: nothing in
-- flight is a count of 0 exactly.  Both keys keep the idle reset as their TTL.

local removed = redis.call('LREM', KEYS[1], -1, ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2])
  return removed
end
local extra = tonumber(ARGV[2])
if removed == 1 and extra ~= 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('INCRBY', KEYS[2], -extra)
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return removed
