"""The rules of a ZEO client and its place in HAProxy that both deploy paths apply:
``bin/buildout`` (the recipes, through ``options`` and ``haproxy``) and Ansible (the roles,
through ``ansible/filter_plugins/plonedeploy_edge.py``).

Plain Python without zc.buildout or Jinja2, so that Ansible's controller can import it.
Errors are returned as message strings; the recipes turn them into
``zc.buildout.UserError``, the roles into a failed ``assert``.
"""

#: The distribution of what a ZEO client runs (server runners, the blobsendfile and metrics
#: filters): added to a client's ``eggs`` instead of plonedeploy.recipe, whose zc.buildout,
#: Jinja2 and psutil the client has no use for.
RUNTIME_EGG = "plonedeploy.runtime"

#: The probes each ZEO client answers on its metrics-address (plonedeploy.runtime.probes,
#: whose LIVE/READY/STARTUP tests/test_probes.py compares with these). A health check on
#: one of them goes to that address (HAProxy's ``check addr .. port ..``), any other path
#: to the client's http-address.
PROBE_PATHS = ("/livez", "/readyz", "/startupz")
#: HAProxy's health check of the clients and what the rolling restarts wait for: ready
#: (warm, storage connected, threads not stuck), answered off the Zope threads.
HEALTH_CHECK = "/readyz"
#: The health check of clients without a metrics address, so without probes: the load
#: tools' extra clients (A/B slots, -off clients, the matrix's), whose stack's own clients
#: hold the metrics ports meanwhile. Answered by a Zope thread: busy threads delay it.
ZOPE_HEALTH_CHECK = "/Plone/@@ok"


def check_target(health_check, name, metrics_address):
    """``{"check_addr": host, "check_port": int}`` for HAProxy's server line of client
    ``name`` when ``health_check`` is a probe path (it is asked on the client's
    ``metrics_address``, ``host:port``), ``{}`` for a Zope path (asked on the client's
    http-address). Raises ValueError naming the client when a probe path is checked and
    the client has no metrics address."""
    if health_check not in PROBE_PATHS:
        return {}
    if not metrics_address:
        raise ValueError(f"client {name} has no metrics address, where the health check {health_check} "
                         "is answered: give it one (recipe: metrics-address; Ansible: metrics_port)")
    host, _, port = str(metrics_address).rpartition(":")
    return {"check_addr": host.strip("[]"), "check_port": int(port)}


#: WSGI servers a ZEO client can run, mapped to the eggs the client needs for them (added
#: to its ``eggs``). Each needs a ``templates/<name>.ini.in``. Servers without a
#: PasteDeploy entry point usable with Zope run through a runner of the runtime
#: distribution (``egg:plonedeploy.runtime#<name>``, recipes/plonedeploy.runtime/src/
#: plonedeploy/runtime/servers/); ``uwsgi`` is the
#: uWSGI project's ``pyuwsgi`` wheel (uWSGI as a Python extension). ``mod_wsgi`` needs no
#: egg of the client: Apache embeds the system Python through mod_wsgi, which lives in a
#: venv of its own (:data:`MOD_WSGI_EXPRESS`). See docs/reference/servers.md.
SERVERS = {
    "pyruvate": ("pyruvate",),
    "waitress": ("waitress",),
    "gunicorn": (RUNTIME_EGG, "gunicorn"),
    "cheroot": (RUNTIME_EGG, "cheroot"),
    "granian": (RUNTIME_EGG, "granian"),
    "bjoern": (RUNTIME_EGG, "bjoern"),
    "uwsgi": (RUNTIME_EGG, "pyuwsgi"),
    "gevent": (RUNTIME_EGG, "gevent"),
    "mod_wsgi": (RUNTIME_EGG,),
}
#: The pinned mod_wsgi (requirements-mod_wsgi.txt says the same; tests/test_options.py
#: compares them) and its ``mod_wsgi-express``: scripts/install-system.sh compiles it
#: against the system's /usr/bin/python3 and Debian's apache2-dev into this venv, one per
#: version. The ``instance`` recipe's ``mod-wsgi-express`` default.
MOD_WSGI_VERSION = "6.1.1"
MOD_WSGI_EXPRESS = f"/usr/local/lib/plonedeploy/mod_wsgi-{MOD_WSGI_VERSION}/bin/mod_wsgi-express"
#: The user a mod_wsgi client runs as when ``bin/<part>`` is started as root (Apache refuses
#: to serve as root): Debian's web server user, present on every Debian system.
MOD_WSGI_RUN_AS = "www-data"
#: Servers that call the app from one thread, one request at a time (bjoern's libev loop;
#: gevent's greenlets, which without monkey-patching would share Zope's thread-local
#: transaction): for them ``threads`` defaults to, and must be, 1.
SINGLE_THREADED = ("bjoern", "gevent")
DEFAULT_SERVER = "pyruvate"

#: Default worker threads per ZEO client. Two threads keep one Zope process (which uses at
#: most about one core because of the GIL) busy while one request waits on ZEO or I/O,
#: and keep two ZODB connection caches in memory, not ZODB's default pool of seven.
DEFAULT_THREADS = 2


