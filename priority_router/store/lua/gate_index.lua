-- Take a client off the index of clients with held documents (store/gate.py), only if
-- no worker indexed it again since the sweep that found it holding nothing read its score.
--
-- KEYS[1]  the index: ZSET client id -> when a worker should look again (ms)
-- ARGV[1]  the client id
-- ARGV[2]  the score the sweep read
--
-- Returns 1 when the client was removed, else 0.

local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
