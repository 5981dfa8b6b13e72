-- KEYS[1] record; ARGV: fp, owner, lease_ms, ttl_ms, hold (0|1), tail ("<meta_len:10>\n<meta>")
-- Replies: {0, value} found completed/unknown/other-fp (caller decides replay, unknown or
-- mismatch); {1, retry_after_ms} busy; {2} held: now unknown; {3, fence, deadline, takeover}.
local v, s = fetch(KEYS[1])
local prev_fence, created, takeover, us = 0, nil, 0, nil
if s == 't' then
  prev_fence = num(v, 38, 20)
elseif s then
  if s ~= 'p' or string.sub(v, 59, 126) ~= ARGV[1] then
    return {0, v}
  end
  us = now_us()
  local ms = math.floor(us / 1000)
  local lease = num(v, 128, 13)
  if lease > ms then
    return {1, lease - ms}
  end
  if ARGV[5] == '1' then
    redis.call('SET', KEYS[1], '1 u ' .. string.sub(v, 5, 169) .. ms .. string.sub(v, 183), 'KEEPTTL')
    return {2}
  end
  prev_fence, created, takeover = num(v, 38, 20), num(v, 142, 13), 1
end
us = us or now_us()
local ms = math.floor(us / 1000)
-- Above the previous fence and at least the server clock in microseconds: it increases
-- across expiry without a counter kept forever.
local fence = math.max(prev_fence + 1, us)
local deadline = ms + tonumber(ARGV[3])
local expires = math.max(ms + tonumber(ARGV[4]), deadline)
redis.call('SET', KEYS[1],
  '1 p ' .. ARGV[2] .. ' ' .. string.format('%020.0f', fence) .. ' ' .. ARGV[1] .. ' ' .. deadline .. ' '
    .. (created or ms) .. ' ' .. expires .. SINCE_NONE .. ARGV[6],
  'PXAT', expires)
return {3, fence, deadline, takeover}
