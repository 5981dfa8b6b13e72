-- KEYS[1] the lock, KEYS[2] its fence counter (same hash tag); ARGV: owner, lease_ms.
-- Returns {1, fence} when acquired, {0, pttl} when held by someone else.
--
-- The fence is max(counter + 1, server time in microseconds): the counter (kept without
-- expiry) makes fences strictly increase while the server keeps its data; the clock term keeps
-- them increasing after the data is lost (a restart without persistence), since every earlier
-- fence was at most its acquisition's clock reading plus the acquisitions made within that
-- same microsecond.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('PTTL', KEYS[1])}
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
local fence = math.max(prev + 1, now_us)
local f = string.format('%.0f', fence)
redis.call('SET', KEYS[2], f)
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. f, 'PX', ARGV[2])
return {1, fence}
