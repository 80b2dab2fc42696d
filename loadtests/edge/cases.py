"""The edge's cases: slow bodies, big POSTs, the per-source rate limit, TUS uploads and their
read-back, and ``RssWatch`` (the RSS of every stack process while a case runs).
"""
import base64
import hashlib
import http.client
import socket
import threading
import time

from loadtests.core.procs import RssSampler
from loadtests.edge.wire import Answer, MIB, _answer, request_head, send


def slow_bodies(host, port, connections, seconds, content_length=100, burst=0):
    """``connections`` POSTs at once, each trickling its body 1 byte per 0.5 s after
    sending ``burst`` bytes of it at once.

    Returns the list of their :class:`Answer`. Small bodies: HAProxy answers each 408
    after 10 s (``wait-for-body``), having sent it to no server. A large ``content_length``
    with a ``burst`` beyond HAProxy's buffer goes to the upload lane, which holds it
    (status -1: the client gave up after ``seconds``) without taking a page slot.
    """
    answers = [None] * connections
    head = request_head("POST", "/Plone", content_length=content_length,
                        headers=[("Content-Type", "application/x-www-form-urlencoded")])
    body = b"a" * min(content_length, burst + int(2 * seconds) + 2)

    def one(i):
        answers[i] = send(host, port, head, body, body_rate=1, timeout=seconds, burst=burst)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def big_post(host, port, size):
    """POST ``size`` bytes (zeros, application/octet-stream) to /Plone as fast as possible."""
    head = request_head("POST", "/Plone", content_length=size,
                        headers=[("Content-Type", "application/octet-stream")])
    started = time.monotonic()
    try:
        sock = socket.create_connection((host, port), timeout=300)
    except OSError as exc:
        return Answer(-1, {}, 0.0, str(exc))
    with sock:
        try:
            sock.sendall(head)
            chunk = b"\0" * MIB
            sent = 0
            while sent < size:
                piece = chunk[:min(MIB, size - sent)]
                sock.sendall(piece)
                sent += len(piece)
            return _answer(sock, sock.recv(65536), started, 300)
        except OSError as exc:
            return Answer(-1, {}, time.monotonic() - started, str(exc))


def rate_limit(host, port, requests, source="127.0.0.2", misdirected=False):
    """Send ``requests`` GETs of /Plone/@@ok from ``source`` one after the other.

    ``misdirected``: all but the first and the last carry an unknown Host instead, which
    HAProxy answers itself (421) and counts in the same per-source request rate. The
    requests then fit in one per-source period (10 s) however slowly Zope answers: 1,000
    @@ok answered by Zope one after the other took more than 10 s on a machine with a load
    of 12 on 2 cores, and the rate never passed the limit.

    Returns the list of their :class:`Answer`; beyond the per-source rate they are 429.
    """
    head = request_head("GET", "/Plone/@@ok", headers=[("Connection", "close")])
    if not misdirected or requests < 2:
        return [send(host, port, head, timeout=10, source=source) for _ in range(requests)]
    filler = request_head("GET", "/Plone/@@ok", host="unknown.invalid", headers=[("Connection", "close")])
    return ([send(host, port, head, timeout=10, source=source)]
            + [send(host, port, filler, timeout=10, source=source) for _ in range(requests - 2)]
            + [send(host, port, head, timeout=10, source=source)])


def _tus_metadata(**values):
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in values.items())


class ZeroReader:
    """A file-like body of ``size`` bytes of a repeating pattern, read at most ``rate``
    bytes per second (None: as fast as asked); ``sha256`` of what was read."""

    def __init__(self, size, rate=None):
        self.size, self.rate, self.sent = size, rate, 0
        self.block = bytes(range(256)) * 4096  # 1 MiB, not all zeros
        self.sha256 = hashlib.sha256()
        self.started = time.monotonic()

    def read(self, amount=MIB):
        amount = min(amount, self.size - self.sent, MIB)
        if amount <= 0:
            return b""
        if self.rate:
            due = self.started + (self.sent + amount) / self.rate
            time.sleep(max(0.0, due - time.monotonic()))
        data = self.block[:amount]
        self.sent += amount
        self.sha256.update(data)
        return data


