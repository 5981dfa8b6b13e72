-- Shared by every idem record script. A record is one string value:
--   "1 <state> <fence> <lease_until> <created> <expires> <since> <owner> <fp> <meta_len>\n" <meta> <response>
-- state: p processing, c completed, u unknown, t tombstone (absent, keeps the fence).
-- Times are milliseconds on this server's clock; fence, owner and fp are kept as text so
-- they compare exactly without going through Lua's doubles.
local function parse(v)
  local s, fence, lease, created, expires, since, owner, fp, mlen, pos =
    string.match(v, '^1 (%a) (%d+) (%d+) (%d+) (%d+) (%d+) (%w+) (%w+) (%d+)\n()')
  if not s then
    return nil
  end
  return {
    s = s, fence_s = fence, fence = tonumber(fence), lease = tonumber(lease),
    created = tonumber(created), expires = tonumber(expires), since = tonumber(since),
    owner = owner, fp = fp, mlen = tonumber(mlen), pos = pos,
  }
end

local function header(s, fence, lease, created, expires, since, owner, fp, mlen)
  return string.format('1 %s %.0f %.0f %.0f %.0f %.0f %s %s %d\n',
    s, fence, lease, created, expires, since, owner, fp, mlen)
end

-- Server time in microseconds; one TIME call per script at most.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function fetch(key)
  local v = redis.call('GET', key)
  if not v then
    return nil, nil
  end
  local r = parse(v)
  if not r then
    error('idem: corrupt record at ' .. key)
  end
  return v, r
end

-- The record's identity and request id, without any response.
local function meta(v, r)
  return string.sub(v, r.pos, r.pos + r.mlen - 1)
end

-- A tombstone: absent for every reader, but keeps the fence so it never goes backwards
-- through a release or delete followed by a quick re-claim.
local function bury(key, fence, tomb_ms)
  redis.call('SET', key, header('t', fence, 0, 0, 0, 0, '0', '0', 0), 'PX', tomb_ms)
end

-- Whether owner and fence still hold a live processing record (late holders included).
local function holds(r, owner, fence)
  return r ~= nil and r.s == 'p' and r.owner == owner and r.fence_s == fence
end
