-- KEYS[1] token key; ARGV: presented ('0' none / '1' some), presented payload.
-- Returns {'ok', bound, payload} | {'unknown'} | {'used'} | {'expired'} | {'mismatch'}.
local v = redis.call('GET', KEYS[1])
if not v then
  return {'unknown'}
end
local state, expires, _, bound, payload, a, b = parse(v)
if state == 'C' then
  return {'used'}
end
local now = now_ms()
if now >= expires then
  return {'expired'}
end
if bound == '1' and (ARGV[1] ~= '1' or ARGV[2] ~= payload) then
  return {'mismatch'}
end
-- KEEPTTL: the consumed marker lives exactly as long as the live token would have.
redis.call('SET', KEYS[1], 'C|' .. string.sub(v, 3, a - 1) .. '|' .. ms(now) .. string.sub(v, b),
  'KEEPTTL')
return {'ok', bound, payload}
