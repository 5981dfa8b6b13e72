-- Shared by every idem record script. A record is one string value with a fixed-width text
-- header, so scripts read and splice fields by position instead of parsing:
--
--   pos 1    '1'           format version
--   pos 3    state         p processing, c completed, u unknown, t tombstone (absent; keeps the fence)
--   pos 5    owner         32 hex (all zeros: nobody, on tombstones and given-up unknowns)
--   pos 38   fence         20 digits
--   pos 59   fingerprint   68 hex
--   pos 128  lease_until   13 digits (ms, server clock)
--   pos 142  created       13 digits (when the current attempt claimed: first claim or takeover)
--   pos 156  expires       13 digits
--   pos 170  since         13 digits (completed_at / unknown since)
--   pos 184  meta_len      10 digits
--   pos 194  '\n', then meta (identity, request id), then the encoded response
--
-- Fields are separated by single spaces. "<state> <owner> <fence>" (pos 3..57) is the holder
-- token: settling scripts compare it whole against the caller's.
local HEADER_LEN = 194

local function check(v)
  if string.byte(v, 1) ~= 49 or string.byte(v, HEADER_LEN) ~= 10 then
    error('idem: corrupt record')
  end
  return v
end

local function num(v, at, width)
  return tonumber(string.sub(v, at, at + width - 1))
end

local function header(s, owner, fence, fp, lease, created, expires, since, mlen)
  return string.format('1 %s %s %020.0f %s %013.0f %013.0f %013.0f %013.0f %010d\n',
    s, owner, fence, fp, lease, created, expires, since, mlen)
end

-- Millisecond timestamps of this era have 13 digits, so plain concatenation keeps the width
-- (the client caps leases and TTLs so no deadline reaches 14 digits).
local SINCE_NONE = ' 0000000000000 '

-- Server time in microseconds; one TIME call per script at most. A batch reads it once for
-- all its operations: they run in one atomic script, so they happen at one instant anyway
-- (Redis also judges key expiry at the script's start).
local time_us
local function now_us()
  if not time_us then
    local t = redis.call('TIME')
    time_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return time_us
end

local function fetch(key)
  local v = redis.call('GET', key)
  if not v then
    return nil, nil
  end
  return check(v), string.sub(v, 3, 3)
end

-- The owner field of a record that names nobody: a tombstone, or an unknown record its holder
-- released as unknown (one marked unknown on an expired lease keeps its holder's owner).
local NOBODY = string.rep('0', 32)

-- A tombstone: absent for every reader, but keeps the fence so it never goes backwards
-- through a release or delete followed by a quick re-claim.
local function bury(key, v, tomb_ms)
  redis.call('SET', key, header('t', NOBODY, num(v, 38, 20), string.rep('0', 68), 0, 0, 0, 0, 0), 'PX', tomb_ms)
end

-- Whether the caller's holder token ("p <owner> <fence>") still holds a live processing
-- record under a lease: what a renewal needs. A holder whose lease ran out still holds it
-- until someone takes over.
local function holds(v, token)
  -- A plain find anchored at 3 compares without cutting a substring out of the record.
  return v ~= nil and string.find(v, token, 3, true) == 3
end

-- Whether the caller's holder token holds the record for settling it (complete, release):
-- processing, as `holds`, or unknown naming that holder (owner and fence), which a claim
-- under `hold` marked on its expired lease. An unknown record naming nobody is held by no
-- one.
local function held(v, token)
  if holds(v, token) then
    return true
  end
  return v ~= nil and string.byte(v, 3) == 117 -- 'u'
    and string.find(v, NOBODY, 5, true) ~= 5
    and string.find(v, string.sub(token, 3), 5, true) == 5
end

-- The audit trail: one stream per namespace (per namespace and cluster slot on a cluster),
-- capped near `maxlen` entries. Fields: e event code (idem-core's AuditKind::code), f fence
-- (20 digits), n instance (the owner id's first 16 hex digits), m the record's identity part,
-- then optional o outcome, s status, a actor. The entry id's time is the server clock.
local function audit(stream, maxlen, kind, fence, instance, meta, ...)
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'e', kind, 'f', fence, 'n', instance, 'm', meta, ...)
end

-- A stored record's identity part (namespace, principal, key, request id).
local function meta_of(v)
  return string.sub(v, 195, 194 + num(v, 184, 10))
end

-- A stale holder's settle (`op`) was refused. Recorded while the record still says whose key
-- it is (a tombstone or a gone record does not).
local function fenced(stream, maxlen, v, token, op)
  if v and string.sub(v, 3, 3) ~= 't' then
    audit(stream, maxlen, '6', string.sub(token, 36, 55), string.sub(token, 3, 18), meta_of(v), 'o', op)
  end
end

-- An encoded response's status (bytes 2 and 3).
local function status_of(response)
  return string.byte(response, 2) * 256 + string.byte(response, 3)
end
