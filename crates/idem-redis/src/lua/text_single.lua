-- Number texts for a script that runs one operation: plain conversions. (A cache would cost
-- a lone script more than it saves: every table and upvalue is made anew on each call.)
-- Every number written is a whole one well below 2^53, so '%d' (the C library's integer
-- formatting) gives the same digits as tostring's '%.14g' or '%.0f', at a fraction of their
-- cost (those go through the floating-point formatter).
local format = string.format
local function text(n)
  return format('%d', n)
end

-- A fence as the record stores it: 20 digits.
local function fence_text(fence)
  return format('%020d', fence)
end
