-- Several claims and completions from one client in one script call, each applied on its own
-- and in order, exactly as its single script would (same functions), so two operations on
-- one key see each other as sequential calls.
-- KEYS: the record of each operation, in order, then the audit stream of each, in the same
-- order. ARGV[1]: one code per operation, 'c' claim or 'd' complete; then each operation's
-- single script arguments in order (8 for a claim, 5 for a completion; the last two are the
-- stream's maxlen and the audit level).
-- Replies one entry per operation: that operation's single-script reply, or {-1, message} if
-- it raised an error (a corrupt record), which fails that operation alone.
local out, codes, a, n = {}, ARGV[1], 2, #KEYS / 2
for k = 1, n do
  local op, ok, r = string.byte(codes, k), nil, nil
  if op == 99 then -- 'c'
    ok, r = pcall(claim, KEYS[k], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5],
      KEYS[n + k], ARGV[a + 6], ARGV[a + 7])
    a = a + 8
  elseif op == 100 then -- 'd'
    ok, r = pcall(complete, KEYS[k], ARGV[a], ARGV[a + 1], ARGV[a + 2], KEYS[n + k], ARGV[a + 3], ARGV[a + 4])
    a = a + 5
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
