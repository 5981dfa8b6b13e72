-- Several lock and token operations from one client in one script call, each applied on its
-- own and in order with the same function as its single script (lock/acquire.lua,
-- lock/release.lua, token/issue.lua, token/consume.lua), so two operations on one key behave
-- as two calls in a row.
-- KEYS: each operation's keys, in order (2 for an acquire, 1 for the others).
-- ARGV[1]: one code per operation, 'a' acquire, 'r' release, 'i' issue, 'c' consume; then
-- each operation's arguments in order (2 for an acquire, an issue or a consume, 1 for a
-- release).
-- Replies one entry per operation: its single script's reply, or {-1, message} if it raised
-- an error, which fails that operation alone.
local out, codes, k, a = {}, ARGV[1], 1, 2
for i = 1, #codes do
  local op, ok, r = string.byte(codes, i), nil, nil
  if op == 97 then -- 'a'
    ok, r = pcall(acquire, KEYS[k], KEYS[k + 1], ARGV[a], ARGV[a + 1])
    k, a = k + 2, a + 2
  elseif op == 114 then -- 'r'
    ok, r = pcall(release, KEYS[k], ARGV[a])
    k, a = k + 1, a + 1
  elseif op == 105 then -- 'i'
    ok, r = pcall(issue, KEYS[k], ARGV[a], ARGV[a + 1])
    k, a = k + 1, a + 2
  elseif op == 99 then -- 'c'
    ok, r = pcall(consume, KEYS[k], ARGV[a], ARGV[a + 1])
    k, a = k + 1, a + 2
  else
    return redis.error_reply('idem: bad batch operation')
  end
  if not ok then
    if type(r) == 'table' then
      r = r.err
    end
    r = {-1, tostring(r)}
  end
  out[i] = r
end
return out