#: Zope's ``max-conflict-retries`` (zope.conf): how often a request that hit a ZODB
#: ConflictError is published again. Before retry *n* (from 1) Zope sleeps a random
#: 0..2**(n-1) s in the worker thread, so *n* retries may add up to 2**n - 1 s: up to 6 keeps
#: that (63 s) below HAProxy's 120 s ``timeout server``; more would answer 504 while Zope
#: still retries. The default is measured (docs/how-to/tuning.md#conflict-retries): with Zope's
#: own 3, 4.6-6.2 % of concurrent document creations failed in the write benchmark on a
#: loaded machine, with 5 0.3-0.7 %.
CONFLICT_RETRIES = tuple(str(n) for n in range(0, 7))
DEFAULT_CONFLICT_RETRIES = "5"

#: The memory allocator of a ZEO client's process (the instance recipe's ``malloc``; the
#: zeoclient role's ``malloc``): glibc's own, or Debian's jemalloc preloaded into the server
#: process (``LD_PRELOAD``). The default stays glibc's, what every client had before the
#: option, until a side-by-side soak (``python -m loadtests soak``) decides.
MALLOCS = ("system", "jemalloc")
DEFAULT_MALLOC = "system"
#: jemalloc's shared library (its soname) and the Debian package that ships it, which
#: scripts/install-system.sh (make system) installs and the zeoclient role installs on a host
#: with a jemalloc client.
JEMALLOC_LIBRARY = "libjemalloc.so.2"
JEMALLOC_PACKAGE = "libjemalloc2"
#: The environment variables the allocator options set; Zope's own ``<environment>``
#: (``environment-vars``) sets variables after the process started, too late for either:
#: the dynamic loader reads ``LD_PRELOAD`` when it starts the program, glibc its tunables
#: (``MALLOC_ARENA_MAX``) before ``main``.
MALLOC_VARIABLES = ("LD_PRELOAD", "MALLOC_ARENA_MAX")


def default_threads(server):
    """Threads (int) of a ZEO client on ``server`` when none are given: 1 for the
    :data:`SINGLE_THREADED` servers, else :data:`DEFAULT_THREADS`."""
    return 1 if server in SINGLE_THREADED else DEFAULT_THREADS


def auto_threads(server, cores, clients):
    """The ``threads = auto`` rule: ``(threads, reason)`` for one ZEO client.

    ``cores``: CPUs the host gives the clients; ``clients``: ZEO clients on that host.
    The rule and the data behind it are in docs/how-to/tuning.md: one Zope process uses about one
    core (the GIL), so threads add throughput only while a request waits (ZEO loads,
    network); on /Plone 2 threads were within noise of 1 and 4 were slower
    (``python -m loadtests scaling``), and with more clients than cores a second thread only adds a
    ZODB connection cache. ``reason`` is one line for the build log.
    """
    if server in SINGLE_THREADED:
        return 1, f"{server} calls the app from one thread"
    if clients > cores:
        return 1, (f"{clients} ZEO clients on {cores} cores: each client has less than a core, "
                   "a second thread would only add a ZODB connection cache")
    return DEFAULT_THREADS, (f"{clients} ZEO client(s) on {cores} cores: one Zope process uses about "
                             f"one core (GIL); {DEFAULT_THREADS} threads keep it busy while a request waits on ZEO")


MiB = 1024 * 1024
GiB = 1024 * MiB
#: The ``memory-limit`` rule (docs/how-to/tuning.md#memory-limit): what the rest of a client host
#: keeps (ZEO server, HAProxy, varnish, the kernel and its page cache of Data.fs and blobs),
#: the share of the remainder the clients' limits add up to (the rest is headroom for the
#: growth during ``memory-limit-grace`` and for one spike), and the floor: 2x the 184-256 MiB
#: peak RSS a client of the demo site reaches (docs/explanation/why-pyruvate.md), since a limit below a
#: client's working size only recycles it into the backoff.
MEMORY_RESERVE = 1 * GiB
MEMORY_SHARE = 0.75
MEMORY_LIMIT_FLOOR = 512 * MiB
#: Defaults of memory-limit-grace (seconds) and memory-limit-restarts (per hour).
MEMORY_LIMIT_GRACE = "60"
MEMORY_LIMIT_RESTARTS = "3"
#: HAProxy's health-check timing of the ZEO clients (haproxy/haproxy.cfg.j2's default-server).
CHECK_INTER, CHECK_FALL, CHECK_RISE = 2, 3, 2


