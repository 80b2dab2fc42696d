"""WSGI filter ``metrics``: a ZEO client's requests and ZODB counters in Prometheus format.

Why our own filter (checked November 2026 on Zope 6.3, Plone 6.2.2, Python 3.11):

- ``collective.prometheus`` 1.6.1 (2022) is a Zope view ``@@metrics`` (permission View):
  it is served by the site itself, so through the public frontend unless the balancer
  denies it, and only when a Zope thread is free -- not when the pool is exhausted, the
  moment metrics matter. It has no request counts or latency, its thread gauges need the
  Python 2 ZServer, and its load/store figures are gauges over a 15 s window.
- ``prometheus-zodb`` 0.1.0 is an alpha with ``Requires-Python >=3.12``: pip refuses it on
  Python 3.11. It has no request metrics either, and it replaces no activity monitor a
  site already uses (its counters then disappear).

So this filter uses ``prometheus-client`` alone and serves its own registry (its WSGI app,
from a threaded HTTP server of the standard library) on a separate ``host:port`` (``address``, the recipe's
``metrics-address``), in a thread of the client's process: never through HAProxy's
frontend, and answered while every Zope thread is busy.

Series (units in the names; all per client process):

- ``zope_http_requests_total{method, code}``: requests answered, by method and status code.
- ``zope_http_request_duration_seconds`` (histogram): seconds from the server calling the
  pipeline until the application returned its response. For Zope that is the whole
  rendering of a page; for a blob stream it excludes sending the file (the filter never
  wraps the response body, so ``blobsendfile`` still hands blobs to ``sendfile``).
- ``zope_http_requests_in_progress``: requests inside the application now.
- ``zodb_connections_in_use{database}``: ZODB connections held by requests now (one per
  request; ``pool-size`` = threads); ``zodb_connections_open``: open connections, idle
  ones included; ``zodb_pool_size``: the configured pool size.
- ``zodb_cache_objects{database}`` / ``zodb_cache_non_ghost_objects``: objects in all
  connection caches together, all / loaded; ``zodb_cache_size_target``: ``cache-size`` per
  connection (objects).
- ``zodb_loads_total{database}``: objects loaded from the storage, i.e. **object-cache
  misses** (ZODB's pickle cache counts no hits); ``zodb_stores_total``: objects stored.
  Counted when a connection closes (end of each request).
- ``zeo_cache_hits_total{database}``: loads answered by the ZEO client cache instead of the
  ZEO server (ZEO's own ``_n_accesses``; 0 for storages that are not ZEO clients).
- ``zodb_conflicts_total{class}``: requests aborted by a ``ConflictError`` (ZODB's
  ``ReadConflictError`` and ``BTreesConflictError`` included), by the persistent class in
  conflict (``ConflictError.class_name``, e.g. ``Products.CMFUid.UniqueIdGeneratorTool.
  UniqueIdGeneratorTool``; ``unknown`` when the error names none). Only conflicts the
  storage could not resolve reach the client and are counted; each retry that conflicts
  again counts once more.
- ``zope_request_retries_total``: requests Zope published again after a transient error
  (a conflict, mostly), at most ``max-conflict-retries`` times each. Conflicts minus
  retries is what ended in an error answer (500) after the last retry.
  Both come from ZPublisher's ``IPubBeforeAbort`` event (``retry`` says whether Zope will
  publish the request again), subscribed when the filter is built.
- ``plonedeploy_memory_restarts_total``: recycles by the memory watchdog, all time (read
  from its state file at start: monotonic across the restarts it causes);
  ``plonedeploy_memory_recycle_blocked{reason}``: 1 while RSS is above the limit and it
  does not recycle (``backoff``: ``memory-limit-restarts`` per hour reached; ``no_peer``);
  ``plonedeploy_memory_limit_bytes``. Only with ``memory_limit``
  (:mod:`plonedeploy.runtime.watchdog`, docs/how-to/operate.md#memory-watchdog).
- ``plonedeploy_release_info{release}``: 1, labelled with the id of the release this
  client runs: the first line of ``RELEASE`` in its build directory, which the Ansible
  buildout role writes into each release (docs/how-to/ansible.md#releases-side-by-side). Absent when the
  build has no such file (a buildout stack of ``make build``). See :func:`release_id`.
- ``process_*`` (resident memory, CPU seconds, open file descriptors) and
  ``python_gc_*``, ``python_info`` from prometheus-client's own collectors.

The same server answers the client's probes ``/livez``, ``/readyz`` and ``/startupz``
(:mod:`plonedeploy.runtime.probes`: warm-up, stuck threads, ZEO disconnects), which
HAProxy checks; anything else on the port is 404.

PasteDeploy (``plonedeploy.recipe:instance`` writes this when ``metrics-address`` is set),
after ``blobsendfile``::

    [filter:metrics]
    use = egg:plonedeploy.runtime#metrics
    address = 127.0.0.1:8091
    threads = 2
    warmup_paths = /Plone /Plone/++api++ /Plone/@@search
    warmup_host = 127.0.0.1:8081
    stall_timeout = 60
    storage_grace = 30
    memory_limit = 1073741824
    memory_limit_grace = 60
    memory_limit_restarts = 3
    memory_limit_peers = 127.0.0.1:8092
    memory_state_file = /srv/plone/var/instance/memory-recycles
    check_window = 9

    [pipeline:main]
    pipeline = blobsendfile metrics translogger egg:Zope#httpexceptions zope
"""
import logging
import os
import threading
import time

