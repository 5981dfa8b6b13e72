-- KEYS[1] record; ARGV: tombstone_ms. Replies 1 if a live record existed, else 0.
local v, s = fetch(KEYS[1])
if not s or s == 't' then
  return 0
end
bury(KEYS[1], v, ARGV[1])
return 1
