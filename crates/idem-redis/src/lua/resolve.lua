-- KEYS[1] record; ARGV: mode (r release | c complete), ttl_ms, response, tombstone_ms.
-- Replies {1} resolved, {0} not found, {2, state} not resolvable.
local v, s = fetch(KEYS[1])
if not s or s == 't' then
  return {0}
end
local ms = math.floor(now_us() / 1000)
if not (s == 'u' or (s == 'p' and num(v, 128, 13) <= ms)) then
  return {2, s}
end
if ARGV[1] == 'r' then
  bury(KEYS[1], v, ARGV[4])
else
  -- Unknown and processing records hold no response: everything after `since` is meta.
  local expires = ms + tonumber(ARGV[2])
  redis.call('SET', KEYS[1],
    '1 c ' .. string.sub(v, 5, 155) .. expires .. ' ' .. ms .. string.sub(v, 183) .. ARGV[3],
    'PXAT', expires)
end
return {1}