from plonedeploy.runtime import probes, watchdog

logger = logging.getLogger("plonedeploy.metrics")

#: Methods kept as label values; anything else is counted as ``other`` so that a client
#: sending made-up methods cannot create unbounded series.
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS",
                     "PROPFIND", "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK"))

#: Latency buckets in seconds: a cached page answers in milliseconds, a cold Plone page in
#: 0.1-1 s, anything beyond HAProxy's 30 s server timeout has already failed the user.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def zope_db():
    """The main ZODB ``DB`` of this Zope process (``Zope2.DB``), or None before start-up."""
    try:
        import Zope2
    except ImportError:
        return None
    return getattr(Zope2, "DB", None)


class CountingMonitor:
    """ZODB activity monitor that adds up loads and stores of every closed connection.

    ZODB calls ``closedConnection`` when a request's connection closes. A monitor that was
    already installed (``previous``) still gets every call, after this one has read the
    counts without clearing them (the previous one clears them, as ZODB's own does).
    """

    def __init__(self, previous=None):
        self.previous = previous
        self.loads = 0
        self.stores = 0
        self._lock = threading.Lock()

    def closedConnection(self, conn):  # noqa: N802 -- ZODB's name
        if self.previous is not None:
            loads, stores = conn.getTransferCounts(clear=False)
            self.previous.closedConnection(conn)
        else:
            loads, stores = conn.getTransferCounts(clear=True)
        # Connections close in the request threads; "+=" is not atomic between them.
        with self._lock:
            self.loads += loads
            self.stores += stores

    def __getattr__(self, name):
        # getActivityAnalysis etc. of a previous monitor (Zope's Control_Panel uses them).
        previous = self.__dict__.get("previous")
        if previous is None:
            raise AttributeError(name)
        return getattr(previous, name)


def install_monitor(database):
    """Install a :class:`CountingMonitor` on ``database`` unless one is there; return it."""
    current = database.getActivityMonitor()
    if isinstance(current, CountingMonitor):
        return current
    monitor = CountingMonitor(current)
    database.setActivityMonitor(monitor)
    return monitor


class ZODBCollector:
    """prometheus-client collector of the ZODB pool, caches and loads of ``get_db()``."""

    def __init__(self, get_db=zope_db):
        self.get_db = get_db

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families = {
            "in_use": GaugeMetricFamily("zodb_connections_in_use",
                                        "ZODB connections held by requests now", labels=["database"]),
            "open": GaugeMetricFamily("zodb_connections_open",
                                      "Open ZODB connections, idle ones included", labels=["database"]),
            "pool": GaugeMetricFamily("zodb_pool_size", "Configured ZODB pool-size (connections)",
                                      labels=["database"]),
            "objects": GaugeMetricFamily("zodb_cache_objects",
                                         "Objects in all connection caches (ghosts included)",
                                         labels=["database"]),
            "non_ghost": GaugeMetricFamily("zodb_cache_non_ghost_objects",
                                           "Loaded (non-ghost) objects in all connection caches",
                                           labels=["database"]),
            "target": GaugeMetricFamily("zodb_cache_size_target",
                                        "Configured cache-size per connection (objects)", labels=["database"]),
            "loads": CounterMetricFamily("zodb_loads", "Objects loaded from the storage (object-cache misses)",
                                         labels=["database"]),
            "stores": CounterMetricFamily("zodb_stores", "Objects stored", labels=["database"]),
            "zeo_hits": CounterMetricFamily("zeo_cache_hits", "Loads answered by the ZEO client cache",
                                            labels=["database"]),
        }
        db = self.get_db()
        databases = sorted(getattr(db, "databases", {}).items()) if db is not None else []
        for name, database in databases:
            pool = database.pool
            open_count = len(pool.all)
            families["in_use"].add_metric([name], open_count - len(pool.available))
            families["open"].add_metric([name], open_count)
            families["pool"].add_metric([name], database.getPoolSize())
            details = database.cacheDetailSize()  # under the DB's lock
            families["objects"].add_metric([name], sum(d["size"] for d in details))
            families["non_ghost"].add_metric([name], sum(d["ngsize"] for d in details))
            families["target"].add_metric([name], database.getCacheSize())
            monitor = install_monitor(database)
            families["loads"].add_metric([name], monitor.loads)
            families["stores"].add_metric([name], monitor.stores)
            stats = getattr(getattr(database.storage, "_cache", None), "getStats", None)
            families["zeo_hits"].add_metric([name], stats()[4] if stats is not None else 0)
        return list(families.values())


