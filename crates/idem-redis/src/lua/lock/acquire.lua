-- acquire(lock, counter, owner, lease_ms): the lock and its fence counter share a hash tag.
-- Returns the fence when acquired, 0 when someone holds the lock.
--
-- The fence is max(counter + 1, server time in microseconds): the counter (kept without
-- expiry) makes fences strictly increase while the server keeps its data; the clock term keeps
-- them increasing after the data is lost (a restart without persistence), since every earlier
-- fence was at most its acquisition's clock reading plus the acquisitions made within that
-- same microsecond.
--
-- Cost: the SET NX is the busy check itself, so a held lock costs one command. The counter
-- is written with the clock reading and read back in one SET … GET; only when the old value
-- was not below the clock (acquisitions within one microsecond, or a clock stepped back) is
-- it written again with old + 1. The script runs atomically, so nobody sees the first write.
local function acquire(lock, counter, owner, lease_ms)
  if not redis.call('SET', lock, owner, 'NX', 'PX', lease_ms) then
    return 0
  end
  local t = redis.call('TIME')
  local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
  -- A number passed to redis.call is written in full (Lua's own text would be 1.7e+15), and
  -- costs less than string.format.
  local prev = tonumber(redis.call('SET', counter, fence, 'GET'))
  if prev and prev >= fence then
    fence = prev + 1
    redis.call('SET', counter, fence)
  end
  return fence
end
