-- KEYS[1] the lock; ARGV: owner, lease_ms. 1 when still held and extended.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
