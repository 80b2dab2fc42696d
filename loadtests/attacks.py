"""The edge, tried as an attacker would: slow bodies, huge bodies, forged Hosts, floods.

Usage (the stack running: ``make start``)::

    .venv/bin/python -m loadtests.attacks [--stack-config parts/stack/stack.json]
        [--slow-connections 8] [--slow-seconds 20] [--big-post-mib 512] [--upload-mib 200]
        [--slow-upload-mib 30] [--rate-requests 1100]

Each case is sent to the HAProxy frontend of ``stack.json`` (127.0.0.1 only) while the
RSS (MiB) of every stack process is sampled every 0.1 s; the table (case, answer, seconds
to the answer, RSS before / peak / after per process) is printed and written to
``var/reports/attacks-<timestamp>/{report.md,report.json}``. docs/operations.md, "Edge
limits", embeds that table. The functions are the ones tests/test_edge.py asserts on.

Cases: slow request bodies (N connections, each trickling a 100-byte body 1 byte per
0.5 s) while ``GET /Plone`` is timed; the same with 100 MiB announced (upload lane); a POST of ``--big-post-mib`` MiB (upload lane,
spooled to disk); a body over ``max-body-size``; a forged Host, a 10 kB Host, no Host;
the per-source request rate from 127.0.0.2 (127.0.0.1 is exempt in the demo); a TUS
upload (plone.restapi) of ``--upload-mib`` MiB stored as a blob and read back; an honest
slow upload of ``--slow-upload-mib`` MiB at 1 MiB/s.
"""
import base64
import datetime
import hashlib
import http.client
import json
import os
import socket
import sys
import threading
import time

import numpy

from loadtests.core import (STACK_JSON, exits_2_when_not_ready, load_stack, new_parser, RssSampler, stack_pids)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MIB = 1024 * 1024


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


def rate_limit(host, port, requests, source="127.0.0.2"):
    """Send ``requests`` GETs of /Plone/@@ok from ``source`` one after the other.

    Returns the list of their :class:`Answer`; beyond the per-source rate they are 429.
    """
    head = request_head("GET", "/Plone/@@ok", headers=[("Connection", "close")])
    return [send(host, port, head, timeout=10, source=source) for _ in range(requests)]


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
            now = RssSampler(sampler.root_pid)  # a fresh sampler: its peak is the current RSS
            now.sample()
            self.result[name] = (sampler.before / MIB, sampler.peak / MIB, now.peak / MIB)
        return False


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
        counts = {}
        for answer in answers:
            counts[str(answer.status)] = counts.get(str(answer.status), 0) + 1
        return {"answers": counts, "answer_s": round(max(a.seconds for a in answers), 2)}

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
    return rows


def markdown(rows):
    """The report table (one row per case) as Markdown text."""
    names = list(rows[0]["rss_mib"]) if rows else []
    lines = ["| case | expected | answers | s to answer | /Plone during (p99 s, failures) | "
             + " | ".join(f"{n} RSS MiB before/peak/after" for n in names) + " |",
             "|" + "---|" * (5 + len(names))]
    for row in rows:
        pages = row.get("pages")
        probe = f"{pages['p99_s']:.2f}, {pages['failures']} of {pages['requests'] + pages['failures']}" if pages else "-"
        answers = ", ".join(f"{n}x {'no answer (client gave up)' if s == '-1' else s}"
                            for s, n in row["answers"].items())
        if "identical" in row:
            answers += ", identical" if row["identical"] else ", DIFFERENT"
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
    args = parser.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
