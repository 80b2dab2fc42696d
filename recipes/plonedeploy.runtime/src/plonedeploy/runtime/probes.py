"""Health probes of a ZEO client, answered by the metrics thread, and its warm-up.

Kubernetes' probe names (the semantics Plone's PLIP for probes, Products.CMFPlone #4313,
asks for), served next to ``/metrics`` on the client's ``metrics-address`` by a thread of
the client's process, so each answers in milliseconds while every Zope thread is busy:

- ``/livez``: 200 whenever the process can answer at all (its Python runs). A SIGSTOPped or
  wedged process does not answer: that is what the balancer's check timeout catches.
- ``/startupz``: 200 once the warm-up is done (every path of ``warmup-paths`` rendered once
  in-process, then the first one asked from every worker thread of the server), 503 before.
- ``/readyz``: 200 when started, not being recycled by the memory watchdog
  (:mod:`plonedeploy.runtime.watchdog`: ``recycling: ...``), the storage connected and the
  threads not stuck; else 503 with the reason on one line. The storage is ZEO's connection
  to the zeoserver, or RelStorage's database answering a ping every 5 s; it counts as
  disconnected only after ``storage_grace`` seconds without it (a ZEO restart takes a few seconds and
  reads keep being answered from the object and ZEO caches: taking every client out for it
  would turn a blip into an outage); within the grace the answer is 200 "ready; storage
  disconnected for N s (storage-grace G s)". Stuck: every worker thread has held its request longer
  than ``stall_timeout`` seconds (a client with one slow export is busy, not broken).
  HAProxy checks this path on every client (``check addr/port``,
  docs/how-to/operate.md#probes).

Every answer is ``text/plain``; anything else on the port but ``/metrics`` is 404.
"""
import gc
import http.client
import logging
import socket
import socketserver
import threading
import time
import wsgiref.simple_server
import wsgiref.util

logger = logging.getLogger("plonedeploy.probes")

#: The probe paths; loadtests and the recipes use these names too.
LIVE, READY, STARTUP = "/livez", "/readyz", "/startupz"
PROBES = (LIVE, READY, STARTUP)

#: Defaults of the recipe options of the same names (seconds); docs/how-to/operate.md#probes.
STORAGE_GRACE = 30.0
STALL_TIMEOUT = 60.0


#: Seconds between two pings of RelStorage's database (:class:`DatabasePing`): well under
#: the storage grace (30 s), so a database that went away is seen within its first seconds,
#: and one new database connection per client every 5 s costs the database nothing.
PING_INTERVAL = 5.0


def storage_connected(get_db, ping_interval=PING_INTERVAL):
    """A callable for :class:`Health`: True/False when the main database's storage says
    whether it is connected (ZEO's ``ClientStorage.is_connected``) or, for RelStorage, whether
    its database answers (:class:`DatabasePing`, started at the first call); None when the
    storage has no such notion (FileStorage) or the database is not open yet."""
    pings, lock = {}, threading.Lock()

    def connected():
        storage = getattr(get_db(), "storage", None)
        check = getattr(storage, "is_connected", None)
        if check is not None:
            return bool(check())
        # RelStorage keeps no connection whose state could be read (each transaction opens
        # or reuses its own): ask its database. _adapter is not public API (RelStorage
        # 4.3's own transaction code reads storage._adapter); without it: unknown.
        manager = getattr(getattr(storage, "_adapter", None), "connmanager", None)
        if manager is None:
            return None
        with lock:  # the metrics server answers probes in parallel threads: one ping thread
            if id(manager) not in pings:
                pings[id(manager)] = DatabasePing(manager, ping_interval)
            ping = pings[id(manager)]
        return ping()
    return connected


