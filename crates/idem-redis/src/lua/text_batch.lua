-- Number texts for the batch script, remembered across its operations: they mostly share
-- their times (one TIME per script), and number-to-text is one of Lua's dearer steps. Every
-- number written is a whole one well below 2^53, so '%d' (the C library's integer formatting)
-- gives the same digits as tostring's '%.14g' or '%.0f', for less.
local format = string.format
local texts = {}
local function text(n)
  local s = texts[n]
  if not s then
    s = format('%d', n)
    texts[n] = s
  end
  return s
end

-- A fence as the record stores it: 20 digits. Most fences of a batch are the same server
-- time, so that one is made once.
local fences = {}
local function fence_text(fence)
  local s = fences[fence]
  if not s then
    s = format('%020d', fence)
    fences[fence] = s
  end
  return s
end
