-- consume(key, presented ('0' none / '1' some), presented payload).
-- Returns the live value it consumed, or 0 unknown, 1 used, 2 expired, 3 mismatch.
--
-- One SET … GET writes the consumed marker and reads what was there, so consuming a live
-- token runs two commands (PTTL, SET). A refusal puts the old value back before it
-- answers; the script runs atomically, so nobody ever sees the marker of a refused consume.
local function consume(key, flag, presented)
  local left = redis.call('PTTL', key)
  if left == -2 then
    return 0
  end
  -- Numbers concatenate exactly below 10^14; a PTTL is at most a TTL plus a year.
  local v = redis.call('SET', key, 'C' .. left, 'KEEPTTL', 'GET')
  local refused
  local state = v and string.byte(v, 1)
  if state == 76 then -- 'L'
    local retention = #v >= PAYLOAD - 1 and tonumber(string.sub(v, 3, PAYLOAD - 1))
    if retention then
      if left <= retention then
        refused = 2
      elseif string.byte(v, 2) ~= 49 or (flag == '1' and presented == string.sub(v, PAYLOAD)) then
        return v
      else
        refused = 3
      end
    end
  elseif state == 67 then -- 'C'
    refused = 1
  end
  if v then
    redis.call('SET', key, v, 'KEEPTTL')
  end
  if not refused then
    error('idem: corrupt token')
  end
  return refused
end
