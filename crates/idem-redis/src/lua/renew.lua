-- KEYS[1] record; ARGV: owner, fence, lease_ms. Replies {1, deadline} renewed or {0} lost.
local v, r = fetch(KEYS[1])
if not holds(r, ARGV[1], ARGV[2]) then
  return {0}
end
local ms = math.floor(now_us() / 1000)
local deadline = ms + tonumber(ARGV[3])
local expires = math.max(r.expires, deadline)
redis.call('SET', KEYS[1],
  header('p', r.fence, deadline, r.created, expires, 0, r.owner, r.fp, r.mlen) .. string.sub(v, r.pos),
  'PXAT', expires)
return {1, deadline}