def default_memory_limit(host_memory, clients):
    """The ``memory-limit`` rule: ``(bytes, reason)`` for one ZEO client.

    ``host_memory``: bytes of RAM of the host that runs the clients; ``clients``: ZEO
    clients on that host. The clients' limits together are :data:`MEMORY_SHARE` of what the
    host has beyond :data:`MEMORY_RESERVE`, split evenly, rounded down to MiB, at least
    :data:`MEMORY_LIMIT_FLOOR`. ``reason`` is one line for the build log.
    """
    if host_memory < 1 or clients < 1:
        raise ValueError(f"default_memory_limit({host_memory!r}, {clients!r}): expected positive numbers")
    share = int((host_memory - MEMORY_RESERVE) * MEMORY_SHARE / clients) // MiB * MiB
    if share < MEMORY_LIMIT_FLOOR:
        return MEMORY_LIMIT_FLOOR, (f"{clients} ZEO client(s) on {host_memory // MiB} MiB: "
                                    f"{MEMORY_SHARE:.0%} of the memory beyond {MEMORY_RESERVE // MiB} MiB "
                                    f"is {max(share, 0) // MiB} MiB each, below the floor of "
                                    f"{MEMORY_LIMIT_FLOOR // MiB} MiB: the floor (too many clients for this host?)")
    return share, (f"{clients} ZEO client(s) on {host_memory // MiB} MiB: {MEMORY_SHARE:.0%} of the memory "
                   f"beyond {MEMORY_RESERVE // MiB} MiB (ZEO, HAProxy, varnish, the page cache), split evenly")


def recycle_check_window(inter=CHECK_INTER, fall=CHECK_FALL, margin=3):
    """Seconds the memory watchdog waits, after ``/readyz`` says ``recycling``, before it
    may end the client: HAProxy's ``fall`` failed checks ``inter`` seconds apart (the first
    may come a whole ``inter`` late; the next ones come faster, ``fastinter``) and a margin
    for a check that was under way. 3 x 2 s + 3 s = 9 s."""
    return fall * inter + margin


def threads_error(server, threads):
    """Why ``threads`` (an int >= 1) cannot serve on ``server``, or None when it can."""
    if server in SINGLE_THREADED and threads != 1:
        return f"1 for wsgi-server = {server} (it calls the app from one thread, one request at a time)"
    return None


def fd_limit_needed(maxconn, servers):
    """Smallest ``fd-limit`` (file descriptors) for a frontend ``maxconn``: one per client
    connection (global maxconn = maxconn + 16), one per server connection (at most each
    server's ``maxconn``; ``servers`` is a list of dicts with ``maxconn``), plus 64 for
    listeners, health checks, the stats socket and logs."""
    return maxconn + 16 + sum(int(s["maxconn"]) for s in servers) + 64


#: HAProxy backends of the page pool and the upload lane (templates/haproxy.cfg.j2), by which
#: the A/B tool and ``bin/stack restart`` find the clients in HAProxy's stats.
POOL_BACKEND = "zeoclients"
UPLOAD_BACKEND = "uploads"


def ab_contract(page_servers, upload_servers, bind, stats_bind, tls_bind, balance, run_dir):
    """The A/B tool's facts about a deployed stack (``python -m loadtests ab --stack-config``), a dict.

    The one source of ``abtest.json`` (the Ansible haproxy role, through the filter
    ``plonedeploy_ab_contract``) and of those keys in ``parts/<stack>/stack.json`` (the
    ``plonedeploy.recipe:stack`` recipe, which adds its processes and paths).
    ``page_servers`` / ``upload_servers``: lists of dicts with ``name`` and ``wsgi_server``
    (HAProxy's server names, in HAProxy's order); ``bind``, ``stats_bind``: HAProxy's
    ``host:port``; ``tls_bind``: ``host:port`` or empty (no TLS); ``balance``: HAProxy's
    algorithm; ``run_dir``: the directory of HAProxy's admin socket and bin/stack's supervisord
    (its socket and pidfile).
    Returns ``frontend_url``, ``tls_url`` (None without TLS), ``stats_url``, ``backend``,
    ``balance``, ``servers``, ``server_kinds`` ({name: wsgi_server} of the page pool),
    ``upload_servers``, ``upload_backend``, ``processes`` (empty: the stack recipe lists
    its own) and ``run_dir``.
    """
    return {
        "frontend_url": f"http://{bind}",
        "tls_url": f"https://{tls_bind}" if tls_bind else None,
        "stats_url": f"http://{stats_bind}/stats;csv",
        "backend": POOL_BACKEND,
        "balance": balance,
        "servers": [server["name"] for server in page_servers],
        "server_kinds": {server["name"]: server["wsgi_server"] for server in page_servers},
        "upload_servers": [server["name"] for server in upload_servers],
        "upload_backend": UPLOAD_BACKEND,
        "processes": [],
        "run_dir": run_dir,
    }


def canary_and_peers(servers, candidates):
    """The canary rule of issue 29, for both canary deploys (``loadtests.ab.canary_deploy.choose``
    and the canary role's filter ``plonedeploy_canary_choice``): a canary is judged against the
    other clients of its *own* WSGI server, since another server's differences would be taken
    for the release's.

    ``servers``: ``{client key: WSGI server name}`` of the page pool, in the pool's order;
    ``candidates``: the keys to try as the canary, in order of preference. Returns ``(canary
    key, [its peers' keys, in the pool's order])`` of the first candidate that has at least one
    peer, or None when none has (the callers word the error for their own options)."""
    for key in candidates:
        peers = [other for other, server in servers.items() if other != key and server == servers[key]]
        if peers:
            return key, peers
    return None
