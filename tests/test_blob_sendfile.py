"""End to end: blob downloads with the ``blobsendfile`` filter on the real stack.

The build's clients run with ``blob-sendfile = on`` (the default). Checked on each client
directly and through HAProxy: the bytes (sha256 against the blob file in the blob storage),
``Content-Length``, ``Range`` answers, the clients' open file descriptors after many
downloads (finished and aborted), and the mechanism itself: pyruvate sends the blob with
``sendfile(2)`` (seen by ``strace``), and does not hold it in memory (RSS with stalled
downloads; the read path holds 5 MiB per stalled response).

``PLONEDEPLOY_BLOB_DOWNLOADS`` sets the downloads per target of the descriptor test
(default 300; ``python -m loadtests attacks`` does 2,000 per target, ``--fd-downloads N``).
"""
import concurrent.futures
import configparser
import glob
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from urllib.parse import urlsplit

import psutil
import pytest
import requests

from conftest import ROOT, STACK_JSON, Stack, give_to_service_user, stop_group
from loadtests.core.procs import free_local_port
from loadtests.edge.blobs import abort_download
from unavailable import unavailable

pytestmark = pytest.mark.integration

BLOB_PATH = "/Plone/blob-5mb/@@download/file"
BLOB_SIZE = 5 * 1024 * 1024
DOWNLOADS = int(os.environ.get("PLONEDEPLOY_BLOB_DOWNLOADS", "300"))
BASES = Stack().bases if os.path.exists(STACK_JSON) else {}


@pytest.fixture(scope="module")
def reference():
    """The blob's bytes, read from the blob storage (the newest 5 MiB ``.blob`` file)."""
    files = [p for p in glob.glob(os.path.join(ROOT, "var", "blobstorage", "**", "*.blob"), recursive=True)
             if os.path.getsize(p) == BLOB_SIZE]
    assert files, "no 5 MiB blob in var/blobstorage"
    with open(max(files, key=os.path.getmtime), "rb") as fp:
        return fp.read()


def sha(data):
    return hashlib.sha256(data).hexdigest()


def test_clients_run_the_filter_first(stack):
    for name in stack.kinds:
        ini = configparser.ConfigParser(interpolation=None)
        ini.read(os.path.join(ROOT, "parts", name, "etc", "wsgi.ini"))
        assert ini["pipeline:main"]["pipeline"].split()[0] == "blobsendfile", name
        assert ini["filter:blobsendfile"]["use"] == "egg:plonedeploy.runtime#blobsendfile", name


@pytest.mark.parametrize("base", list(BASES))
def test_whole_blob_identical_with_content_length(stack, reference, base):
    answer = requests.get(BASES[base] + BLOB_PATH, timeout=60)
    assert answer.status_code == 200
    assert int(answer.headers["Content-Length"]) == BLOB_SIZE
    assert answer.headers["Accept-Ranges"] == "bytes"
    assert sha(answer.content) == sha(reference)


@pytest.mark.parametrize("base", list(BASES))
def test_ranges_are_206_with_the_right_slice(stack, reference, base):
    url = BASES[base] + BLOB_PATH
    cases = [("bytes=1000-1999", 1000, 2000), ("bytes=-4096", BLOB_SIZE - 4096, BLOB_SIZE),
             ("bytes=5242000-", 5242000, BLOB_SIZE), ("bytes=0-", 0, BLOB_SIZE)]
    for header, start, end in cases:
        answer = requests.get(url, headers={"Range": header}, timeout=60)
        assert answer.status_code == 206, header
        assert answer.headers["Content-Range"] == f"bytes {start}-{end - 1}/{BLOB_SIZE}", header
        assert int(answer.headers["Content-Length"]) == end - start, header
        assert answer.content == reference[start:end], header
    # five ranges put together are the blob
    step = BLOB_SIZE // 5 + 1
    parts = [requests.get(url, headers={"Range": f"bytes={i}-{min(i + step, BLOB_SIZE) - 1}"}, timeout=60)
             for i in range(0, BLOB_SIZE, step)]
    assert [p.status_code for p in parts] == [206] * len(parts)
    assert sha(b"".join(p.content for p in parts)) == sha(reference)
    # If-Range (no validator matches) and a multi-range request: the whole file, 200
    for headers in ({"Range": "bytes=0-9", "If-Range": "x"}, {"Range": "bytes=0-9,20-29"}):
        answer = requests.get(url, headers=headers, timeout=60)
        assert answer.status_code == 200 and sha(answer.content) == sha(reference), headers


