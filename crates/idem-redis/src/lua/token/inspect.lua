-- KEYS[1] token key. Returns {'unknown'} | {'used', consumed} | {'expired', expires} |
-- {'live', expires, bound, payload}.
local v = redis.call('GET', KEYS[1])
if not v then
  return {'unknown'}
end
local state, expires, consumed, bound, payload = parse(v)
if state == 'C' then
  return {'used', consumed}
end
if now_ms() >= expires then
  return {'expired', expires}
end
return {'live', expires, bound, payload}
