-- KEYS[1] token key; ARGV: ttl_ms, retention_ms, bound ('0'/'1'), payload.
-- Returns the expiry (ms), or -1 if the key exists (a 256-bit collision: never in practice).
local expires = now_ms() + tonumber(ARGV[1])
local value = 'L' .. ARGV[3] .. string.format('%015.0f', expires) .. ARGV[4]
if not redis.call('SET', KEYS[1], value, 'NX', 'PXAT', ms(expires + tonumber(ARGV[2]))) then
  return -1
end
return expires
