-- One client's gate (store/gate.py, docs/caps.md): admit a received document or count it
-- held; end a document; let a held one start.  Atomic per client: every key shares its hash
-- tag.  The store only counts: a held document's message waits in the broker, in the
-- client's holding queue (integration/holding.py), never here.
--
-- KEYS[1]  run   ZSET  task id -> lease deadline (ms): documents running, or released and
--                      on their way back through the broker (a reservation)
-- KEYS[2]  held  LIST  task ids counted held, oldest first ("?": one the broker holds that
--                      this store did not count, after it lost its keys: ARGV[1] "mark")
-- KEYS[3]  gate  HASH  tk, ts: the rate's tokens and when they were counted (ms);
--                      sum: the units of cost running; u:<id> a running document's units;
--                      h:<id> a held document's units, at:<id> when it was held (ms);
--                      rs: the rate's tokens reserved by released documents on their way
--                      back, r:<id> one such reservation; w:<id> a document taken for
--                      release that has neither been marked sent nor arrived at a worker
-- KEYS[4]  sent  ZSET  task id -> when (ms): released documents published again whose
--                      arrival no worker has seen yet; a copy of one still in the holding
--                      queue (its releaser killed before letting go of it) is dropped.
--                      A mark goes when the document arrives or ends, and is not made for
--                      one that arrived before its releaser marked it
--
-- ARGV[1]  "admit", "end", "take", "sent", "mark" or "clear"; "check" runs every command
--          the script uses, on KEYS of a client no document has, leaving them as they were
-- ARGV[2]  task id: the document received (admit), ended (end; "" for a sweep) or taken
--          from the holding queue (take)
-- ARGV[3]  now, ms (the caller's clock: every worker's clock drifts less than a lease)
-- ARGV[4]  lease, ms
-- ARGV[5]  max_in_flight, -1 for none
-- ARGV[6]  max_cost_in_flight in units (thousandths), -1 for none
-- ARGV[7]  the rate in tokens per ms, 0 for none
-- ARGV[8]  the rate's bucket, in tokens
-- ARGV[9]  end: how many documents may start beyond the caps now (borrowing: the caller saw
--          the queue empty and idle slots; for the end of a document, at most as many as
--          ran beyond the cap before it ended); take: 1 when this one may borrow; else 0
-- ARGV[10] admit, take: the document's units; mark: how many the holding queue has;
--          clear: ms after which a held count whose message is not in the queue is stale;
--          sent: ms to remember a published release (longer than a held copy can take
--          to come back to its holding queue)
--
-- Returns {verdict, state, due, held, borrow}:
--   verdict  admit: 1 run it, 0 hold it, 2 held already (a redelivery: hold it again);
--            take: 1 start it (its place reserved), 4 start it as borrowed, 3 leave it
--            held, 2 a copy of one already sent (drop it);
--            end, sent, mark, clear: -1; check: {1}
--   state    what the client's next held document waits for: "cap", or "rate" (due: when
--            its token is due, ms), or "free" when one may start now (the caller takes from
--            the holding queue); with nothing held, "lease" while documents run (due: when
--            the first lease runs out), else "none"
--   held     how many documents this store counts held for the client
--   borrow   end: how many of ARGV[9] may still start beyond the caps

local run, held, gate, sent = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local mode, id = ARGV[1], ARGV[2]
local now, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local cap, max_units = tonumber(ARGV[5]), tonumber(ARGV[6])
local rate, bucket = tonumber(ARGV[7]), tonumber(ARGV[8])
local borrow = tonumber(ARGV[9])
local number = tonumber(ARGV[10])
local ONE = 1000
local EPSILON = 1e-6
local UNKNOWN = '?'

local function units_running()
  return tonumber(redis.call('HGET', gate, 'sum') or '0')
end

local function take(task, units)
  redis.call('ZADD', run, now + lease, task)
  redis.call('HSET', gate, 'u:' .. task, units)
  redis.call('HINCRBY', gate, 'sum', units)
end

-- A released document's token, reserved until it starts: its start spends it
-- (spend_reserved), or it goes back to the bucket if the document never arrives.
local function reserved()
  return tonumber(redis.call('HGET', gate, 'rs') or '0')
end

local function unreserve(task)
  if redis.call('HDEL', gate, 'r:' .. task) == 1 and redis.call('HINCRBY', gate, 'rs', -1) < 0 then
    redis.call('HSET', gate, 'rs', 0)
  end
end

