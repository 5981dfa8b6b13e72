-- KEYS[1] record; ARGV: owner, fence, ttl_ms, response. Replies 1 settled or 0 fenced.
local v, r = fetch(KEYS[1])
if not holds(r, ARGV[1], ARGV[2]) then
  return 0
end
local ms = math.floor(now_us() / 1000)
local expires = ms + tonumber(ARGV[3])
redis.call('SET', KEYS[1],
  header('c', r.fence, r.lease, r.created, expires, ms, r.owner, r.fp, r.mlen) .. meta(v, r) .. ARGV[4],
  'PXAT', expires)
return 1
