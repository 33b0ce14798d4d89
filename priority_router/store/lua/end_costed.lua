-- The end of one document in the inflight mode, once costs are in use (store/costs.py), or
-- when the entry its end looked for was not there.
--
-- KEYS[1]: the client's in-flight list, "<prefix>{token}:i"; once a costed document was
--          published on it, its oldest entry holds the client's extras (costs.sentinel()).
-- ARGV[1]: the document's entry as its end expects it (inflight.member(): its 8-byte digest,
--          and the extra of the cost the end was given, if any).
-- ARGV[2]: the units that cost adds beyond 1 (a signed integer, 0 for cost 1).
-- ARGV[3]: the idle reset, milliseconds.
-- ARGV[4]: the extras entry's prefix (costs.SENTINEL).
-- Returns: {1, extra} when this call ended the document, extra being the units beyond 1 it
--          was counted with (ARGV[2] unless the end gave another cost); {0, 0} when it was
--          not in flight (the TTL is re-armed all the same, as by any end).
--
-- The digest is the key, the cost a check: an entry that is not ARGV[1] but has its digest
-- (the same document counted at another cost) is ended instead, oldest first, and its own
-- extra goes back.  LREM removes the entry at most once, and only a removal gives the extra
-- back, so each counted document returns exactly its cost once, whatever the order of ends,
-- duplicate events or redeliveries.  A list left with its extras entry alone is deleted:
-- nothing in flight is a count of 0 exactly.  The TTL stays the idle reset.

local list, wanted, prefix = KEYS[1], ARGV[1], ARGV[4]
local extra = tonumber(ARGV[2])

-- The oldest entry of the list with the document's digest, whatever its extra; nil if none.
local function find(digest)
  local length = redis.call('LLEN', list)
  local stop = -1
  while -stop <= length do
    local start = math.max(stop - 255, -length)
    local entries = redis.call('LRANGE', list, start, stop)
    for i = #entries, 1, -1 do
      local entry = entries[i]
      if (#entry == 8 or #entry == 12) and string.sub(entry, 1, 8) == digest then
        return entry
      end
    end
    stop = start - 1
  end
  return nil
end

-- The units beyond 1 an entry stands for: its 4 trailing bytes, big-endian and signed.
local function extra_of(entry)
  if #entry == 8 then
    return 0
  end
  local b1, b2, b3, b4 = string.byte(entry, 9, 12)
  local value = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
  if value >= 2147483648 then
    value = value - 4294967296
  end
  return value
end

local removed = redis.call('LREM', list, -1, wanted)
if removed == 0 then
  local found = find(string.sub(wanted, 1, 8))
  if found then
    removed = redis.call('LREM', list, -1, found)
    extra = extra_of(found)
  else
    extra = 0
  end
end
local oldest = redis.call('LINDEX', list, -1)
if not oldest then
  return {removed, extra}
end
if string.sub(oldest, 1, #prefix) == prefix then
  if redis.call('LLEN', list) == 1 then
    redis.call('DEL', list)
    return {removed, extra}
  end
  if extra ~= 0 then
    local extras = tonumber(string.sub(oldest, #prefix + 1)) - extra
    redis.call('LSET', list, -1, prefix .. string.format('%d', extras))
  end
end
redis.call('PEXPIRE', list, ARGV[3])
return {removed, extra}