local function drop(task)
  if redis.call('ZREM', run, task) == 0 then
    return false
  end
  unreserve(task)
  local units = tonumber(redis.call('HGET', gate, 'u:' .. task) or ONE)
  redis.call('HDEL', gate, 'u:' .. task)
  local left = redis.call('HINCRBY', gate, 'sum', -units)
  if left < 0 then
    redis.call('HSET', gate, 'sum', 0)
  end
  return true
end

-- Leases that ran out: a crashed worker's documents, or reservations whose releaser died
-- (their message is still in the holding queue, unacknowledged, and comes back there).
local function expire()
  local lapsed = redis.call('ZRANGEBYSCORE', run, '-inf', now)
  for i = 1, #lapsed do
    drop(lapsed[i])
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
    -- Tokens reserved by released documents still on their way back are not free.
    local taken = reserved()
    local tk = tokens() - taken
    -- EPSILON: the sums of a rate's float steps land a hair under a whole token.
    if tk < 1 - EPSILON then
      if bucket - taken < 1 - EPSILON then
        -- Even a full bucket is reserved: a token frees when one of them starts, so look
        -- again in a token's time.
        return 'rate', now + math.ceil(1 / rate)
      end
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

-- A release takes no token yet: it reserves one, which its start spends.  Released
-- documents wait in the queue behind others of their priority and may come back together;
-- spent at the release, their tokens would let them all start at once.
local function reserve(task)
  if rate > 0 then
    redis.call('HSET', gate, 'r:' .. task, 1)
    redis.call('HINCRBY', gate, 'rs', 1)
  end
end

local function unhold(task)
  if redis.call('LREM', held, 1, task) == 0 then
    -- Counted as an unknown one ("mark"), or not counted at all (the store lost it).
    redis.call('LREM', held, 1, UNKNOWN)
  end
  redis.call('HDEL', gate, 'h:' .. task, 'at:' .. task)
end

local function settle(verdict)
  local waiting = redis.call('LLEN', held)
  local state, due = 'none', 0
  if waiting > 0 then
    -- The next document's units are not known here (its message is in the broker): a
    -- document of one unit decides; a costlier one the take then leaves held.
    local why, when = blocker(ONE, false)
    if why == 'cap' and borrow > 0 then
      why, when = blocker(ONE, true)
    end
    state, due = why or 'free', when
  else
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
  if waiting == 0 and redis.call('ZCARD', run) == 0 then
    -- Nothing to hold the tokens for once the bucket would be full again.
    local refill = rate > 0 and math.ceil(bucket / rate) or 0
    redis.call('PEXPIRE', gate, refill + lease)
  else
    redis.call('PERSIST', gate)
  end
  return {verdict, state, due, waiting, borrow}
end

if mode == 'check' then
  -- A worker runs this before its gate holds any document (store/gate.py): a Redis user
  -- refused one of these commands is found then, not once documents wait for an end that
  -- cannot be counted.  Each changes nothing, or undoes what the one before it did.
  redis.call('ZADD', run, 'XX', 0, id)
  redis.call('ZSCORE', run, id)
  redis.call('ZCARD', run)
  redis.call('ZRANGE', run, 0, 0)
  redis.call('ZRANGEBYSCORE', run, '-inf', '-inf')
  redis.call('EXISTS', sent)
  redis.call('ZREM', run, id)
  redis.call('ZREMRANGEBYSCORE', sent, '-inf', '-inf')
  -- What undoes a write is checked before the write, so a refusal leaves nothing behind.
  redis.call('LREM', held, 1, id)
  redis.call('HDEL', gate, id)
  redis.call('LLEN', held)
  redis.call('LRANGE', held, 0, 0)
  redis.call('HGET', gate, id)
  redis.call('HEXISTS', gate, id)
  redis.call('RPUSH', held, id)
  redis.call('LREM', held, 1, id)
  redis.call('HSET', gate, id, 0)
  redis.call('HINCRBY', gate, id, 0)
  redis.call('HDEL', gate, id)
  redis.call('PEXPIRE', gate, lease)
  redis.call('PERSIST', gate)
  return {1}
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
    -- Ended, so arrived: a mark its arrival did not clear (the store was down then, or the
    -- client had no limits by that time) goes too.
    redis.call('ZREM', sent, id)
    redis.call('HDEL', gate, 'w:' .. id)
  end
  expire()
  return settle(-1)
end