def _download(url):
    """One full download; return (status, bytes received)."""
    received = 0
    with requests.get(url, stream=True, timeout=60) as answer:
        for chunk in answer.iter_content(1 << 20):
            received += len(chunk)
        return answer.status_code, received


def _fds(pids):
    return {name: psutil.Process(pid).num_fds() for name, pid in pids.items()}


def _settled_fds(pids, baseline, timeout=15.0):
    """The clients' descriptor counts once back at ``baseline`` (or after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while True:
        now = _fds(pids)
        if all(now[n] <= baseline[n] for n in now) or time.monotonic() > deadline:
            return now
        time.sleep(0.25)


@pytest.mark.parametrize("base", list(BASES))
def test_descriptors_stable_after_many_downloads(stack, base):
    """DOWNLOADS full downloads (4 at a time) and 30 aborted ones: every client ends with the
    descriptors it had before (a leaked blob file or socket per response would show)."""
    url = BASES[base] + BLOB_PATH
    pids = {name: pid for name, pid in stack.pids().items() if name in stack.kinds}
    for _ in range(4):
        _download(url)  # warm up: ZODB connections, caches, log files
    baseline = _settled_fds(pids, _fds(pids), timeout=2)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(_download, [url] * DOWNLOADS))
        list(pool.map(abort_download, [url] * 30))
    assert results == [(200, BLOB_SIZE)] * DOWNLOADS
    after = _settled_fds(pids, baseline)
    print(f"\n{base}: {DOWNLOADS} downloads + 30 aborted, descriptors {baseline} -> {after}")
    for name in pids:
        assert after[name] <= baseline[name] + 2, (name, baseline, after)


def _rss_mib(pid):
    return psutil.Process(pid).memory_info().rss / 2**20


@pytest.mark.parametrize("client", ["instance", "client2"])
def test_stalled_downloads_do_not_hold_the_blob_in_memory(stack, client):
    """16 downloads whose reader stops after connecting (4 KiB receive buffer): pyruvate's read
    path holds each 5 MiB blob in a bytes object until it is sent (measured: RSS +100 MiB and
    16 blob files open after the clients left); with sendfile the data stays in the page cache.
    waitress, seekable file, streams from its channel: no copy either."""
    pid = stack.pids()[client]
    url = stack.client_urls[client] + BLOB_PATH
    port = urlsplit(url).port
    _download(url)
    rss_before, fds_before = _rss_mib(pid), psutil.Process(pid).num_fds()
    stalled = []
    try:
        for _ in range(16):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(f"GET {BLOB_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            stalled.append(sock)
        time.sleep(4)
        grown = _rss_mib(pid) - rss_before
    finally:
        for sock in stalled:
            sock.close()
    after = _settled_fds({client: pid}, {client: fds_before})
    print(f"\n{client} ({stack.kinds[client]}): RSS +{grown:.1f} MiB with 16 stalled downloads; "
          f"descriptors {fds_before} -> {after[client]} after they closed")
    assert grown < 16 * 5 / 4, f"RSS grew {grown:.1f} MiB"
    assert after[client] <= fds_before + 2


#: What a server may send a response with: sendfile(2), or a copy from memory.
SEND_CALLS = ("sendfile", "sendto", "sendmsg", "write", "writev")


def _strace_sends(pid, url, downloads):
    """Count the calls of SEND_CALLS of process ``pid`` (all threads) during ``downloads``
    whole downloads of ``url``: ``({call: count}, strace's summary)``. The copying calls show
    that the tracer saw the process send, so that 0 sendfile calls means something.
    Without strace, or when ptrace is refused: skipped, and failed in CI (tests/unavailable.py)."""
    if shutil.which("strace") is None:
        unavailable("strace not installed (scripts/install-system.sh installs it)")
    tracer = subprocess.Popen(["strace", "-f", "-c", "-e", "trace=" + ",".join(SEND_CALLS), "-p", str(pid)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # attached to every thread
        if tracer.poll() is not None:
            unavailable(f"strace cannot attach here (ptrace refused?): {tracer.stderr.read().strip()[:200]}")
        results = [_download(url) for _ in range(downloads)]
        time.sleep(0.5)
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)  # detach; -c prints the summary
        try:
            _, summary = tracer.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            tracer.kill()  # not left attached to the client
            tracer.communicate(timeout=10)
            raise
    assert results == [(200, BLOB_SIZE)] * downloads
    calls = dict.fromkeys(SEND_CALLS, 0)
    for line in summary.splitlines():
        fields = line.split()
        # "% time  seconds  usecs/call  calls  [errors]  syscall"
        if fields and fields[-1] in calls and fields[0][0].isdigit():
            calls[fields[-1]] = int(fields[3])
    return calls, summary


def test_pyruvate_sends_blobs_with_sendfile(stack):
    name = next(n for n, kind in stack.kinds.items() if kind == "pyruvate")
    calls, summary = _strace_sends(stack.pids()[name], stack.client_urls[name] + BLOB_PATH, 5)
    assert calls["sendfile"] >= 5, summary


def test_waitress_never_calls_sendfile(stack, reference):
    # "harmless without sendfile": waitress streams the file with read(); same bytes
    name = next(n for n, kind in stack.kinds.items() if kind == "waitress")
    calls, summary = _strace_sends(stack.pids()[name], stack.client_urls[name] + BLOB_PATH, 3)
    assert calls["sendfile"] == 0, summary
    assert calls["sendto"] + calls["sendmsg"] + calls["write"] + calls["writev"] >= 3, summary  # it sent them


@pytest.fixture
def pyruvate_without_filter(stack, tmp_path):
    """The stack's pyruvate client once more, as a process of its own beside it (same
    interpreter, zope.conf and ZEO server; no persistent ZEO cache to share), from a copy of
    its wsgi.ini without the ``blobsendfile`` filter: what ``blob-sendfile = off`` builds.
    Also without ``metrics`` (its port is the running client's), on a free port, logging into
    ``tmp_path``. Yields its base URL and PID; stopped by its process group afterwards."""
    name = next(n for n, kind in stack.kinds.items() if kind == "pyruvate")
    command = psutil.Process(stack.pids()[name]).cmdline()  # [python, interpreter, serve.py, wsgi.ini]
    ini_path = command[-1]
    assert ini_path.endswith("wsgi.ini"), command
    text = open(ini_path, encoding="utf-8").read()
    port = free_local_port()
    text = re.sub(r"(?m)^socket = .*$", f"socket = 127.0.0.1:{port}", text)
    text = re.sub(r"(?m)^    (blobsendfile|metrics)\n", "", text)
    text = text.replace(os.path.join(ROOT, "var", "log") + os.sep, str(tmp_path) + os.sep)
    ini = configparser.ConfigParser(interpolation=None)
    ini.read_string(text)
    pipeline = ini["pipeline:main"]["pipeline"].split()
    assert "blobsendfile" not in pipeline and "metrics" not in pipeline and pipeline[-1] == "zope", pipeline
    assert ini["server:main"]["use"] == "egg:pyruvate#main"
    (tmp_path / "wsgi.ini").write_text(text)
    give_to_service_user(stack, tmp_path)  # the interpreter drops to it, then reads wsgi.ini
    with open(tmp_path / "client.log", "wb") as log:
        proc = subprocess.Popen(command[:-1] + [str(tmp_path / "wsgi.ini")], cwd=tmp_path, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"exited {proc.returncode}: {(tmp_path / 'client.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "not answering within 90 s"
            try:
                if requests.get(base + "/Plone/@@ok", timeout=10).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.3)
        yield base, proc.pid
    finally:
        stop_group(proc, timeout=30)


def test_pyruvate_without_the_filter_never_calls_sendfile(pyruvate_without_filter):
    """The other half of test_pyruvate_sends_blobs_with_sendfile: the same client without the
    filter reads the blob into memory and sends it with write calls (Plone's iterator has no
    fileno()): 0 sendfile calls, the same bytes."""
    base, pid = pyruvate_without_filter
    calls, summary = _strace_sends(pid, base + BLOB_PATH, 3)
    assert calls["sendfile"] == 0, summary
    assert calls["sendto"] + calls["sendmsg"] + calls["write"] + calls["writev"] >= 3, summary  # it sent them
