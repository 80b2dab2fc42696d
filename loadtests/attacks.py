"""The edge, tried as an attacker would: slow bodies, huge bodies, forged Hosts, floods.

Usage (the stack running: ``make start``)::

    .venv/bin/python -m loadtests.attacks [--stack-config parts/stack/stack.json]
        [--slow-connections 8] [--slow-seconds 20] [--big-post-mib 512] [--upload-mib 200]
        [--slow-upload-mib 30] [--rate-requests 1100] [--fd-downloads 2000]

Each case is sent to the HAProxy frontend of ``stack.json`` (127.0.0.1 only; the blob case
also to each client of the page pool directly) while the RSS (MiB) of every stack process
is sampled every 0.1 s; the table (case, answer, seconds to the answer, RSS before / peak /
after per process) is printed and written to
``var/reports/attacks-<timestamp>/{report.md,report.json}``. docs/operations.md, "Edge
limits", embeds that table. The functions are the ones tests/test_edge.py asserts on.

Cases: slow request bodies (N connections, each trickling a 100-byte body 1 byte per
0.5 s) while ``GET /Plone`` is timed; the same with 100 MiB announced (upload lane); a POST of ``--big-post-mib`` MiB (upload lane,
spooled to disk); a body over ``max-body-size``; a forged Host, a 10 kB Host, no Host;
the per-source request rate from 127.0.0.2 (127.0.0.1 is exempt in the demo); the ways
around the path rules of loadtests.bypass (the ZMI in disguise, client-sent virtual
hosting, internal headers), on the plain and the TLS listener; a TUS
upload (plone.restapi) of ``--upload-mib`` MiB stored as a blob and read back; an honest
slow upload of ``--slow-upload-mib`` MiB at 1 MiB/s; then, on each ZEO client of the page
pool directly and through the frontend, ``--fd-downloads`` whole downloads of the 5 MiB
blob (wrk, 4 connections) plus 50 aborted ones, with the open descriptors of every ZEO
client before and after and the integrity of a download (sha256 against the blob file,
``Content-Length``, a ``Range`` slice); this case needs ``wrk``.

Exit status 0, or 1 when a case with a verdict failed (the blob downloads: a descriptor
left open, a failed request or a download not equal to the blob file); 2 when stack.json
is missing or, with the blob case, wrk is not installed.
"""
import base64
import datetime
import glob
import hashlib
import http.client
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.request

import numpy

from loadtests import bypass
from loadtests.core import (BLOB_SIZE, PATHS, STACK_JSON, client_urls, exits_2_when_not_ready, load_stack, new_parser,
                            require_wrk, RssSampler, run_wrk, stack_pids)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MIB = 1024 * 1024
#: URL path of the 5 MiB blob the site script creates (``core.PATHS["blob"]``).
BLOB_PATH = PATHS["blob"][0]
#: Downloads the descriptor case aborts (RST after 64 KiB) after its whole ones.
ABORTED_DOWNLOADS = 50


class Answer:
    """First line and headers of an HTTP answer, and the seconds until it came.

    ``status`` is the int status code, 0 if the connection closed without an answer,
    -1 on a socket error (``error`` says which) or when ``timeout`` passed.
    """

    def __init__(self, status, headers, seconds, error=""):
        self.status, self.headers, self.seconds, self.error = status, headers, seconds, error

    def __repr__(self):
        return f"Answer({self.status}, {self.seconds:.2f} s{', ' + self.error if self.error else ''})"


def _parse_head(data):
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    parts = head[0].split()
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def send(host, port, head, body=b"", body_rate=None, timeout=30.0, source=None, burst=0):
    """Send a raw request and return its :class:`Answer`.

    ``head``: the request line and headers as bytes, ending in a blank line (CRLF CRLF);
    ``body``: bytes sent after it, all at once, or ``body_rate`` bytes per second (in
    pieces every 0.5 s, or 1 byte per 0.5 s when the rate is below 2): a trickle; an
    answer that arrives before the body is sent ends the sending. ``source``: local
    address to send from (e.g. ``127.0.0.2``); ``burst``: bytes of the body sent at once
    before the trickle starts. Never raises for network errors.
    """
    started = time.monotonic()
    try:
        sock = socket.create_connection((host, port), timeout=timeout,
                                        source_address=(source, 0) if source else None)
    except OSError as exc:
        return Answer(-1, {}, time.monotonic() - started, f"connect: {exc}")
    with sock:
        try:
            sock.sendall(head)
            if body_rate is None:
                sock.sendall(body)
            else:
                step = max(1, int(body_rate / 2))
                sock.sendall(body[:burst])
                sock.settimeout(0.5)
                sent = burst
                while sent < len(body):
                    sock.sendall(body[sent:sent + step])
                    sent += step
                    try:
                        data = sock.recv(65536)
                        return _answer(sock, data, started, timeout)
                    except socket.timeout:
                        pass
                    if time.monotonic() - started > timeout:
                        return Answer(-1, {}, time.monotonic() - started, "timeout while sending")
            sock.settimeout(max(0.1, timeout - (time.monotonic() - started)))
            return _answer(sock, sock.recv(65536), started, timeout)
        except socket.timeout:
            return Answer(-1, {}, time.monotonic() - started, "timeout")
        except OSError as exc:
            return Answer(-1, {}, time.monotonic() - started, str(exc))


