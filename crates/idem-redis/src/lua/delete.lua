-- KEYS[1] record; ARGV: tombstone_ms. Replies 1 if a live record existed, else 0.
local v, r = fetch(KEYS[1])
if not r or r.s == 't' then
  return 0
end
bury(KEYS[1], r.fence, ARGV[1])
return 1
