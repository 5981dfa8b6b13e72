-- issue(key, value, px): stores a new token's value for px ms (its TTL plus the retention).
-- Returns the key's expiry on the server clock (PEXPIRETIME, ms), or -1 if the key exists
-- (a 256-bit collision: never in practice).
local function issue(key, value, px)
  if not redis.call('SET', key, value, 'NX', 'PX', px) then
    return -1
  end
  return redis.call('PEXPIRETIME', key)
end
