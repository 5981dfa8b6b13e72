-- Shared by the one-time token scripts. A token is one string value:
--
--   live:     'L' <bound> <expires_ms: 15 digits> <payload>
--   consumed: 'C' <consumed_ms>
--
-- bound is '1' when a payload was bound at issue, else '0'; the payload is the rest of the
-- value, any bytes. Times are the server clock in milliseconds. The key expires (PXAT) at
-- expires + retention, so an expired or consumed token answers as such until then, and as
-- unknown afterwards; consuming keeps that expiry (KEEPTTL).

-- Offset of the payload in a live value.
local PAYLOAD = 18

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Integer text ('%.0f': Lua's own number-to-text would write 1.7e+12).
local function ms(n)
  return string.format('%.0f', n)
end
