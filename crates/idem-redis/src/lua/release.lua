-- KEYS[1] record, KEYS[2] audit stream; ARGV: holder token, kind (r retryable | u unknown),
-- tombstone_ms, stream maxlen. Replies 1 settled or 0 fenced.
local v = fetch(KEYS[1])
if not holds(v, ARGV[1]) then
  fenced(KEYS[2], ARGV[4], v, ARGV[1], 'release')
  return 0
end
local fence, instance, meta = string.sub(v, 38, 57), string.sub(v, 5, 20), meta_of(v)
if ARGV[2] == 'r' then
  bury(KEYS[1], v, ARGV[3])
  audit(KEYS[2], ARGV[4], '3', fence, instance, meta, 'o', 'retryable')
else
  local ms = math.floor(now_us() / 1000)
  redis.call('SET', KEYS[1], '1 u ' .. string.sub(v, 5, 169) .. ms .. string.sub(v, 183), 'KEEPTTL')
  audit(KEYS[2], ARGV[4], '4', fence, instance, meta, 'o', 'ambiguous')
end
return 1