class Metrics:
    """The request instruments of one exporter, in ``registry`` (a ``CollectorRegistry``)."""

    def __init__(self, registry):
        from prometheus_client import Counter, Gauge, Histogram

        self.registry = registry
        self.requests = Counter("zope_http_requests", "HTTP requests answered by the application",
                                ["method", "code"], registry=registry)
        self.duration = Histogram("zope_http_request_duration_seconds",
                                  "Seconds until the application returned its response",
                                  buckets=BUCKETS, registry=registry)
        self.in_progress = Gauge("zope_http_requests_in_progress", "Requests inside the application now",
                                 registry=registry)
        self.conflicts = Counter("zodb_conflicts", "Requests aborted by a ZODB ConflictError, by class in conflict",
                                 ["class"], registry=registry)
        self.retries = Counter("zope_request_retries", "Requests published again after a transient error",
                               registry=registry)
        # The memory watchdog (plonedeploy.runtime.watchdog); the counter starts from the
        # recycles recorded on disk, so it never goes down across the restarts it causes.
        self.memory_restarts = Counter("plonedeploy_memory_restarts",
                                       "Recycles of this client by the memory watchdog (all time, from its state file)",
                                       registry=registry)
        self.memory_blocked = Gauge("plonedeploy_memory_recycle_blocked",
                                    "1 while RSS is above memory-limit and the watchdog does not recycle: "
                                    "backoff (memory-limit-restarts per hour reached) or no_peer",
                                    ["reason"], registry=registry)
        self.memory_limit = Gauge("plonedeploy_memory_limit_bytes",
                                  "The memory watchdog's memory-limit (absent: off)", registry=registry)
        self.release = Gauge("plonedeploy_release_info", "1, labelled with the id of the release this client runs",
                             ["release"], registry=registry)

    def count_abort(self, event):
        """Handler of ZPublisher's ``IPubBeforeAbort``: count a conflict by its class and a
        retry when Zope will publish the request again (``event.retry``)."""
        from ZODB.POSException import ConflictError

        error = event.exc_info[1] if event.exc_info else None
        if isinstance(error, ConflictError):
            self.conflicts.labels(error.get_class_name() or "unknown").inc()
        if event.retry:
            self.retries.inc()


class Middleware:
    """The WSGI middleware: counts and times each request in ``metrics`` (:class:`Metrics`)
    and keeps ``health`` (a :class:`plonedeploy.runtime.probes.Health`, or None) told which
    requests are inside the application since when."""

    def __init__(self, app, metrics, health=None):
        self.app = app
        self.metrics = metrics
        self.health = health

    def __call__(self, environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        method = method if method in METHODS else "other"
        status = []

        def capture(code, headers, exc_info=None):
            status[:] = [code]
            if exc_info is not None:
                return start_response(code, headers, exc_info)
            return start_response(code, headers)

        metrics, health = self.metrics, self.health
        started = time.perf_counter()
        metrics.in_progress.inc()
        token = health.begin() if health is not None else None
        try:
            result = self.app(environ, capture)
        except BaseException:
            # The server answers 500 (or drops the connection); count it as such.
            metrics.requests.labels(method, "500").inc()
            raise
        finally:
            if token is not None:
                health.end(token)
            metrics.in_progress.dec()
            metrics.duration.observe(time.perf_counter() - started)
        code = status[0].split(None, 1)[0] if status else "none"
        metrics.requests.labels(method, code).inc()
        # The body is returned unchanged: wrapping it would hide pyruvate's FileWrapper
        # from the server (blobsendfile) and copy every response through Python.
        return result


def parse_address(value):
    """``"127.0.0.1:8091"`` -> ``("127.0.0.1", 8091)``; ValueError naming the value otherwise."""
    host, sep, port = str(value).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"metrics: address = {value!r} is invalid: expected one host:port")
    return host.strip("[]"), int(port)


