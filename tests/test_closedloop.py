"""loadtests.connections.closedloop, the load generator of ``connections --fairness``: its
per-connection accounting and its HTTP/1.1 client loop against a local server (no stack).
The mechanism on the real stack is tests/test_connections.py's."""
import asyncio

from loadtests.connections import closedloop


def _stats(completions, latencies=(), errors=None, unfinished=0):
    s = closedloop.ConnectionStats()
    s.completions = completions
    s.latencies = list(latencies)
    s.errors.update(errors or {})
    s.unfinished = unfinished
    return s


def test_summarize_counts_starved_connections_and_littles_law():
    # 4 connections in a 10 s run: one starved (0 completions, one timeout).
    stats = [_stats(3, [1.0, 1.0, 1.0]), _stats(2, [2.0, 2.0]), _stats(3, [1.0, 1.0, 4.0]),
             _stats(0, [], {"timeout": 1}, unfinished=1)]
    result = closedloop.summarize(stats, 10.0)
    assert result["connections"] == 4
    assert result["served"] == 3
    assert result["completions_min"] == 0
    assert result["completions_median"] == 2.5
    assert result["completions_max"] == 3
    assert result["requests"] == 8
    assert result["rps"] == 0.8
    assert result["errors"] == {"timeout": 1}
    assert result["unfinished"] == 1
    assert result["littles_law_mean_s"] == 5.0           # 4 connections / 0.8 req/s
    assert result["latency_s"]["max"] == 4.0
    assert result["latency_s"]["p99"] == 4.0
    assert result["latency_s"]["mean"] == 1.625
    assert result["p99_over_littles_mean"] == 0.8


def test_summarize_without_completions():
    result = closedloop.summarize([_stats(0, [], {"connect": 2})], 5.0)
    assert result["served"] == 0 and result["rps"] == 0.0
    assert result["littles_law_mean_s"] is None and result["latency_s"]["p99"] is None


def _serve(responses):
    """A local server that answers each connection's requests with the next raw response
    from ``responses`` (closing the connection after a ``Connection: close`` one or one
    without a length)."""
    queue = list(responses)

    async def handle(reader, writer):
        while queue:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            answer = queue.pop(0)
            writer.write(answer)
            await writer.drain()
            if b"Connection: close" in answer or not (b"Content-Length" in answer or b"chunked" in answer):
                break  # the end of a close-delimited answer is the close
        writer.close()
    return handle


def test_read_response_framings_and_the_client_loop():
    """Content-Length, chunked and close-delimited bodies are read whole; a 503 is an
    error, not a completion; the client reconnects after Connection: close; an answer
    that is not HTTP counts as malformed instead of ending the run."""
    responses = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\nclose-delimited",
        b"SSH-2.0-not-http\r\n\r\n",
    ]

    async def scenario():
        server = await asyncio.start_server(_serve(responses), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        stats = closedloop.ConnectionStats()
        loop = asyncio.get_running_loop()
        request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        task = asyncio.create_task(closedloop.one_connection(
            stats, "127.0.0.1", port, request, loop.time(), loop.time() + 1.5, 1.0))
        await task
        server.close()
        return stats

    stats = asyncio.run(scenario())
    assert stats.completions == 3
    assert stats.errors["non_2xx"] == 1
    assert stats.errors["malformed"] == 1
    assert stats.connects >= 2          # reconnected after the close
    assert len(stats.latencies) == 3


def test_progress_is_reported_in_a_thread_until_the_deadline():
    """The progress callback runs every ``every`` seconds in a worker thread (it may block on
    HAProxy's stats page without stalling the connections), and not after the deadline."""
    import threading

    calls = []

    async def scenario():
        loop = asyncio.get_running_loop()
        start = loop.time()
        await closedloop._report_progress(lambda elapsed: calls.append((elapsed, threading.current_thread())),
                                          start, start + 0.35, every=0.1)

    asyncio.run(scenario())
    # At 0.1, 0.2 and 0.3 s (0.4 would be past the deadline); on a busy machine a sleep may
    # overrun and leave room for fewer, never for more, and none comes early.
    assert 1 <= len(calls) <= 3, calls
    assert all(elapsed >= 0.1 * number - 0.01 for number, (elapsed, _) in enumerate(calls, 1)), calls
    assert all(thread is not threading.main_thread() for _, thread in calls)
