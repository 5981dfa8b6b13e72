-- complete(key, holder token, ttl_ms, response, audit stream, its maxlen, all ('1' or '0')).
-- Replies 1 settled or 0 fenced. The holder completes its processing record, or its unknown
-- record a claim under hold marked on its expired lease (a holder paused past its lease
-- finishes its work). The default level ('0') records only the second: the first is the
-- record's own story.
-- Shared by the single complete script and the batch script.
local function complete(key, token, ttl_ms, response, stream, maxlen, all)
  local v = fetch(key)
  if not held(v, token) then
    fenced(stream, maxlen, v, token, 'complete')
    return 0
  end
  local ms = math.floor(now_us() / 1000)
  local expires = text(ms + tonumber(ttl_ms))
  -- A processing or unknown record holds no response yet: everything after `since` is meta.
  redis.call('SET', key,
    '1 c ' .. string.sub(v, 5, 155) .. expires .. ' ' .. text(ms) .. string.sub(v, 183) .. response,
    'PXAT', expires)
  if all == '1' or string.byte(v, 3) == 117 then -- 'u'
    audit(stream, maxlen, '2', string.sub(v, 38, 57), string.sub(v, 5, 20), meta_of(v), 's', status_of(response))
  end
  return 1
end