if mode == 'sent' then
  -- Marked only while on its way: a document that arrived (or ended) before its releaser
  -- got here has no copy left to drop, and its mark would outlive it.
  if redis.call('HDEL', gate, 'w:' .. id) == 1 then
    redis.call('ZADD', sent, now, id)
  end
  redis.call('ZREMRANGEBYSCORE', sent, '-inf', now - number)
  if redis.call('EXISTS', sent) == 1 then
    redis.call('PEXPIRE', sent, number)
  end
  return settle(-1)
end

if mode == 'take' then
  expire()
  borrow = 0
  if redis.call('ZSCORE', sent, id) then
    unhold(id)
    return settle(2)
  end
  if redis.call('ZSCORE', run, id) then
    -- Released before, by a releaser killed before it acknowledged the holding queue's
    -- copy: start it again (at least once, as Celery does after a kill).
    redis.call('ZADD', run, now + lease, id)
    redis.call('HSET', gate, 'w:' .. id, 1)
    unhold(id)
    return settle(1)
  end
  local why = blocker(number, false)
  local borrowed = false
  if why == 'cap' and tonumber(ARGV[9]) > 0 then
    why = blocker(number, true)
    borrowed = not why
  end
  if why then
    return settle(3)
  end
  unhold(id)
  take(id, number)
  redis.call('HSET', gate, 'w:' .. id, 1)
  reserve(id)
  return settle(borrowed and 4 or 1)
end

if mode == 'mark' then
  -- The broker's holding queue has `number` documents: count as many held at least, so that
  -- new arrivals wait behind them and ends look for them.
  local missing = number - redis.call('LLEN', held)
  for _ = 1, missing do
    redis.call('RPUSH', held, UNKNOWN)
  end
  if missing > 0 and redis.call('HEXISTS', gate, 'at:' .. UNKNOWN) == 0 then
    redis.call('HSET', gate, 'at:' .. UNKNOWN, now)
  end
  borrow = 0
  return settle(-1)
end

if mode == 'clear' then
  -- The holding queue was found empty: what this store still counts held was released by
  -- a releaser that died before it could say so, or is being held right now (its message
  -- on its way to the queue: younger than `number` ms, it stays).
  local ids = redis.call('LRANGE', held, 0, -1)
  for i = 1, #ids do
    local at = tonumber(redis.call('HGET', gate, 'at:' .. ids[i]) or '0')
    if ids[i] == UNKNOWN or at < now - number then
      redis.call('LREM', held, 1, ids[i])
      redis.call('HDEL', gate, 'h:' .. ids[i], 'at:' .. ids[i])
    end
  end
  if redis.call('LLEN', held) == 0 then
    redis.call('HDEL', gate, 'at:' .. UNKNOWN)
  end
  borrow = 0
  return settle(-1)
end

-- admit
borrow = 0
if redis.call('HEXISTS', gate, 'r:' .. id) == 1 then
  -- A released document back from the broker: it starts, and spends the token its
  -- release reserved.
  unreserve(id)
  spend()
  if not redis.call('ZSCORE', run, id) then
    take(id, number)
  else
    redis.call('ZADD', run, now + lease, id)
  end
  redis.call('ZREM', sent, id)
  redis.call('HDEL', gate, 'w:' .. id)
  return settle(1)
end
if redis.call('ZSCORE', run, id) then
  -- Running, or delivered again (a retry, a redelivery): it has its place.
  redis.call('ZADD', run, now + lease, id)
  redis.call('ZREM', sent, id)
  redis.call('HDEL', gate, 'w:' .. id)
  return settle(1)
end
if redis.call('ZSCORE', sent, id) then
  -- Released, and its reservation lapsed on the way (longer than a lease behind other
  -- documents, a worker restarting): it has its place, but starts only with a free token;
  -- without one it is held again, behind the client's held documents (its copy goes to the
  -- holding queue's tail), and released in its turn.
  redis.call('ZREM', sent, id)
  redis.call('HDEL', gate, 'w:' .. id)
  expire()
  local why = blocker(number, true)
  if why ~= 'rate' then
    take(id, number)
    spend()
    return settle(1)
  end
  redis.call('RPUSH', held, id)
  redis.call('HSET', gate, 'h:' .. id, number, 'at:' .. id, now)
  return settle(0)
end
if redis.call('HEXISTS', gate, 'h:' .. id) == 1 then
  return settle(2)
end
expire()
if redis.call('LLEN', held) == 0 and not blocker(number, false) then
  take(id, number)
  spend()
  return settle(1)
end
redis.call('RPUSH', held, id)
redis.call('HSET', gate, 'h:' .. id, number, 'at:' .. id, now)
return settle(0)
