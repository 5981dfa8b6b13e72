-- KEYS[1] record; ARGV: holder token, lease_ms. Replies {1, deadline} renewed or {0} lost.
-- Only a processing record is renewed (`holds`): an unknown one, even naming the caller, stays
-- unknown until it is settled.
local v = fetch(KEYS[1])
if not holds(v, ARGV[1]) then
  return {0}
end
local ms = math.floor(now_us() / 1000)
local deadline = ms + tonumber(ARGV[2])
local expires = math.max(num(v, 156, 13), deadline)
redis.call('SET', KEYS[1],
  string.sub(v, 1, 127) .. deadline .. string.sub(v, 141, 155) .. expires .. string.sub(v, 169),
  'PXAT', expires)
return {1, deadline}
