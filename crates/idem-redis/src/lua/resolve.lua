-- KEYS[1] record, KEYS[2] audit stream; ARGV: mode (r release | c complete), ttl_ms,
-- response, tombstone_ms, stream maxlen, actor ('' for none), instance, fence (20 digits, or
-- '' to settle whatever attempt holds the record).
-- Replies {1} resolved, {0} not found, {2, state} not resolvable, {3, fence (20 digits)}
-- fenced: the record has another fence than the one named. Checked in that order: absent,
-- then the fence, then the state.
local v, s = fetch(KEYS[1])
if not s or s == 't' then
  return {0}
end
if ARGV[8] ~= '' and string.find(v, ARGV[8], 38, true) ~= 38 then
  return {3, string.sub(v, 38, 57)}
end
local ms = math.floor(now_us() / 1000)
if not (s == 'u' or (s == 'p' and num(v, 128, 13) <= ms)) then
  return {2, s}
end
local fence, meta = string.sub(v, 38, 57), meta_of(v)
if ARGV[1] == 'r' then
  bury(KEYS[1], v, ARGV[4])
  audit(KEYS[2], ARGV[5], '7', fence, ARGV[7], meta, 'o', 'release', 'a', ARGV[6])
else
  -- Unknown and processing records hold no response: everything after `since` is meta.
  local expires = ms + tonumber(ARGV[2])
  redis.call('SET', KEYS[1],
    '1 c ' .. string.sub(v, 5, 155) .. expires .. ' ' .. ms .. string.sub(v, 183) .. ARGV[3],
    'PXAT', expires)
  audit(KEYS[2], ARGV[5], '7', fence, ARGV[7], meta, 'o', 'complete', 's', status_of(ARGV[3]), 'a', ARGV[6])
end
return {1}
