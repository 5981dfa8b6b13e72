-- KEYS[1] record; ARGV: owner, fence, kind (r retryable | u unknown), tombstone_ms.
-- Replies 1 settled or 0 fenced.
local v, r = fetch(KEYS[1])
if not holds(r, ARGV[1], ARGV[2]) then
  return 0
end
if ARGV[3] == 'r' then
  bury(KEYS[1], r.fence, ARGV[4])
else
  local ms = math.floor(now_us() / 1000)
  redis.call('SET', KEYS[1],
    header('u', r.fence, r.lease, r.created, r.expires, ms, r.owner, r.fp, r.mlen) .. string.sub(v, r.pos),
    'KEEPTTL')
end
return 1
