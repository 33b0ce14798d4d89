-- Adopt the documents an older release's gate held in the counter store (store/old_held.py,
-- docs/lifecycle.md): builds that reported 0.1.0, up to b0b0e69, kept a held document's
-- message in the client's `:msg` hash; this release keeps it in the broker.  A claim moves
-- messages from `:msg` to `:adopting`, where an older worker still running no longer
-- releases them; the caller publishes each to the broker, then deletes it from `:adopting`.
-- A caller killed in between leaves them in `:adopting`: the next claim returns them again
-- (at least once).  Atomic per client: every key shares its hash tag.
--
-- KEYS[1]  run       ZSET  task id -> lease deadline (ms), this release's and the older one's
-- KEYS[2]  held      LIST  task ids counted held, oldest first
-- KEYS[3]  msg       HASH  task id -> message: the older release's held documents
-- KEYS[4]  gate      HASH  h:<id> a held document's units, at:<id> when it was held (ms)
-- KEYS[5]  adopting  HASH  task id -> message: claimed, not yet known to be in the broker
-- KEYS[6]  lock      STRING the token of the worker adopting this client's documents now
--
-- ARGV[1]  "claim" or "unlock"
-- ARGV[2]  the caller's token
-- ARGV[3]  now, ms
-- ARGV[4]  claim: ms the lock lasts (a killed adopter's claims are taken up after it)
-- ARGV[5]  claim: 1 when the client has limits now (its documents go to its holding queue
--          and are counted held), else 0 (they go back to their queue, and are not)
-- ARGV[6]  claim: most messages to move from `msg` to `adopting`
--
-- Returns {1, id1, message1, id2, message2, ...}: every message in `adopting` (left by a
-- killed adopter, and those claimed now), or {0} when another worker holds the lock.
-- A document in `run` with a lease not run out is left in `msg`: an older worker released
-- it and is publishing it (it then deletes it), or it runs.

local run, held, msg, gate, adopting, lock = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local mode, token, now = ARGV[1], ARGV[2], tonumber(ARGV[3])

local owner = redis.call('GET', lock)
if owner and owner ~= token then
  return {0}
end
if mode == 'unlock' then
  if owner then
    redis.call('DEL', lock)
  end
  return {1}
end

local limited, most = tonumber(ARGV[5]) == 1, tonumber(ARGV[6])
redis.call('SET', lock, token, 'PX', tonumber(ARGV[4]))
local claimed = 0
for _, id in ipairs(redis.call('HKEYS', msg)) do
  if claimed >= most then
    break
  end
  local lease = redis.call('ZSCORE', run, id)
  if not lease or tonumber(lease) <= now then
    redis.call('HSET', adopting, id, redis.call('HGET', msg, id))
    redis.call('HDEL', msg, id)
    claimed = claimed + 1
    if limited then
      -- Counted held as this release counts a held document (its release takes the id off).
      if redis.call('HEXISTS', gate, 'h:' .. id) == 0 then
        redis.call('RPUSH', held, id)
        redis.call('HSET', gate, 'h:' .. id, 1000)
      end
      redis.call('HSET', gate, 'at:' .. id, now)
      redis.call('PERSIST', gate)
    else
      redis.call('LREM', held, 1, id)
      redis.call('HDEL', gate, 'h:' .. id, 'at:' .. id)
    end
  end
end
local out = {1}
local left = redis.call('HGETALL', adopting)
for i = 1, #left do
  out[#out + 1] = left[i]
end
return out
