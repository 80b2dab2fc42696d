-- wrk script for loadtests.core.wrk.run_wrk (every wrk run of the load tools): optional request header from the environment,
-- and a one-line JSON summary at the end (wrk's own counters; latencies in microseconds).
local accept = os.getenv("PLONEDEPLOY_ACCEPT")
if accept and accept ~= "" then
  wrk.headers["Accept"] = accept
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'PLONEDEPLOY_WRK {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"mean": %.0f, "stdev": %.0f, "max": %d, "p50": %d, "p90": %d, "p95": %d, "p99": %d, "p99.9": %d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.stdev, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(95), latency:percentile(99), latency:percentile(99.9)))
end
