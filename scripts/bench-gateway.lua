-- wrk script for scripts/bench-gateway.sh.
-- wrk -s scripts/bench-gateway.lua URL -- MODE TAG
--   TAG has the same length in every row (the bench script makes it so), so MODE none and
--   MODE unique send requests of the same size (up to the digits of the request counter): same
--   method, path, body and headers, apart from the name of one 15-character header.
--   MODE none:   POST /charge without a key (upstream direct, plain proxy); it still builds a
--                fresh per-request header of the same size (X-Bench-Id-Hdr0, as long as Idempotency-Key), so the client pays
--                the same per-request cost as in MODE unique and the baseline stays fair
--   MODE unique: a fresh Idempotency-Key per request (every request claims, runs, completes)
--   MODE replay: one key for every request, completed before the run (every request replays)
-- The done() hook prints one machine-readable line: RESULT rps p50_us p99_us non2xx errors.

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  mode = args[1] or "unique"
  tag = args[2] or tostring(os.time())
  counter = 0
  prefix = "u-" .. tag .. "-" .. tostring(tid) .. "-"
  body = '{"amount":100}'
end

function request()
  counter = counter + 1
  local headers = { ["Content-Type"] = "application/json" }
  if mode == "unique" then
    headers["Idempotency-Key"] = prefix .. counter
  elseif mode == "none" then
    headers["X-Bench-Id-Hdr0"] = prefix .. counter
  elseif mode == "replay" then
    headers["Idempotency-Key"] = "r-" .. tag
  end
  return wrk.format("POST", "/charge", headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %.1f %d %d %d %d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
