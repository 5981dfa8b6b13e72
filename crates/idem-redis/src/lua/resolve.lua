-- KEYS[1] record; ARGV: mode (r release | c complete), ttl_ms, response, tombstone_ms.
-- Replies {1} resolved, {0} not found, {2, state} not resolvable.
local v, r = fetch(KEYS[1])
if not r or r.s == 't' then
  return {0}
end
local ms = math.floor(now_us() / 1000)
if not (r.s == 'u' or (r.s == 'p' and r.lease <= ms)) then
  return {2, r.s}
end
if ARGV[1] == 'r' then
  bury(KEYS[1], r.fence, ARGV[4])
else
  local expires = ms + tonumber(ARGV[2])
  redis.call('SET', KEYS[1],
    header('c', r.fence, r.lease, r.created, expires, ms, r.owner, r.fp, r.mlen) .. meta(v, r) .. ARGV[3],
    'PXAT', expires)
end
return {1}