def tus_upload(host, port, password, size, rate=None, filename="upload.bin", folder="/Plone"):
    """Upload ``size`` bytes to Plone with plone.restapi's TUS endpoint, as admin.

    Creation (``POST <folder>/@tus-upload``) then one ``PATCH`` with the whole body at
    ``rate`` bytes per second (None: full speed). Returns ``(content URL, sha256 hex of
    what was sent, seconds)``. Raises RuntimeError with the status when a step fails.
    """
    auth = "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()
    started = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", f"{folder}/@tus-upload", headers={
        "Host": "127.0.0.1", "Authorization": auth, "Tus-Resumable": "1.0.0", "Accept": "application/json",
        "Upload-Length": str(size), "Content-Length": "0",
        "Upload-Metadata": _tus_metadata(filename=filename, **{"content-type": "application/octet-stream"}),
    })
    response = conn.getresponse()
    response.read()
    if response.status != 201:
        raise RuntimeError(f"TUS creation: {response.status} {response.reason}")
    location = response.getheader("Location")
    path = "/" + location.split("/", 3)[3] if "://" in location else location
    conn.close()
    body = ZeroReader(size, rate)
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.putrequest("PATCH", path, skip_host=True, skip_accept_encoding=True)
    for name, value in (("Host", "127.0.0.1"), ("Authorization", auth), ("Tus-Resumable", "1.0.0"),
                        ("Accept", "application/json"), ("Upload-Offset", "0"),
                        ("Content-Type", "application/offset+octet-stream"), ("Content-Length", str(size))):
        conn.putheader(name, value)
    conn.endheaders()
    while True:
        data = body.read()
        if not data:
            break
        conn.send(data)
    response = conn.getresponse()
    response.read()
    conn.close()
    if response.status != 204:
        raise RuntimeError(f"TUS PATCH: {response.status} {response.reason}")
    return response.getheader("Location"), body.sha256.hexdigest(), time.monotonic() - started


def download_sha256(host, port, path, settle=5.0):
    """sha256 hex and byte count of ``GET path`` (read in 1 MiB pieces).

    A 404 is retried for up to ``settle`` seconds: content just committed by the upload
    client reaches the other ZEO clients by ZEO's asynchronous invalidations, so a page
    client may not see it for a moment. Raises RuntimeError for any other status.
    """
    deadline = time.monotonic() + settle
    while True:
        conn = http.client.HTTPConnection(host, port, timeout=600)
        conn.request("GET", path, headers={"Host": "127.0.0.1"})
        response = conn.getresponse()
        digest, total = hashlib.sha256(), 0
        while True:
            data = response.read(MIB)
            if not data:
                break
            digest.update(data)
            total += len(data)
        conn.close()
        if response.status == 404 and time.monotonic() < deadline:
            time.sleep(0.2)
            continue
        if response.status != 200:
            raise RuntimeError(f"GET {path}: {response.status}")
        return digest.hexdigest(), total


class RssWatch:
    """Context manager: RSS (MiB) of each named process before, at peak and after.

    ``processes``: ``{name: psutil.Process}`` (e.g. ``core.stack_pids(config)``).
    ``result``: ``{name: (before, peak, after)}`` after the block.
    """

    def __init__(self, processes):
        self.samplers = {name: RssSampler(proc.pid, interval=0.1) for name, proc in processes.items()}
        self.result = {}

    def __enter__(self):
        for sampler in self.samplers.values():
            sampler.sample()
            sampler.before = sampler.peak
            sampler.start()
        return self

    def __exit__(self, *exc):
        for name, sampler in self.samplers.items():
            sampler.stop()
            now = RssSampler(sampler.roots)  # a fresh sampler: its peak is the current RSS
            now.sample()
            self.result[name] = (sampler.before / MIB, sampler.peak / MIB, now.peak / MIB)
        return False