class DatabasePing:
    """Whether RelStorage's database answers, asked off the probe's path.

    A daemon thread opens a new connection through the storage's connection manager
    (``connmanager.open_and_call``: the client's DSN, driver and options), runs
    ``SELECT 1`` and closes it, every ``interval`` seconds. Calling the object returns True
    when the last ping succeeded less than 3 x ``interval`` seconds ago, False when it failed
    or when none has finished for that long (a database that hangs, not only one that
    refuses), None before the first ping has finished. The probe never waits on the
    database: a connect that hangs would make HAProxy's 0.5 s check time out and take the
    client out at once, without the storage grace.
    """

    def __init__(self, manager, interval=PING_INTERVAL, clock=time.monotonic):
        if interval <= 0:
            raise ValueError(f"probes: ping interval = {interval!r} is invalid: expected seconds > 0")
        self.manager = manager
        self.interval = float(interval)
        self.clock = clock
        self.last_ok = None     # monotonic time of the last successful ping
        self.last_error = None  # the last ping's exception, None after a success
        self.started = clock()
        thread = threading.Thread(target=self._run, name="plonedeploy-database-ping", daemon=True)
        thread.start()

    def ping(self):
        """One ping; True or False (the error logged once per outage)."""
        try:
            self.manager.open_and_call(lambda conn, cursor: cursor.execute("SELECT 1"))
        except Exception as exc:  # any driver's error: the database did not answer
            if self.last_error is None:
                logger.warning("probes: the database does not answer: %s", exc)
            self.last_error = exc
            return False
        if self.last_error is not None:
            logger.info("probes: the database answers again")
        self.last_error = None
        self.last_ok = self.clock()
        return True

    def _run(self):
        while True:
            self.ping()
            time.sleep(self.interval)

    def __call__(self):
        now, stale = self.clock(), 3 * self.interval
        if self.last_error is not None:
            return False
        if self.last_ok is None:
            return None if now - self.started < stale else False
        return now - self.last_ok < stale


class Health:
    """What the probes report, kept by the WSGI middleware and the warm-up.

    ``threads``: the client's worker threads (its ``threads``, = ZODB pool-size);
    ``stall_timeout``/``storage_grace``: seconds (see the module docstring);
    ``warmup_paths``: the number of paths the warm-up renders (0: started at once);
    ``connected``: callable returning True, False or None (unknown, counts as connected);
    ``clock``: seconds, monotonic (tests give their own).
    """

    def __init__(self, threads, stall_timeout=STALL_TIMEOUT, storage_grace=STORAGE_GRACE, warmup_paths=0,
                 connected=lambda: None, clock=time.monotonic):
        if threads < 1:
            raise ValueError(f"probes: threads = {threads!r} is invalid: expected at least 1")
        self.threads = threads
        self.stall_timeout = float(stall_timeout)
        self.storage_grace = float(storage_grace)
        self.connected = connected
        self.clock = clock
        self.warmup_total = warmup_paths
        self.warmed = []           # (path, status line or error, seconds)
        self.started = warmup_paths == 0
        self.draining = None       # the memory watchdog's "recycling: ..." (plonedeploy.runtime.watchdog)
        self.watchdog = None       # that watchdog, once the metrics filter started it
        self.warming = False       # a warm-up thread was started
        self._requests = {}        # token -> monotonic start
        self._down_since = None    # monotonic time the storage was first seen disconnected
        self._lock = threading.Lock()

    def begin(self):
        """A request entered the application; returns the token for :meth:`end`."""
        token = object()
        with self._lock:
            self._requests[token] = self.clock()
        return token

    def end(self, token):
        with self._lock:
            self._requests.pop(token, None)

    def in_flight(self):
        """Requests in the application now."""
        with self._lock:
            return len(self._requests)

    def stuck(self):
        """Requests in the application for longer than ``stall_timeout`` seconds now."""
        now = self.clock()
        with self._lock:
            return sum(1 for since in self._requests.values() if now - since > self.stall_timeout)

    def warmed_path(self, path, outcome, seconds):
        """The warm-up rendered ``path`` (``outcome``: its status line or the error)."""
        self.warmed.append((path, outcome, seconds))
        if len(self.warmed) >= self.warmup_total:
            self.started = True

    def storage_down_for(self):
        """Seconds the storage has been seen disconnected without a break (0.0 at the first
        probe that sees it down), None while connected or unknown. Measured from the first
        probe that saw it down: HAProxy asks every ``inter`` seconds, so the grace may end up
        to one ``inter`` late."""
        try:
            connected = self.connected()
        except Exception:  # a storage that cannot say counts as unknown, not down
            logger.exception("probes: cannot ask the storage whether it is connected")
            connected = None
        now = self.clock()
        with self._lock:
            if connected is False:
                if self._down_since is None:
                    self._down_since = now
                return now - self._down_since
            self._down_since = None
            return None

    def ready(self):
        """``(True, "ready")``, ``(True, "ready; storage disconnected for N s ...")`` within
        the storage grace, or ``(False, reason)``: the answer of ``/readyz``."""
        if not self.started:
            return False, f"warming up: {len(self.warmed)} of {self.warmup_total} paths rendered"
        draining = self.draining
        if draining:
            return False, draining
        down = self.storage_down_for()
        outage = None if down is None else \
            f"storage disconnected for {down:.0f} s (storage-grace {self.storage_grace:g} s)"
        if outage and down > self.storage_grace:
            return False, outage
        stuck = self.stuck()
        if stuck >= self.threads:
            return False, (f"stuck: {stuck} requests in the application for more than "
                           f"{self.stall_timeout:g} s (stall-timeout), {self.threads} threads")
        # Within the grace the client still serves (200), and says that the clock runs: an
        # operator (or a test) can tell a client that counts an outage from one that does not.
        return True, f"ready; {outage}" if outage else "ready"


