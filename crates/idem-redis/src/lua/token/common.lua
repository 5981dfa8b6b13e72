-- Shared by the one-time token scripts. A token is one string value:
--
--   <state>|<expires_ms>|<consumed_ms>|<bound>|<payload>
--
-- state L (live) or C (consumed); bound 1 when a payload was bound at issue, else 0; the
-- payload is the rest of the value, any bytes. The key expires (PXAT) at expires + retention,
-- so an expired or consumed token answers as such until then, and as unknown afterwards.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function ms(n)
  return string.format('%.0f', n)
end

-- Returns state, expires, consumed, bound, payload, and the offsets of the 2nd and 3rd '|'.
local function parse(v)
  local a = string.find(v, '|', 3, true)
  local b = a and string.find(v, '|', a + 1, true)
  if string.sub(v, 2, 2) ~= '|' or not b then
    error('idem: corrupt token')
  end
  return string.sub(v, 1, 1), tonumber(string.sub(v, 3, a - 1)),
    tonumber(string.sub(v, a + 1, b - 1)), string.sub(v, b + 1, b + 1), string.sub(v, b + 3), a, b
end
