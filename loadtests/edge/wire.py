"""Raw HTTP for the edge's cases: one request on a socket with the body sent at a chosen rate
(``send``, ``Answer``), request heads, and ``PageProbe``, which times ``GET /Plone`` while a
case runs; ``MIB``.
"""
import http.client
import socket
import threading
import time

import numpy


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
