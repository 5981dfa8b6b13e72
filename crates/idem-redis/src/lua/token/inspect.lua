-- KEYS[1] token key. Returns 0 when unknown, else {value, now_ms}: the client reads the state.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
return {v, now_ms()}
