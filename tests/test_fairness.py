"""loadtests.fairness: its per-connection accounting (unit tests) and the mechanism on the
real stack: under 20x more connections than HAProxy has server slots, every connection is
served. Timing figures come from the command (docs/performance.md), not from here."""
import asyncio
import json
import sys

import pytest

from conftest import run
from loadtests import fairness


def _stats(completions, latencies=(), errors=None, unfinished=0):
    s = fairness.ConnectionStats()
    s.completions = completions
    s.latencies = list(latencies)
    s.errors.update(errors or {})
    s.unfinished = unfinished
    return s


def test_summarize_counts_starved_connections_and_littles_law():
    # 4 connections in a 10 s run: one starved (0 completions, one timeout).
    stats = [_stats(3, [1.0, 1.0, 1.0]), _stats(2, [2.0, 2.0]), _stats(3, [1.0, 1.0, 4.0]),
             _stats(0, [], {"timeout": 1}, unfinished=1)]
    result = fairness.summarize(stats, 10.0)
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
    result = fairness.summarize([_stats(0, [], {"connect": 2})], 5.0)
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
        stats = fairness.ConnectionStats()
        loop = asyncio.get_running_loop()
        request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        task = asyncio.create_task(fairness.one_connection(
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


@pytest.mark.integration
def test_every_connection_is_served_under_overload(stack, tmp_path):
    """200 keep-alive connections on / for 10 s through HAProxy (4 server slots: 2 clients x
    maxconn 2, so ~196 requests wait in HAProxy's queue at any time): every connection
    completes at least one request, with 0 errors and 0 non-2xx answers."""
    result = run([sys.executable, "-m", "loadtests.fairness", "--connections", "200",
                  "--duration", "10", "--timeout", "8", "--baseline", "0", "--paths", "/",
                  "--out", str(tmp_path)], timeout=120, check=False)
    folder = next(tmp_path.glob("fairness-*"))
    data = json.loads((folder / "report.json").read_text())
    (row,) = data["runs"]
    assert row["connections"] == 200
    assert row["served"] == 200, row
    assert row["completions_min"] >= 1, row
    assert row["errors"] == {}, row
    assert row["haproxy"]["hrsp_5xx"] == 0, row
    # The load really overloaded HAProxy's 4 server slots: requests waited in its queue.
    assert row["haproxy"]["backend_qmax"] > 50, row
    assert result.returncode == 0, result.stdout + result.stderr
