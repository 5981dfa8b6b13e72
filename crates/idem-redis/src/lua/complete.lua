-- KEYS[1] record; ARGV: holder token, ttl_ms, response. Replies 1 settled or 0 fenced.
local v = fetch(KEYS[1])
if not holds(v, ARGV[1]) then
  return 0
end
local ms = math.floor(now_us() / 1000)
local expires = ms + tonumber(ARGV[2])
-- A processing record holds no response yet: everything after `since` is meta.
redis.call('SET', KEYS[1],
  '1 c ' .. string.sub(v, 5, 155) .. expires .. ' ' .. ms .. string.sub(v, 183) .. ARGV[3],
  'PXAT', expires)
return 1
