"""The soak's traffic: the load tests' paths in turn, at a fixed rate per ZEO client, paced by the clock.

Request ``i`` of a client (from 0) is due ``i / rate`` seconds after the common start
(:func:`due`) and asks ``paths[i % len(paths)]`` (:func:`path_of`), so every client gets the
same sequence at the same times, ``planned(duration, rate)`` requests in all. ``workers``
threads per client take the next index, sleep until it is due and send it on a connection of
its own (``Connection: close``: pyruvate's keep-alive is broken, shared/README.md). When every
worker is busy (the client is slower than the rate) a request starts late; the schedule does
not stretch: the next ones stay due at their own times, so a slow client gets the requests in a
burst and ``late`` counts those that started more than :data:`LATE_AFTER` seconds after due.

Each answer is checked as the Locust file checks it (:func:`answer_problem`): 200, the site's
HTML, its JSON, the blob's exact size. Units: seconds for times, bytes for sizes.
"""
import collections
import http.client
import json
import math
import threading
import time
from urllib.parse import urlsplit

from loadtests.core.stack import BLOB_SIZE, PATHS

#: A request that starts more than this many seconds after it was due counts as late.
LATE_AFTER = 1.0
#: Bodies read whole for the check (HTML, JSON); longer ones (the blob) are only counted.
KEEP_BODY = 1024 * 1024
#: Distinct error messages kept per client (with their counts); the rest only counted.
KEEP_ERRORS = 10


def due(start, rate, index):
    """Clock time (same clock as ``start``) at which request ``index`` (from 0) is due:
    ``rate`` requests per second after ``start``."""
    return start + index / rate


def planned(duration, rate):
    """Requests per client in a soak of ``duration`` seconds at ``rate`` per second: those
    due before the end (the last one due less than ``1 / rate`` s before it)."""
    return max(1, math.ceil(round(duration * rate, 9)))


def path_of(index, labels):
    """The path label (a key of ``core.stack.PATHS``) of request ``index``: ``labels`` in turn."""
    return labels[index % len(labels)]


def answer_problem(label, status, size, body):
    """Why an answer to path ``label`` is wrong (one line), or None when it is right:
    ``status`` the HTTP status, ``size`` the body's bytes, ``body`` the body (bytes) when it
    was kept (at most :data:`KEEP_BODY`), else None."""
    if status != 200:
        return f"{label}: HTTP {status}"
    if label == "blob" and size != BLOB_SIZE:
        return f"blob: {size} bytes, not {BLOB_SIZE}"
    if label == "/Plone" and (body is None or b"<html" not in body[:4096].lower()):
        return "/Plone: not an HTML page"
    if label == "@json":
        try:
            site = json.loads(body or b"")
        except ValueError:
            site = None
        if not isinstance(site, dict) or not str(site.get("@id", "")).endswith("/Plone"):
            return "@json: not the site's JSON (@id ending in /Plone)"
    return None


def fetch(url, label, timeout):
    """GET path ``label`` (``PATHS``) of the client at ``url`` (``http://host:port``) on a new
    connection; returns ``(status, body bytes, body or None)`` (the body kept up to
    :data:`KEEP_BODY`). Raises OSError or http.client.HTTPException."""
    path, accept = PATHS[label]
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        headers = {"Connection": "close", **({"Accept": accept} if accept else {})}
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        size, kept = 0, []
        while True:
            chunk = response.read(65536)
            if not chunk:
                break
            size += len(chunk)
            if size <= KEEP_BODY:
                kept.append(chunk)
        return response.status, size, b"".join(kept) if size <= KEEP_BODY else None
    finally:
        connection.close()


class ClientLoad:
    """The paced requests to one client and what they got. ``requests``: answers that
    passed the check; ``errors``: the others and failed connections (``messages``: counts of
    the first :data:`KEEP_ERRORS` distinct messages); ``late``: requests started more than
    :data:`LATE_AFTER` s after due, ``max_lag_s`` the largest delay; ``bytes``: body bytes
    received. :meth:`counts` reads them consistently while the workers run."""

    def __init__(self, name, url, labels, rate, total, workers, timeout, fetch=fetch):
        self.name, self.url, self.labels = name, url, list(labels)
        self.rate, self.total, self.workers, self.timeout = rate, total, workers, timeout
        self.fetch = fetch
        self.requests = self.errors = self.late = self.bytes = 0
        self.max_lag_s = 0.0
        self.messages = collections.Counter()
        self._next = 0
        self._lock = threading.Lock()
        self._threads = []

    def counts(self):
        """``{"requests", "errors", "late"}`` now (ints)."""
        with self._lock:
            return {"requests": self.requests, "errors": self.errors, "late": self.late}

    def _take(self):
        with self._lock:
            if self._next >= self.total:
                return None
            self._next += 1
            return self._next - 1

    def _record(self, lag, size, problem):
        with self._lock:
            if lag > LATE_AFTER:
                self.late += 1
            self.max_lag_s = max(self.max_lag_s, lag)
            self.bytes += size
            if problem is None:
                self.requests += 1
                return
            self.errors += 1
            if problem in self.messages or len(self.messages) < KEEP_ERRORS:
                self.messages[problem] += 1

    def _work(self, start):
        while True:
            index = self._take()
            if index is None:
                return
            wait = due(start, self.rate, index) - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            lag = max(0.0, time.monotonic() - due(start, self.rate, index))
            label = path_of(index, self.labels)
            try:
                status, size, body = self.fetch(self.url, label, self.timeout)
                problem = answer_problem(label, status, size, body)
            except (OSError, http.client.HTTPException) as exc:
                size, problem = 0, f"{label}: {type(exc).__name__}: {exc}"
            self._record(lag, size, problem)

    def start(self, start):
        """Start the workers; request 0 is due at ``start`` (``time.monotonic()`` clock)."""
        self._threads = [threading.Thread(target=self._work, args=(start,), daemon=True,
                                          name=f"soak-{self.name}-{n}") for n in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def running(self):
        """True while a worker still sends or waits."""
        return any(thread.is_alive() for thread in self._threads)

    def join(self, timeout=None):
        """Wait for the workers (each at most ``timeout`` seconds)."""
        for thread in self._threads:
            thread.join(timeout)
