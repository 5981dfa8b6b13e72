-- claim(key, fp, owner, lease_ms, ttl_ms, hold (0|1), tail ("<meta_len:10>\n<meta>"),
--       audit stream, its maxlen)
-- Replies: the record's value when found completed/unknown/other-fp (the caller decides
-- replay, unknown or mismatch; a bare string, as a table around it costs the server more than
-- the rest of a replay); {1, retry_after_ms} busy; {2} held: now unknown;
-- {3, fence, deadline, takeover}.
-- Shared by the single claim script and the batch script.
local function claim(key, fp, owner, lease_ms, ttl_ms, hold, tail, stream, maxlen)
  local v, s = fetch(key)
  local prev_fence, created, takeover, us = 0, nil, 0, nil
  if s == 't' then
    prev_fence = num(v, 38, 20)
  elseif s then
    if s ~= 'p' or string.find(v, fp, 59, true) ~= 59 then
      return v
    end
    us = now_us()
    local ms = math.floor(us / 1000)
    local lease = num(v, 128, 13)
    if lease > ms then
      return {1, lease - ms}
    end
    if hold == '1' then
      audit(stream, maxlen, '4', string.sub(v, 38, 57), string.sub(v, 5, 20), meta_of(v), 'o', 'lease_expired')
      redis.call('SET', key, '1 u ' .. string.sub(v, 5, 169) .. ms .. string.sub(v, 183), 'KEEPTTL')
      return {2}
    end
    prev_fence, created, takeover = num(v, 38, 20), num(v, 142, 13), 1
  end
  us = us or now_us()
  local ms = math.floor(us / 1000)
  -- Above the previous fence and at least the server clock in microseconds: it increases
  -- across expiry without a counter kept forever.
  local fence = math.max(prev_fence + 1, us)
  local deadline = ms + tonumber(lease_ms)
  local expires = text(math.max(ms + tonumber(ttl_ms), deadline))
  redis.call('SET', key,
    '1 p ' .. owner .. ' ' .. fence_text(fence) .. ' ' .. fp .. ' ' .. text(deadline) .. ' '
      .. text(created or ms) .. ' ' .. expires .. SINCE_NONE .. tail,
    'PXAT', expires)
  audit(stream, maxlen, takeover == 1 and '5' or '1', fence_text(fence), string.sub(owner, 1, 16), string.sub(tail, 12))
  return {3, fence, deadline, takeover}
end
