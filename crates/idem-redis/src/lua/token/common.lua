-- Shared by the one-time token scripts. A token is one string value:
--
--   live:     'L' <bound> <retention_ms: 11 digits> <payload>
--   consumed: 'C' <the key's PTTL when it was consumed>
--
-- bound is '1' when a payload was bound at issue, else '0'; the payload is the rest of the
-- value, any bytes. The key's own expiry, set at issue to TTL + retention, is the clock: the
-- token has expired once the key has no more than the retention left, and the expiry issue
-- reports is the key's PEXPIRETIME minus the retention. An expired or consumed token
-- answers as such until the key goes, and as unknown afterwards. Consuming keeps the
-- key's expiry (KEEPTTL).

-- Offset of the payload in a live value.
local PAYLOAD = 14
