-- Switching a kombu Redis queue off the router: move messages out of the priority lists
-- a plain Celery worker does not poll, into one it does.
--
-- KEYS[1]: the target list, one a plain worker polls: "<queue>" for step 0, else
--          "<queue>\x06\x16<step>" (kombu's names, with its global_keyprefix if set).
-- KEYS[2..]: the source lists whose messages belong in KEYS[1], least urgent first
--          (for target step 3: step 2's list, then step 1's).
-- ARGV[1]: the most messages to move in this call (bounds the time the script holds Redis).
-- Returns: the number of messages moved.
--
-- kombu LPUSHes every message and its workers BRPOP, so a list's tail is served next.
-- Each source is drained newest first (LPOP) onto the target's tail (RPUSH): when the
-- sources are empty, the target serves the most urgent source's oldest message first, each
-- source's messages in their own order, and the target's own messages after them.  One
-- script runs at a time, so every message is moved whole or not at all, never lost or
-- copied, while workers consume; a rerun moves whatever is left.

local limit = tonumber(ARGV[1])
local moved = 0
for i = 2, #KEYS do
  while moved < limit do
    local raw = redis.call('LPOP', KEYS[i])
    if not raw then
      break
    end
    redis.call('RPUSH', KEYS[1], raw)
    moved = moved + 1
  end
end
return moved