def probe_app(health, metrics_app):
    """The WSGI app of the metrics port: the three probes of ``health``, ``/metrics`` by
    ``metrics_app`` (prometheus-client's), 404 for anything else."""
    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == LIVE:
            ok, text = True, "live"
        elif path == STARTUP:
            ok = health.started
            text = "started" if ok else f"warming up: {len(health.warmed)} of {health.warmup_total} paths rendered"
        elif path == READY:
            ok, text = health.ready()
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: /metrics, /livez, /readyz, /startupz\n"]
        body = (text + "\n").encode()
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                        ("Cache-Control", "no-store")])
        return [body]
    return app


class _Server(socketserver.ThreadingMixIn, wsgiref.simple_server.WSGIServer):
    # A probe that hangs (a client that never reads) must not keep the process alive.
    daemon_threads = True


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 -- the base class's name
        # HAProxy asks every 2 s per client and Prometheus every 15 s: no log line each.
        pass


def serve(host, port, app):
    """Serve ``app`` on ``host:port`` (IPv4 or IPv6) from a daemon thread; returns the
    server. Raises OSError when it cannot listen there."""
    class Server(_Server):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = wsgiref.simple_server.make_server(host, port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name=f"probes {host}:{port}", daemon=True)
    thread.start()
    return server


def warm_up(app, paths, health, host="127.0.0.1", port=80, threads=0):
    """Render each of ``paths`` (URL paths, with an optional query) once through ``app``
    (the client's WSGI pipeline below the metrics filter), in this thread, one after the
    other, and record each in ``health`` (:meth:`Health.warmed_path`); a path whose
    rendering raises is recorded with the error, logged, and the warm-up goes on. A path
    with ``++api++`` is asked for JSON (plone.restapi), the others for HTML.

    ``host``/``port``: the Host the requests name (the client's http-address), so that a
    page is rendered as the balancer's requests are. ``threads`` > 0: before the last path
    is recorded (and the client says ready), the first path is also asked over HTTP from
    the server's worker threads (:func:`warm_threads`). Returns the list of ``(path,
    status line or error, seconds)``.
    """
    for path in paths:
        raw_path, _, query = path.partition("?")
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": raw_path, "QUERY_STRING": query,
                   "SERVER_NAME": host, "SERVER_PORT": str(port), "HTTP_HOST": f"{host}:{port}",
                   "REMOTE_ADDR": "127.0.0.1", "HTTP_USER_AGENT": "plonedeploy-warmup",
                   "HTTP_ACCEPT": "application/json" if "++api++" in raw_path else "text/html"}
        wsgiref.util.setup_testing_defaults(environ)
        status = []

        def start_response(line, headers, exc_info=None):
            status[:] = [line]
            return lambda data: None

        started = time.perf_counter()
        try:
            body = app(environ, start_response)
            try:
                for _ in body:
                    pass
            finally:
                if hasattr(body, "close"):
                    body.close()
            outcome = status[0] if status else "no status"
        except Exception as exc:
            logger.exception("warm-up of %s failed", path)
            outcome = f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - started
        logger.info("warm-up: %s %s in %.2f s", path, outcome, seconds)
        if len(health.warmed) + 1 == len(paths):
            if threads > 0:
                warm_threads(host, port, paths[0], threads)
            settle_heap()
        health.warmed_path(path, outcome, seconds)
    return health.warmed


