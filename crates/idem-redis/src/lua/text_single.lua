-- Number texts for a script that runs one operation: plain conversions. (A cache would cost
-- a lone script more than it saves: every table and upvalue is made anew on each call.)
local text = tostring

-- A fence as the record stores it: 20 digits.
local function fence_text(fence)
  return string.format('%020.0f', fence)
end