#: ``{(host, port): (Metrics, Health)}``: the exporter of this process, started once even if
#: PasteDeploy builds the filter twice (a second server on the same port would fail to bind).
_EXPORTERS = {}


def exporter(address, threads=1, stall_timeout=probes.STALL_TIMEOUT, storage_grace=probes.STORAGE_GRACE,
             warmup_paths=0):
    """``(Metrics, Health)`` of ``address`` in this process, with its HTTP server started:
    ``/metrics`` and the probes of :mod:`plonedeploy.runtime.probes` (``threads``,
    ``stall_timeout`` and ``storage_grace`` in seconds, ``warmup_paths`` a count: see
    :class:`~plonedeploy.runtime.probes.Health`).

    Raises RuntimeError naming the address if it cannot listen there.
    """
    from prometheus_client import (CollectorRegistry, GCCollector, PlatformCollector,
                                   ProcessCollector, disable_created_metrics, make_wsgi_app)

    host, port = parse_address(address)
    if (host, port) in _EXPORTERS:
        return _EXPORTERS[(host, port)]
    # No "<name>_created" series next to every counter: Prometheus does not need them and
    # they double the lines of each scrape.
    disable_created_metrics()
    # Count loads from the first request on (PasteDeploy builds filters after Zope's
    # start-up, so Zope2.DB is there), not from the first scrape.
    db = zope_db()
    for database in getattr(db, "databases", {}).values():
        install_monitor(database)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(ZODBCollector())
    metrics = Metrics(registry)
    subscribe_aborts(metrics)
    health = probes.Health(threads, stall_timeout, storage_grace, warmup_paths,
                           connected=probes.storage_connected(zope_db))
    try:
        probes.serve(host, port, probes.probe_app(health, make_wsgi_app(registry)))
    except OSError as exc:
        # Fail the client's start-up: a client without its metrics would serve unobserved
        # while Prometheus only says the target is down.
        raise RuntimeError(f"metrics: cannot listen on {host}:{port} (metrics-address): {exc}") from exc
    _EXPORTERS[(host, port)] = (metrics, health)
    logger.info("Prometheus metrics on http://%s:%s/metrics, probes /livez /readyz /startupz", host, port)
    return metrics, health


def subscribe_aborts(metrics):
    """Register ``metrics.count_abort`` for ZPublisher's ``IPubBeforeAbort`` in the global
    component registry (where ``zope.event.notify`` finds handlers); returns False when
    ZPublisher is not importable (the filter outside Zope: no conflicts to count)."""
    try:
        # zope.component.event hooks the component registry's handlers into zope.event's
        # subscribers; Zope imports it while loading ZCML, a bare process would not.
        import zope.component.event  # noqa: F401
        from zope.component import provideHandler
        from ZPublisher.interfaces import IPubBeforeAbort
    except ImportError:
        return False
    provideHandler(metrics.count_abort, (IPubBeforeAbort,))
    return True


def _seconds(option, value):
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ValueError(f"metrics: {option} = {value!r} is invalid: expected seconds > 0")
    return seconds


def watchdog_settings(limit, grace, restarts, peers, state_file, check_window):
    """The keyword arguments of :class:`~plonedeploy.runtime.watchdog.Watchdog` from the
    filter's options, or None when ``limit`` is ``off``; ValueError naming a bad one."""
    limit = str(limit).strip()
    if limit.lower() in ("off", ""):
        return None
    if not limit.isdigit() or int(limit) < 1:
        raise ValueError(f"metrics: memory_limit = {limit!r} is invalid: expected bytes >= 1 or off")
    restarts = str(restarts).strip()
    if not restarts.isdigit():
        raise ValueError(f"metrics: memory_limit_restarts = {restarts!r} is invalid: expected a whole number >= 0")
    peers = str(peers).split()
    for peer in peers:
        parse_address(peer)
    return {"limit": int(limit), "grace": _seconds("memory_limit_grace", grace), "max_restarts": int(restarts),
            "peers": peers, "state_file": str(state_file).strip() or None,
            "check_window": _seconds("check_window", check_window)}