def warm_threads(host, port, path, threads, wait=60.0, rounds=2, timeout=60.0):
    """Send ``threads`` concurrent ``GET path`` to the client's own server at ``host:port``
    (0.0.0.0 and :: asked on the loopback), ``rounds`` times, once it accepts connections
    (at most ``wait`` seconds; it binds only after the application is loaded, while the
    in-process warm-up runs). Why: the in-process warm-up fills the ZODB and template
    caches, but each of the server's worker threads still paid 60-100 ms more on its own
    first request (first /Plone 124-173 ms, the second 126-141 ms, then a p50 of 72-80 ms,
    measured on the stack; after two concurrent requests the next sequential one took
    73 ms): concurrent requests, each holding a thread, reach every one of them.

    Returns ``[(status code or error text, seconds), ...]``, one per request; never
    raises (a server that does not listen there is logged, and the warm-up goes on)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "::1"
    deadline = time.monotonic() + wait
    while True:
        try:
            socket.create_connection((host.strip("[]"), port), timeout=1.0).close()
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                logger.warning("warm-up: %s:%s accepts no connection after %.0f s (%s): worker threads not warmed",
                               host, port, wait, exc)
                return []
            time.sleep(0.1)
    results = []

    def ask():
        started = time.perf_counter()
        connection = http.client.HTTPConnection(host.strip("[]"), port, timeout=timeout)
        try:
            connection.request("GET", path, headers={"User-Agent": "plonedeploy-warmup", "Accept": "text/html"})
            response = connection.getresponse()
            response.read()
            outcome = response.status
        except (OSError, http.client.HTTPException) as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()
        results.append((outcome, time.perf_counter() - started))

    started = time.perf_counter()
    for _ in range(rounds):
        askers = [threading.Thread(target=ask, name="warm-up request", daemon=True) for _ in range(threads)]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join(timeout + 1.0)
    logger.info("warm-up: %d x %d concurrent GET %s via %s:%s in %.2f s: %s", rounds, threads, path, host, port,
                time.perf_counter() - started, " ".join(str(outcome) for outcome, _ in results))
    return results


def settle_heap():
    """Collect garbage once and move what survives into the permanent generation
    (``gc.freeze``), before the client says ready: the objects of the start-up and the
    warm-up (about all a client's ~200 MiB heap) are never scanned again. Without it the
    first full collection after a start landed on a visitor's request: a first ``/Plone``
    of 330-570 ms against a p50 of 125 ms, measured here after a warm-up. Returns the
    seconds it took."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    seconds = time.perf_counter() - started
    logger.info("warm-up: gc.collect and gc.freeze in %.2f s, %d objects frozen", seconds, gc.get_freeze_count())
    return seconds
