-- KEYS[1] record, KEYS[2] audit stream; ARGV: holder token, kind (r retryable | u unknown),
-- tombstone_ms, stream maxlen. Replies 1 settled or 0 fenced.
-- The holder releases its processing record, or its unknown record a claim under hold marked
-- on its expired lease: retryable removes either (a tombstone keeps the fence); unknown
-- leaves an unknown record as it is, and makes a processing one unknown naming nobody (the
-- holder gave up on knowing, so only a resolve settles it).
local v = fetch(KEYS[1])
if not held(v, ARGV[1]) then
  fenced(KEYS[2], ARGV[4], v, ARGV[1], 'release')
  return 0
end
local fence, instance, meta = string.sub(v, 38, 57), string.sub(v, 5, 20), meta_of(v)
if ARGV[2] == 'r' then
  bury(KEYS[1], v, ARGV[3])
  audit(KEYS[2], ARGV[4], '3', fence, instance, meta, 'o', 'retryable')
else
  if string.byte(v, 3) == 112 then -- 'p'
    local ms = math.floor(now_us() / 1000)
    redis.call('SET', KEYS[1], '1 u ' .. NOBODY .. string.sub(v, 37, 169) .. ms .. string.sub(v, 183), 'KEEPTTL')
  end
  audit(KEYS[2], ARGV[4], '4', fence, instance, meta, 'o', 'ambiguous')
end
return 1
