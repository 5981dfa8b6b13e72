-- Several claims and completions from one client in one script call, each applied on its own
-- and in order, exactly as its single script would (same functions), so two operations on
-- one key see each other as sequential calls.
-- KEYS: the record of each operation, in order. ARGV: for each operation its code and then
-- its single script's arguments: 'c' + the 6 of claim, or 'd' + the 3 of complete.
-- Replies one entry per operation: that operation's single-script reply, or {-1, message} if
-- it raised an error (a corrupt record), which fails that operation alone.
local out, a = {}, 1
for k = 1, #KEYS do
  local op, ok, r = ARGV[a], nil, nil
  if op == 'c' then
    ok, r = pcall(claim, KEYS[k], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6])
    a = a + 7
  elseif op == 'd' then
    ok, r = pcall(complete, KEYS[k], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
    a = a + 4
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
