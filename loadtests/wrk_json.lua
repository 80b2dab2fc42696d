-- wrk script of loadtests.blobbench: after the run, one line "WRKJSON {...}" with the
-- summary (requests, bytes, errors) and latency percentiles in microseconds.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "max": %d, "mean": %.1f}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
