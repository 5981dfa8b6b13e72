-- claim(key, fp, owner, lease_ms, ttl_ms, hold (0|1), tail ("<meta_len:10>\n<meta>"),
--       audit stream, its maxlen, all ('1': record a fresh claim too; '0': the default level,
--       which leaves it to the record))
-- Replies: the record's value when found completed or under another fingerprint (the caller
-- decides replay or mismatch; a bare string, as a table around it costs the server more than
-- the rest of a replay); {1, retry_after_ms} busy; {2, fence (20 digits), age_ms} unknown,
-- found so or marked now under hold, with the record's fence and its attempt's age (server
-- now - created); {3, fence, deadline, takeover}.
-- Shared by the single claim script and the batch script.

-- A claim's answer for an unknown record at `ms`: its fence and how long ago its attempt
-- claimed the key (never negative, should the server clock step back).
local function unknown_reply(v, ms)
  return {2, string.sub(v, 38, 57), math.max(ms - num(v, 142, 13), 0)}
end

local function claim(key, fp, owner, lease_ms, ttl_ms, hold, tail, stream, maxlen, all)
  local v, s = fetch(key)
  local prev_fence, takeover, us = 0, 0, nil
  if s == 't' then
    prev_fence = num(v, 38, 20)
  elseif s then
    if (s ~= 'p' and s ~= 'u') or string.find(v, fp, 59, true) ~= 59 then
      return v
    end
    us = now_us()
    local ms = math.floor(us / 1000)
    if s == 'u' then
      return unknown_reply(v, ms)
    end
    local lease = num(v, 128, 13)
    if lease > ms then
      return {1, lease - ms}
    end
    if hold == '1' then
      -- Unknown, naming its holder (the owner stays), who may still complete it; created
      -- stays too: the attempt is the holder's.
      audit(stream, maxlen, '4', string.sub(v, 38, 57), string.sub(v, 5, 20), meta_of(v), 'o', 'lease_expired')
      redis.call('SET', key, '1 u ' .. string.sub(v, 5, 169) .. ms .. string.sub(v, 183), 'KEEPTTL')
      return unknown_reply(v, ms)
    end
    prev_fence, takeover = num(v, 38, 20), 1
  end
  us = us or now_us()
  local ms = math.floor(us / 1000)
  -- Above the previous fence and at least the server clock in microseconds: it increases
  -- across expiry without a counter kept forever.
  local fence = math.max(prev_fence + 1, us)
  local deadline = ms + tonumber(lease_ms)
  local expires = text(math.max(ms + tonumber(ttl_ms), deadline))
  -- created dates this attempt, a takeover's too.
  local now = text(ms)
  redis.call('SET', key,
    '1 p ' .. owner .. ' ' .. fence_text(fence) .. ' ' .. fp .. ' ' .. text(deadline) .. ' '
      .. now .. ' ' .. expires .. SINCE_NONE .. tail,
    'PXAT', expires)
  if takeover == 1 then
    audit(stream, maxlen, '5', fence_text(fence), string.sub(owner, 1, 16), string.sub(tail, 12))
  elseif all == '1' then
    audit(stream, maxlen, '1', fence_text(fence), string.sub(owner, 1, 16), string.sub(tail, 12))
  end
  return {3, fence, deadline, takeover}
end