def _answer(sock, data, started, timeout):
    if not data:
        return Answer(0, {}, time.monotonic() - started, "closed without an answer")
    while b"\r\n\r\n" not in data and len(data) < 65536:
        more = sock.recv(65536)
        if not more:
            break
        data += more
    status, headers = _parse_head(data)
    return Answer(status, headers, time.monotonic() - started)


def request_head(method, path, host="127.0.0.1", headers=(), content_length=None):
    """The bytes of an HTTP/1.1 request head: ``host`` None sends no Host header."""
    lines = [f"{method} {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{name}: {value}" for name, value in headers]
    if content_length is not None:
        lines.append(f"Content-Length: {content_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class PageProbe(threading.Thread):
    """``readers`` threads GET ``url`` back to back until :meth:`stop`.

    ``latencies``: seconds of each completed 200; ``failures``: other answers or errors.
    """

    def __init__(self, host, port, path="/Plone", readers=2, timeout=30.0):
        super().__init__(daemon=True)
        self.host, self.port, self.path, self.readers, self.timeout = host, port, path, readers, timeout
        self.latencies, self.failures = [], []
        self._stop_event = threading.Event()

    def _read(self):
        while not self._stop_event.is_set():
            started = time.monotonic()
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                conn.request("GET", self.path, headers={"Host": "127.0.0.1"})
                response = conn.getresponse()
                response.read()
                conn.close()
                if response.status == 200:
                    self.latencies.append(time.monotonic() - started)
                else:
                    self.failures.append(response.status)
            except OSError as exc:
                self.failures.append(str(exc))

    def run(self):
        threads = [threading.Thread(target=self._read, daemon=True) for _ in range(self.readers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def stop(self):
        self._stop_event.set()
        self.join()

    def summary(self):
        """``{"requests", "failures", "p50_s", "p99_s", "max_s"}`` (numpy percentiles)."""
        values = numpy.array(self.latencies) if self.latencies else numpy.array([float("nan")])
        return {"requests": len(self.latencies), "failures": len(self.failures),
                "p50_s": float(numpy.percentile(values, 50)), "p99_s": float(numpy.percentile(values, 99)),
                "max_s": float(values.max())}


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
    for name, value in (("Host", "127.0.0.1"), ("Authorization", auth), ("Tus-Resumable", "1.0.0"), ("Accept", "application/json"),
                        ("Upload-Offset", "0"), ("Content-Type", "application/offset+octet-stream"),
                        ("Content-Length", str(size))):
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


# ----------------------------------------------------------------------------- blob downloads

def abort_download(url, keep=65536):
    """Start a download of ``url``, read ``keep`` bytes (or until the server closes), then
    reset the connection (RST, not FIN: the client vanishes, as a closed browser tab or a
    dropped mobile link does). Used here and by tests/test_blob_sendfile.py and
    tests/test_reliability.py; raises ``OSError`` if the server cannot be reached."""
    host_port = url.split("/")[2]
    host, port = host_port.rsplit(":", 1)
    path = "/" + url.split("/", 3)[3]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host_port}\r\nConnection: close\r\n\r\n".encode())
        got = 0
        while got < keep:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += len(chunk)
        # linger on, timeout 0: close() sends RST and drops what is unsent, no FIN handshake
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def reference_blob():
    """The bytes of the newest 5 MiB ``.blob`` file of ``var/blobstorage``: what every
    download of :data:`BLOB_PATH` must equal. Raises RuntimeError when there is none (no site)."""
    files = [p for p in glob.glob(os.path.join(ROOT, "var", "blobstorage", "**", "*.blob"), recursive=True)
             if os.path.getsize(p) == BLOB_SIZE]
    if not files:
        raise RuntimeError("no 5 MiB blob in var/blobstorage: run 'make site'")
    with open(max(files, key=os.path.getmtime), "rb") as fp:
        return fp.read()


def _get(url, headers=None, timeout=60):
    """``(status, headers, body bytes)`` of ``GET url``; headers are case-insensitive.
    Raises ``urllib.error.HTTPError`` for 4xx/5xx and ``OSError`` when unreachable."""
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.status, answer.headers, answer.read()


def blob_integrity(url, reference):
    """Check one whole download and one ``Range: bytes=1000-1999`` of the blob at ``url``
    against ``reference`` (:func:`reference_blob`). Returns the list of problems (empty:
    200 with ``Content-Length`` 5 MiB and the same sha256, then 206 with the right
    ``Content-Range`` and the 1000 bytes of that slice). Raises ``OSError`` (``HTTPError``
    for 4xx/5xx) when a request fails."""
    problems = []
    status, headers, body = _get(url)
    if status != 200 or int(headers.get("Content-Length", -1)) != BLOB_SIZE:
        problems.append(f"status {status}, Content-Length {headers.get('Content-Length')}")
    if hashlib.sha256(body).digest() != hashlib.sha256(reference).digest():
        problems.append("sha256 of the download differs from the blob file")
    status, headers, body = _get(url, {"Range": "bytes=1000-1999"})
    if status != 206 or body != reference[1000:2000] or headers.get("Content-Range") != f"bytes 1000-1999/{BLOB_SIZE}":
        problems.append(f"Range bytes=1000-1999: status {status}, {len(body)} bytes, "
                        f"Content-Range {headers.get('Content-Range')}")
    return problems


def zeo_clients(config):
    """``{part: psutil.Process}`` of every running ZEO client of the stack (the page pool's
    ``servers`` and the ``upload_servers``), whose descriptors the blob case counts."""
    names = list(config["servers"]) + list(config.get("upload_servers", []))
    return {name: proc for name, proc in stack_pids(config).items() if name in names}


def blob_targets(config):
    """``[(label, blob URL)]``: each page-pool client directly (label ``instance (pyruvate)``),
    then the HAProxy frontend (label ``HAProxy``)."""
    kinds = config["server_kinds"]
    targets = [(f"{part} ({kinds[part]})", url + BLOB_PATH) for part, url in client_urls(config).items()]
    return targets + [("HAProxy", config["frontend_url"] + BLOB_PATH)]


def descriptor_check(label, url, clients, downloads, settle=20.0):
    """``downloads`` whole downloads of ``url`` (wrk, 4 connections, in runs of 2-30 s until
    at least that many completed) and :data:`ABORTED_DOWNLOADS` aborted ones
    (:func:`abort_download`); the open descriptors (``num_fds``) and RSS (MiB) of ``clients``
    (``{name: psutil.Process}``) before, and after once every count is back at its value
    before or ``settle`` seconds passed.

    Returns ``{"target", "downloads" (completed, wrk's count), "aborted", "errors" (wrk's
    counts by kind: connect, read, write, status = non-2xx/3xx, timeout), "max_s" (slowest
    completed download, s), "seconds", "settle_s" (s until the descriptors were back),
    "fds_before", "fds_after", "rss_mib_before", "rss_mib_after" ({name: value}), "ok"}``;
    ``ok``: no error and no client more than 2 descriptors above its count before (a log
    file rotated or a ZODB connection opened in the meantime is not a leak; one per
    download would be thousands). Raises RuntimeError when wrk fails, ``OSError`` when the
    target cannot be reached.
    """
    def snapshot():
        return ({n: p.num_fds() for n, p in clients.items()},
                {n: round(p.memory_info().rss / MIB, 1) for n, p in clients.items()})

    _get(url)  # warm up: a ZODB connection and the blob's cache entry exist before counting
    fds_before, rss_before = snapshot()
    done, max_s, started = 0, 0.0, time.monotonic()
    errors = {}
    chunk_seconds = 2  # short first run: it measures the rate the next runs are sized by
    while done < downloads:
        out = run_wrk(url, 4, chunk_seconds)
        done += out["requests"]
        max_s = max(max_s, out["latency_us"]["max"] / 1e6)
        for kind, count in out["errors"].items():
            errors[kind] = errors.get(kind, 0) + count
        if not out["requests"] and sum(out["errors"].values()):
            break  # nothing completes: more runs would only add errors
        rate = max(done / (time.monotonic() - started), 1.0)
        chunk_seconds = int(min(max((downloads - done) / rate + 1, 2), 30))
        print(f"  {label}: {done}/{downloads} downloads, {time.monotonic() - started:.0f} s", flush=True)
    for _ in range(ABORTED_DOWNLOADS):
        abort_download(url)
    aborted_at = time.monotonic()
    deadline = aborted_at + settle
    while True:
        fds_after, rss_after = snapshot()
        if all(fds_after[n] <= fds_before[n] for n in clients) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    leaked = {n: fds_after[n] - fds_before[n] for n in clients}
    return {
        "target": label, "downloads": done, "aborted": ABORTED_DOWNLOADS,
        "errors": {k: v for k, v in errors.items() if v}, "max_s": round(max_s, 2),
        "seconds": round(time.monotonic() - started, 1), "settle_s": round(time.monotonic() - aborted_at, 1),
        "fds_before": fds_before, "fds_after": fds_after,
        "rss_mib_before": rss_before, "rss_mib_after": rss_after,
        "ok": not any(errors.values()) and all(v <= 2 for v in leaked.values()),
    }


def blob_case(label, url, clients, downloads, reference):
    """The blob case on one target: :func:`blob_integrity`, then :func:`descriptor_check`.

    Returns the descriptor check's dict plus what the report table shows: ``answers``
    (``{"2xx": completed downloads without a status error, "aborted": ..., <error kind>:
    count}``), ``answer_s`` (the slowest completed download, s), ``identical`` (no
    integrity problem), ``integrity_problems``, ``descriptors`` (``{name: [before,
    after]}``); ``ok`` is False also when a download was not the blob. Raises as those two.
    """
    problems = blob_integrity(url, reference)
    check = descriptor_check(label, url, clients, downloads)
    errors = check["errors"]
    answers = {"2xx": check["downloads"] - errors.get("status", 0), "aborted": check["aborted"]}
    answers.update(errors)
    check.update({
        "answers": answers, "answer_s": check["max_s"], "identical": not problems,
        "integrity_problems": problems,
        "descriptors": {n: [check["fds_before"][n], check["fds_after"][n]] for n in clients},
        "ok": check["ok"] and not problems,
    })
    return check


def run_all(config, args, password):
    """Run every case against ``config`` (stack.json); return the list of result rows."""
    host, port = config["frontend_url"].split("//")[1].split(":")
    port = int(port)
    procs = stack_pids(config)
    rows = []

    def case(name, expected, call, probe_pages=False):
        print(f"attacks: {name} ...", flush=True)
        probe = PageProbe(host, port) if probe_pages else None
        if probe:
            probe.start()
        with RssWatch(procs) as watch:
            started = time.monotonic()
            outcome = call()
            seconds = time.monotonic() - started
        if probe:
            probe.stop()
        row = {"case": name, "expected": expected, "seconds": round(seconds, 2),
               "rss_mib": {n: [round(v) for v in values] for n, values in watch.result.items()}}
        row.update(outcome)
        if probe:
            row["pages"] = probe.summary()
        rows.append(row)
        print(f"attacks: {name}: {outcome} ({seconds:.1f} s)", flush=True)

    def statuses(answers):
        return {"answers": _counts(a.status for a in answers), "answer_s": round(max(a.seconds for a in answers), 2)}

    case(f"{args.slow_connections} slow request bodies (1 byte / 0.5 s)", "408 after 10 s, /Plone answers",
         lambda: statuses(slow_bodies(host, port, args.slow_connections, args.slow_seconds)), probe_pages=True)
    case(f"{args.slow_connections} slow large bodies (100 MiB announced, 64 KiB sent, then 1 byte / 0.5 s)",
         "held by the upload lane until the client gives up, /Plone answers",
         lambda: statuses(slow_bodies(host, port, args.slow_connections, args.slow_seconds,
                                      content_length=100 * MIB, burst=64 * 1024)), probe_pages=True)
    case(f"POST of {args.big_post_mib} MiB", "upload lane, spooled to disk",
         lambda: statuses([big_post(host, port, args.big_post_mib * MIB)]))
    case("body over max-body-size (Content-Length 2 GiB)", "413 at once",
         lambda: statuses([send(host, port, request_head("POST", "/Plone", content_length=2 * 1024 ** 3), b"x")]))
    case("forged Host (evil.example)", "421", lambda: statuses(
        [send(host, port, request_head("GET", "/Plone", host="evil.example"))]))
    case("10 kB Host", "421", lambda: statuses(
        [send(host, port, request_head("GET", "/Plone", host="a" * 10000))]))
    case("HTTP/1.1 without Host", "400", lambda: statuses(
        [send(host, port, request_head("GET", "/Plone", host=None))]))
    case(f"{args.rate_requests} requests from 127.0.0.2", "429 beyond the per-source rate",
         lambda: statuses(rate_limit(host, port, args.rate_requests)))

    for name, expected, call in bypass_cases(config, host, port, password):
        case(name, expected, call)

    def upload():
        url, sent, seconds = tus_upload(host, port, password, args.upload_mib * MIB)
        path = "/" + url.split("/", 3)[3] + "/@@download/file"
        got, size = download_sha256(host, port, path)
        return {"answers": {"204": 1}, "answer_s": round(seconds, 2), "identical": got == sent and size == args.upload_mib * MIB}

    case(f"TUS upload of {args.upload_mib} MiB, read back", "stored as a blob, byte-identical", upload,
         probe_pages=True)

    def slow_upload():
        url, sent, seconds = tus_upload(host, port, password, args.slow_upload_mib * MIB, rate=MIB,
                                        filename="slow-upload.bin")
        path = "/" + url.split("/", 3)[3] + "/@@download/file"
        got, size = download_sha256(host, port, path)
        return {"answers": {"204": 1}, "answer_s": round(seconds, 2),
                "identical": got == sent and size == args.slow_upload_mib * MIB}

    case(f"TUS upload of {args.slow_upload_mib} MiB at 1 MiB/s", "succeeds (progress, not total time, counts)",
         slow_upload)

    if args.fd_downloads:
        # Last: the cases above leave nothing behind that this one counts, and its wrk runs
        # (2 cores shared) would slow the others' clocks if they overlapped.
        reference = reference_blob()
        clients = zeo_clients(config)
        for label, url in blob_targets(config):
            case(f"{args.fd_downloads} blob downloads + {ABORTED_DOWNLOADS} aborted via {label}: "
                 "descriptors per ZEO client",
                 "no descriptor left open, downloads equal the blob file (sha256, Range 206)",
                 lambda: blob_case(label, url, clients, args.fd_downloads, reference))
    return rows


def bypass_cases(config, host, port, password):
    """``[(name, expected, call)]``: the ways around the path rules (loadtests.bypass) from
    127.0.0.6, on the plain listener and, when the stack has one, the TLS listener. Each
    call returns a row's ``answers`` (status counts), ``answer_s`` and ``ok`` (the verdict)."""
    listeners = [("plain", port, False)]
    if config.get("tls_url"):
        listeners.append(("TLS", int(config["tls_url"].rsplit(":", 1)[1]), True))
    cases = []
    for label, listen_port, tls in listeners:
        def zmi(listen_port=listen_port, tls=tls):
            started = time.monotonic()
            result = bypass.zmi_case(host, listen_port, auth=("admin", password), tls=tls)
            statuses = [status for _, _, status in result["zmi"]]
            return {"answers": _counts(statuses), "answer_s": round(time.monotonic() - started, 2),
                    "ok": all(s in (400, 403) for s in statuses)
                    and all(s not in (400, 403) for _, s in result["not_zmi"])}

        def virtual_hosting(listen_port=listen_port, tls=tls):
            started = time.monotonic()
            rows = bypass.virtual_host_case(host, listen_port, tls=tls)
            return {"answers": _counts([status for _, status, _ in rows]),
                    "answer_s": round(time.monotonic() - started, 2),
                    "ok": all(status == 400 and not leaked for _, status, leaked in rows)}

        def headers(listen_port=listen_port, tls=tls):
            started = time.monotonic()
            found = bypass.internal_headers(host, listen_port, ["/Plone", "/Plone/@@ok"], tls=tls)
            names = sorted({name for values in found.values() for name in values})
            return {"answers": {f"internal headers: {', '.join(names) or 'none'}": len(found)},
                    "answer_s": round(time.monotonic() - started, 2), "ok": not names}

        cases += [
            (f"the ZMI in {len(bypass.ZMI_PATHS)} disguises ({label}, from {bypass.OUTSIDER}, admin's credentials)",
             "403 each (400 when undecodable); managers-guide reaches Zope", zmi),
            (f"client-sent virtual hosting, {len(bypass.VIRTUAL_HOST_PATHS)} paths ({label})",
             f"400 each, {bypass.FOREIGN_HOST} in no answer", virtual_hosting),
            (f"internal headers to a visitor ({label})", "none", headers),
        ]
    return cases


def _counts(statuses):
    counts = {}
    for status in statuses:
        counts[str(status)] = counts.get(str(status), 0) + 1
    return counts


#: How :func:`markdown` shows the keys of a row's ``answers`` that are not HTTP statuses.
ANSWER_LABELS = {"-1": "no answer (client gave up)", "aborted": "aborted after 64 KiB (RST)",
                 "status": "non-2xx/3xx", "connect": "connect errors", "read": "read errors",
                 "write": "write errors", "timeout": "timeouts (30 s)"}


def markdown(rows):
    """The report table (one row per case) as Markdown text."""
    names = list(rows[0]["rss_mib"]) if rows else []
    lines = ["| case | expected | answers | s to answer | /Plone during (p99 s, failures) | "
             + " | ".join(f"{n} RSS MiB before/peak/after" for n in names) + " |",
             "|" + "---|" * (5 + len(names))]
    for row in rows:
        pages = row.get("pages")
        probe = f"{pages['p99_s']:.2f}, {pages['failures']} of {pages['requests'] + pages['failures']}" if pages else "-"
        answers = ", ".join(f"{n}x {ANSWER_LABELS.get(s, s)}" for s, n in row["answers"].items())
        if "identical" in row:
            answers += ", identical" if row["identical"] else ", DIFFERENT"
        if row.get("integrity_problems"):
            answers += " (" + "; ".join(row["integrity_problems"]) + ")"
        if "descriptors" in row:  # the blob case: before → after of every ZEO client
            answers += "; descriptors " + ", ".join(f"{n} {b} → {a}" for n, (b, a) in row["descriptors"].items())
            if not row["ok"]:
                answers += " — NOT OK"
        elif row.get("ok") is False:
            answers += " — NOT OK"
        rss = " | ".join("/".join(str(v) for v in row["rss_mib"][n]) for n in names)
        lines.append(f"| {row['case']} | {row['expected']} | {answers} | {row['answer_s']} | {probe} | {rss} |")
    return "\n".join(lines) + "\n"


@exits_2_when_not_ready("attacks")
def main(argv=None):
    parser = new_parser("attacks", __doc__.split("\n\n")[0])
    parser.add_argument("--stack-config", default=STACK_JSON)
    parser.add_argument("--slow-connections", type=int, default=8,
                        help="slow-body connections at once (default 8, twice the 4 page slots)")
    parser.add_argument("--slow-seconds", type=float, default=20.0,
                        help="seconds each slow body may trickle (default 20)")
    parser.add_argument("--big-post-mib", type=int, default=512, help="MiB of the big POST (default 512)")
    parser.add_argument("--upload-mib", type=int, default=200, help="MiB of the TUS upload (default 200)")
    parser.add_argument("--slow-upload-mib", type=int, default=30,
                        help="MiB of the honest slow upload at 1 MiB/s (default 30: 30 s)")
    parser.add_argument("--rate-requests", type=int, default=1100,
                        help="requests from 127.0.0.2 (default 1100: the default limit is 1000 per 10 s)")
    parser.add_argument("--fd-downloads", type=int, default=2000, metavar="N",
                        help="whole 5 MiB blob downloads per target (each ZEO client directly, then "
                             "HAProxy) before the 50 aborted ones and the descriptor count; 0 skips "
                             "the case (default 2000, about 15 s per target; the former loadtests.blobbench "
                             "did 10,000)")
    args = parser.parse_args(argv)
    if args.fd_downloads < 0:
        parser.error("--fd-downloads must be >= 0 (0 skips the blob case)")
    if args.fd_downloads:
        require_wrk()
    config = load_stack(args.stack_config)
    with open(os.path.join(ROOT, "var", "admin-password"), encoding="utf-8") as fp:
        password = fp.read().strip()
    rows = run_all(config, args, password)
    directory = os.path.join(ROOT, "var", "reports",
                             "attacks-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "report.json"), "w", encoding="utf-8") as fp:
        json.dump(rows, fp, indent=2)
    table = markdown(rows)
    with open(os.path.join(directory, "report.md"), "w", encoding="utf-8") as fp:
        fp.write(table)
    print(table)
    print(f"attacks: report in {directory}")
    failed = [row["case"] for row in rows if row.get("ok") is False]
    for name in failed:
        print(f"attacks: FAILED: {name}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
