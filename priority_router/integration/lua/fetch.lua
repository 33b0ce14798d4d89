-- A worker's fetch of one message from kombu's Redis queues, recorded in kombu's unacked
-- hash in the same step (integration/reliable_fetch.py).  kombu's own fetch, a BRPOP, takes
-- the message off its list, and kombu records it only after the reply reached the worker, in
-- a second round trip: a worker killed between the two lost the message for good.
--
-- KEYS[1]: kombu's unacked index (ZSET: delivery tag -> when taken, Unix seconds)
-- KEYS[2]: kombu's unacked hash (HASH: delivery tag -> JSON [message, exchange, routing key])
-- KEYS[3..]: the lists to take from, in the order kombu's BRPOP names them (its queues'
--            priority lists, most urgent first), with the broker's global key prefix
-- Returns: {list, message}, as BRPOP replies; nil when every list is empty.
--
-- The message is RPOPped from the first list that has one, as BRPOP takes it, and recorded
-- as kombu's QoS.append records it, so kombu's sweep puts it back in its queue after
-- visibility_timeout if no worker acknowledges it.  (kombu records it again when the reply
-- arrives, with the same tag: the same entry.)  A message kombu did not publish (not JSON,
-- no delivery tag) is returned unrecorded, as BRPOP returns it.

if redis.replicate_commands then
  redis.replicate_commands() -- Redis < 5: replicate the writes, not the script (uses TIME)
end

local function record(raw)
  local ok, message = pcall(cjson.decode, raw)
  if not ok or type(message) ~= 'table' or type(message['properties']) ~= 'table' then
    return
  end
  local properties = message['properties']
  local tag, info = properties['delivery_tag'], properties['delivery_info']
  if type(tag) ~= 'string' or type(info) ~= 'table' then
    return
  end
  local now = redis.call('TIME')
  redis.call('ZADD', KEYS[1], string.format('%d.%06d', now[1], now[2]), tag)
  -- The message as it came, not decoded and encoded again.
  redis.call('HSET', KEYS[2], tag,
    '[' .. raw .. ',' .. cjson.encode(info['exchange'] or '') .. ','
      .. cjson.encode(info['routing_key'] or '') .. ']')
end

for i = 3, #KEYS do
  local raw = redis.call('RPOP', KEYS[i])
  if raw then
    record(raw)
    return {KEYS[i], raw}
  end
end
return false
