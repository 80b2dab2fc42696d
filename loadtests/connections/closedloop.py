"""The closed-loop client of ``connections --fairness``: N keep-alive connections, each
sending its next GET as soon as the previous answer is in, with what every connection got.

A load generator, not a subcommand (:mod:`loadtests.connections.connections` runs it). wrk reports
totals over all its connections; this client counts per connection, which is what "is
every connection served?" needs. asyncio and raw HTTP/1.1, no dependency.

Units: seconds (durations, latencies, timeouts; ``asyncio`` loop time), connections per
second (``connect_rate``), requests/s (``rps``).
"""
import asyncio
import statistics
from collections import Counter
from urllib.parse import urlsplit

from loadtests.core.stats import littles_law, percentile

#: Largest response head accepted (bytes); Plone's headers are a few kB.
HEAD_LIMIT = 2**20


class ConnectionStats:
    """What one connection got: ``completions`` (int), ``errors`` (Counter kind -> count),
    ``latencies`` (list of seconds, one per completion), ``connects`` (TCP connections
    opened, 1 + reconnects after the server closed or an error) and ``unfinished`` (1 if a
    request was still open at the end of the run)."""

    __slots__ = ("completions", "errors", "latencies", "connects", "unfinished")

    def __init__(self):
        self.completions = 0
        self.errors = Counter()
        self.latencies = []
        self.connects = 0
        self.unfinished = 0


def summarize(stats, seconds):
    """Aggregate a list of ConnectionStats over a run of ``seconds``.

    Returns a dict: connections, served (connections with >= 1 completion), completions
    min/median/max per connection, requests, rps (requests/s), errors {kind: count},
    unfinished, latency_s {mean, p50, p99, max} (None without completions),
    littles_law_mean_s (connections / rps, None when rps is 0) and p99_over_littles_mean.
    """
    per_conn = sorted(s.completions for s in stats)
    latencies = sorted(x for s in stats for x in s.latencies)
    errors = Counter()
    for s in stats:
        errors.update(s.errors)
    requests = sum(per_conn)
    rps = requests / seconds if seconds > 0 else 0.0
    p99 = percentile(latencies, 0.99)
    return {
        "connections": len(stats),
        "served": sum(1 for n in per_conn if n > 0),
        "completions_min": per_conn[0] if per_conn else 0,
        "completions_median": statistics.median(per_conn) if per_conn else 0,
        "completions_max": per_conn[-1] if per_conn else 0,
        "requests": requests,
        "rps": round(rps, 1),
        "errors": dict(sorted(errors.items())),
        "unfinished": sum(s.unfinished for s in stats),
        "latency_s": {
            "mean": round(statistics.fmean(latencies), 3) if latencies else None,
            "p50": round(percentile(latencies, 0.50), 3) if latencies else None,
            "p99": round(p99, 3) if latencies else None,
            "max": round(latencies[-1], 3) if latencies else None,
        },
        **littles_law(len(stats), rps, p99),
    }


async def read_response(reader):
    """Read one HTTP/1.1 response; return ``(status, keep_alive)``.

    Handles Content-Length, chunked and close-delimited bodies (the body is discarded).
    Raises asyncio.IncompleteReadError when the peer closes before the response is
    complete, ValueError on a malformed status line.
    """
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip().lower()
    keep_alive = "close" not in headers.get("connection", "")
    if "chunked" in headers.get("transfer-encoding", ""):
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)  # data + CRLF
            if size == 0:  # no trailers expected from HAProxy/Zope
                break
    elif "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif status not in (204, 304):
        await reader.read()  # close-delimited body
        keep_alive = False
    return status, keep_alive


async def one_connection(stats, host, port, request, start_at, deadline, timeout):
    """Closed loop on one connection until ``deadline`` (loop time, seconds): connect at
    ``start_at``, send ``request`` (bytes), read the answer, repeat; reconnect when the
    server closes or after an error. Updates ``stats`` (ConnectionStats) in place."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - loop.time()))
    reader = writer = None
    try:
        while loop.time() < deadline:
            remaining = deadline - loop.time()
            try:
                if writer is None:
                    stats.connects += 1
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(host, port, limit=HEAD_LIMIT), min(timeout, remaining))
                sent = loop.time()
                writer.write(request)
                status, keep_alive = await asyncio.wait_for(read_response(reader),
                                                            min(timeout, deadline - sent))
            except asyncio.TimeoutError:
                if loop.time() >= deadline - 0.001:
                    stats.unfinished += 1  # the run ended first: not the server's fault
                    break
                stats.errors["connect" if reader is None else "timeout"] += 1
                keep_alive = False
            except asyncio.IncompleteReadError:
                stats.errors["closed"] += 1
                keep_alive = False
            except (ValueError, IndexError, asyncio.LimitOverrunError):
                stats.errors["malformed"] += 1  # not HTTP/1.1, or a head over HEAD_LIMIT
                keep_alive = False
            except OSError:  # ConnectionRefusedError, ConnectionResetError, ...
                stats.errors["connect" if reader is None else "reset"] += 1
                keep_alive = False
                if reader is None and loop.time() < deadline:
                    await asyncio.sleep(min(1.0, deadline - loop.time()))  # no busy loop on refusals
            else:
                if 200 <= status < 400:
                    stats.completions += 1
                    stats.latencies.append(loop.time() - sent)
                else:
                    stats.errors["non_2xx"] += 1
            if not keep_alive and writer is not None:
                writer.close()
                reader = writer = None
    finally:
        if writer is not None:
            writer.close()


async def run_load(url, accept, connections, duration, timeout, connect_rate, progress=None):
    """Hold ``connections`` closed-loop connections to ``url`` for ``duration`` seconds.

    Connects are spread at ``connect_rate`` per second from the start; the run (and the
    requests/s denominator) is ``duration`` seconds from the start. ``progress``, if given,
    is called every 5 s with the elapsed seconds, in a worker thread (it may block on I/O
    without stalling the connections). Returns ``(list of ConnectionStats, run seconds)``.
    """
    parts = urlsplit(url)
    path = parts.path or "/"
    request = (f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUser-Agent: plonedeploy-closedloop\r\n"
               + (f"Accept: {accept}\r\n" if accept else "") + "\r\n").encode("ascii")
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + duration
    stats = [ConnectionStats() for _ in range(connections)]
    reporter = asyncio.create_task(_report_progress(progress, start, deadline)) if progress else None
    try:
        await asyncio.gather(*(
            one_connection(s, parts.hostname, parts.port or 80, request, start + i / connect_rate,
                           deadline, timeout)
            for i, s in enumerate(stats)))
    finally:
        if reporter:
            reporter.cancel()
    return stats, duration


async def _report_progress(progress, start, deadline, every=5.0):
    """Call ``progress(elapsed seconds)`` every ``every`` seconds until ``deadline`` (loop time)."""
    loop = asyncio.get_running_loop()
    while loop.time() + every < deadline:
        await asyncio.sleep(every)
        await loop.run_in_executor(None, progress, loop.time() - start)


def run(url, accept, connections, duration, timeout, connect_rate, progress=None):
    """:func:`run_load` in a new event loop, then :func:`summarize`: the row of one run
    (``summarize``'s dict plus ``duration_s`` and ``connect_rate_per_s``)."""
    stats, seconds = asyncio.run(run_load(url, accept, connections, duration, timeout, connect_rate,
                                          progress))
    return {**summarize(stats, seconds), "duration_s": seconds, "connect_rate_per_s": connect_rate}
