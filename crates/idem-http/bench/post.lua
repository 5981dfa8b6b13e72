-- POST a small JSON body; KEY_MODE (env) = "none", "unique" or "replay".
local mode = os.getenv("KEY_MODE") or "none"
local path = os.getenv("BENCH_PATH") or "/plain"
local body = '{"amount_cents":1250,"currency":"EUR","note":"bench"}'
local counter = 0
local prefix = tostring(os.time()) .. "-" .. tostring(math.random(1, 1000000000))

function setup(thread)
  thread:set("tid", tostring(math.random(1, 1000000000)))
end

function request()
  local headers = { ["Content-Type"] = "application/json" }
  if mode == "unique" then
    counter = counter + 1
    headers["Idempotency-Key"] = prefix .. "-" .. (tid or "t") .. "-" .. counter
  elseif mode == "none" then
    -- The baseline builds and sends a header of the same size, which the plain route ignores,
    -- so wrk (sharing the two cores) does the same work per request on both sides.
    counter = counter + 1
    headers["X-Bench-Pad"] = prefix .. "-" .. (tid or "t") .. "-" .. counter
  elseif mode == "replay" then
    headers["Idempotency-Key"] = "bench-replay-key"
  end
  return wrk.format("POST", path, headers, body)
end
