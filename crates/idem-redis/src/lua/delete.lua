-- KEYS[1] record, KEYS[2] audit stream; ARGV: tombstone_ms, stream maxlen, actor ('' for
-- none), instance. Replies 1 if a live record existed, else 0.
local v, s = fetch(KEYS[1])
if not s or s == 't' then
  return 0
end
local fence, meta = string.sub(v, 38, 57), meta_of(v)
bury(KEYS[1], v, ARGV[1])
audit(KEYS[2], ARGV[2], '8', fence, ARGV[4], meta, 'a', ARGV[3])
return 1
