-- KEYS[1] token key; ARGV: ttl_ms, retention_ms, bound ('0'/'1'), payload.
-- Returns the expiry (ms), or -1 if the key exists (a 256-bit collision: never in practice).
local expires = now_ms() + tonumber(ARGV[1])
local ok = redis.call('SET', KEYS[1], 'L|' .. ms(expires) .. '|0|' .. ARGV[3] .. '|' .. ARGV[4],
  'NX', 'PXAT', ms(expires + tonumber(ARGV[2])))
if not ok then
  return -1
end
return expires