#: The file of a build that names its release (the Ansible buildout role writes it).
RELEASE_FILE = "RELEASE"


def release_id(global_conf):
    """The id of the release this client runs, or None: the first line of ``RELEASE`` in the
    build directory, which is three levels above PasteDeploy's ``here`` (the directory of
    the client's ``parts/<part>/etc/wsgi.ini``, the instance recipe's layout). None when
    ``global_conf`` has no ``here``, or the build has no such file or an empty one; the id
    is kept only if it is short (<= 64 characters) and of letters, digits, ``.``, ``_``,
    ``-`` (a label value read from a file must not be able to make a scrape unreadable)."""
    here = global_conf.get("here")
    if not here:
        return None
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(here)))), RELEASE_FILE)
    try:
        with open(path, encoding="utf-8") as fp:
            value = fp.readline().strip()
    except OSError:
        return None
    if not value or len(value) > 64 or not all(c.isascii() and (c.isalnum() or c in "._-") for c in value):
        logger.warning("%s names no release id (letters, digits, . _ -, at most 64): %r", path, value[:80])
        return None
    return value


def filter_factory(global_conf, address, threads="1", stall_timeout=str(probes.STALL_TIMEOUT),
                   storage_grace=str(probes.STORAGE_GRACE), warmup_paths="", warmup_host="127.0.0.1:80",
                   memory_limit="off", memory_limit_grace=str(watchdog.GRACE),
                   memory_limit_restarts=str(watchdog.MAX_RESTARTS), memory_limit_peers="",
                   memory_state_file="", check_window=str(watchdog.CHECK_WINDOW)):
    """PasteDeploy ``paste.filter_factory`` (``use = egg:plonedeploy.runtime#metrics``).

    ``address``: ``host:port`` of the metrics and probes HTTP server (required);
    ``threads``: the client's worker threads; ``stall_timeout``, ``storage_grace``: seconds
    (:mod:`plonedeploy.runtime.probes`); ``warmup_paths``: URL paths separated by white
    space, rendered once each in a thread of their own before ``/readyz`` says ready (empty:
    ready at once); ``warmup_host``: ``host:port`` the warm-up requests name (the client's
    http-address), where it then asks each of the ``threads`` worker threads once
    (:func:`plonedeploy.runtime.probes.warm_threads`). ``global_conf``'s ``here`` (PasteDeploy's) locates the
    build's ``RELEASE`` for ``plonedeploy_release_info`` (:func:`release_id`). Raises ValueError naming the
    option when one is invalid.
    """
    parse_address(address)  # fail at load time, before anything listens
    if not str(threads).strip().isdigit() or int(threads) < 1:
        raise ValueError(f"metrics: threads = {threads!r} is invalid: expected a whole number >= 1")
    stall, grace = _seconds("stall_timeout", stall_timeout), _seconds("storage_grace", storage_grace)
    paths = warmup_paths.split()
    bad = [p for p in paths if not p.startswith("/")]
    if bad:
        raise ValueError(f"metrics: warmup_paths names {' '.join(bad)}: expected paths starting with /")
    warm_host, warm_port = parse_address(warmup_host)
    memory = watchdog_settings(memory_limit, memory_limit_grace, memory_limit_restarts, memory_limit_peers,
                               memory_state_file, check_window)
    release = release_id(global_conf)

    def make_filter(app):
        metrics, health = exporter(address, int(threads), stall, grace, len(paths))
        if release is not None:
            metrics.release.labels(release).set(1)
        if memory is not None and getattr(health, "watchdog", None) is None:  # once per process
            health.watchdog = watchdog.Watchdog(health, metrics=metrics, address=address, **memory)
            watchdog.start(health.watchdog)
            logger.info("memory watchdog: memory-limit %s bytes, grace %g s, at most %d recycles per hour, peers %s",
                        memory["limit"], memory["grace"], memory["max_restarts"],
                        " ".join(memory["peers"]) or "none")
        if paths and not health.warming:  # PasteDeploy may build the filter twice: warm once
            health.warming = True
            threading.Thread(target=probes.warm_up, args=(app, paths, health, warm_host, warm_port, int(threads)),
                             name="warm-up", daemon=True).start()
        return Middleware(app, metrics, health)

    return make_filter
