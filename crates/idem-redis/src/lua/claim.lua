-- KEYS[1] record; ARGV: fp, owner, lease_ms, ttl_ms, hold (0|1), meta
-- Replies: {0, value} found completed/unknown/other-fp (caller decides replay, unknown or
-- mismatch); {1, retry_after_ms} busy; {2} held: now unknown; {3, fence, deadline, takeover}.
local v, r = fetch(KEYS[1])
local prev_fence, created, takeover, us = 0, nil, 0, nil
if r and r.s == 't' then
  prev_fence = r.fence
elseif r then
  if r.s ~= 'p' or r.fp ~= ARGV[1] then
    return {0, v}
  end
  us = now_us()
  local ms = math.floor(us / 1000)
  if r.lease > ms then
    return {1, r.lease - ms}
  end
  if ARGV[5] == '1' then
    redis.call('SET', KEYS[1], header('u', r.fence, r.lease, r.created, r.expires, ms, r.owner, r.fp, r.mlen)
      .. string.sub(v, r.pos), 'KEEPTTL')
    return {2}
  end
  prev_fence, created, takeover = r.fence, r.created, 1
end
us = us or now_us()
local ms = math.floor(us / 1000)
-- Above the previous fence and at least the server clock in microseconds: it increases
-- across expiry without a counter kept forever.
local fence = math.max(prev_fence + 1, us)
local deadline = ms + tonumber(ARGV[3])
local expires = math.max(ms + tonumber(ARGV[4]), deadline)
redis.call('SET', KEYS[1],
  header('p', fence, deadline, created or ms, expires, 0, ARGV[2], ARGV[1], #ARGV[6]) .. ARGV[6],
  'PXAT', expires)
return {3, fence, deadline, takeover}
