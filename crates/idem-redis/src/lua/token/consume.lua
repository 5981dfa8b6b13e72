-- KEYS[1] token key; ARGV: presented ('0' none / '1' some), presented payload.
-- Returns the live value it consumed, or 0 unknown, 1 used, 2 expired, 3 mismatch.
--
-- One SET … GET writes the consumed marker and reads what was there, so consuming a live
-- token runs one command besides TIME. A refusal puts the old value back (or deletes the
-- marker where there was nothing) before it answers; the script runs atomically, so nobody
-- ever sees the marker of a refused consume.
local now = now_ms()
local v = redis.call('SET', KEYS[1], 'C' .. ms(now), 'KEEPTTL', 'GET')
if not v then
  redis.call('DEL', KEYS[1])
  return 0
end
local refused
local state = string.byte(v, 1)
if state == 76 then -- 'L'
  local expires = tonumber(string.sub(v, 3, PAYLOAD - 1))
  if expires and #v >= PAYLOAD - 1 then
    if now >= expires then
      refused = 2
    elseif string.byte(v, 2) ~= 49 or (ARGV[1] == '1' and ARGV[2] == string.sub(v, PAYLOAD)) then
      return v
    else
      refused = 3
    end
  end
elseif state == 67 then -- 'C'
  refused = 1
end
redis.call('SET', KEYS[1], v, 'KEEPTTL')
if not refused then
  error('idem: corrupt token')
end
return refused
