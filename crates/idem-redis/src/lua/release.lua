-- KEYS[1] record; ARGV: holder token, kind (r retryable | u unknown), tombstone_ms.
-- Replies 1 settled or 0 fenced.
local v = fetch(KEYS[1])
if not holds(v, ARGV[1]) then
  return 0
end
if ARGV[2] == 'r' then
  bury(KEYS[1], v, ARGV[3])
else
  local ms = math.floor(now_us() / 1000)
  redis.call('SET', KEYS[1], '1 u ' .. string.sub(v, 5, 169) .. ms .. string.sub(v, 183), 'KEEPTTL')
end
return 1
