-- KEYS[1] token key. Returns 0 when unknown, else {value, PEXPIRETIME, server time in ms}:
-- the client reads the state.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local t = redis.call('TIME')
return {v, redis.call('PEXPIRETIME', KEYS[1]),
  tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
