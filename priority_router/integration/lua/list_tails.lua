-- One look at a kombu Redis queue's priority lists, for the stranded-documents watch.
--
-- KEYS: the queue's priority lists, most urgent first, exactly as kombu's Redis transport
--       names them: KEYS[1] is "<queue>" (step 0), KEYS[i] for i > 1 is "<queue>\x06\x16<step>".
-- ARGV[1]: the header that holds the publish time (Unix seconds), e.g.
--          "priority_router_published_at".
-- ARGV[2]: the header that marks a document the router's gate sent back to its list
--          (released from its client's holding queue), e.g. "priority_router_gated".
-- Returns: one entry per key, in KEYS order: {length, tail, published_at, put_back}.
--          tail is the oldest message's delivery tag ("" when the list is empty or the
--          message unreadable), published_at its publish time as text ("" when it has
--          none), put_back 1 when it came back to the list after a worker took it
--          (kombu's restore sets the "redelivered" header; the gate's release, ARGV[2]),
--          else 0.
--
-- kombu LPUSHes every message and its workers BRPOP, so a list's oldest message is its
-- last element (LINDEX -1): the one a consumer of the list takes next.  Read-only.

local header = ARGV[1]
local released = ARGV[2]
local found = {}
for i = 1, #KEYS do
  local length = redis.call('LLEN', KEYS[i])
  local tail, at, put_back = '', '', 0
  if length > 0 then
    local ok, message = pcall(cjson.decode, redis.call('LINDEX', KEYS[i], -1))
    if ok and type(message) == 'table' then
      local properties = message['properties']
      if type(properties) == 'table' and type(properties['delivery_tag']) == 'string' then
        tail = properties['delivery_tag']
      end
      local headers = message['headers']
      if type(headers) == 'table' then
        local value = headers[header]
        if type(value) == 'number' or type(value) == 'string' then
          at = tostring(value)
        end
        if headers['redelivered'] == true or (headers[released] ~= nil and headers[released] ~= false) then
          put_back = 1
        end
      end
    end
  end
  found[i] = {length, tail, at, put_back}
end
return found
