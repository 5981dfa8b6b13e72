-- KEYS[1] the lock; ARGV: owner. Compare-and-delete: 1 when it was ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
