-- Several claims and completions from one client in one script call, each applied on its own
-- and in order, exactly as its single script would (same functions), so two operations on
-- one key see each other as sequential calls.
-- KEYS: the record of each operation, in order, then each audit stream the operations write
-- to, once each (concurrent operations mostly share their namespace's stream).
-- ARGV[1]: two bytes per operation: its code, 'c' claim or 'd' complete, then which stream it
-- writes to (a byte: 1 for the first stream after the records). ARGV[2] and ARGV[3]: the
-- streams' maxlen and the audit level, the same for every operation of one store. Then each
-- operation's single script arguments in order, without those two (6 for a claim, 3 for a
-- completion).
-- Replies one entry per operation: that operation's single-script reply, or {-1, message} if
-- it raised an error (a corrupt record), which fails that operation alone.
local out, codes, maxlen, all, a = {}, ARGV[1], ARGV[2], ARGV[3], 4
local n = #codes / 2
for k = 1, n do
  local op, s = string.byte(codes, 2 * k - 1, 2 * k)
  local stream, ok, r = KEYS[n + s], nil, nil
  if stream == nil then
    return redis.error_reply('idem: bad batch stream')
  end
  if op == 99 then -- 'c'
    ok, r = pcall(claim, KEYS[k], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5],
      stream, maxlen, all)
    a = a + 6
  elseif op == 100 then -- 'd'
    ok, r = pcall(complete, KEYS[k], ARGV[a], ARGV[a + 1], ARGV[a + 2], stream, maxlen, all)
    a = a + 3
  else
    return redis.error_reply('idem: bad batch operation')
  end
  if not ok then
    if type(r) == 'table' then
      r = r.err
    end
    r = {-1, tostring(r)}
  end
  out[k] = r
end
return out
