"""``plonedeploy.recipe:instance`` -- a ZEO client served by one of several WSGI servers.

A thin layer over ``plone.recipe.zope2instance``: every option it does not read passes
through to it unchanged (``zeo-client``, ``zeo-address``, ``blob-storage``,
``zodb-cache-size``, ``event-log``, ...).

Options read here: ``optiontables.INSTANCE`` (name, default, allowed values, one line
each; docs/recipe.md's table is generated from it). The reasons behind them:

- ``threads`` is also the ZODB ``pool-size`` written into ``<zodb_db main>`` of
  ``etc/zope.conf``: each concurrent request holds one ZODB connection with its own object
  cache of ``zodb-cache-size`` objects (memory ~ threads x zodb-cache-size x object size).
  ``auto`` is ``rules.auto_threads`` (docs/tuning.md); ``zodb-cache-memory`` is divided by
  the threads for the same reason.
- ``max-request-body-size`` defaults to 1 GiB (plone.recipe.zope2instance's own) for
  waitress, which spools bodies to disk and enforces it itself, and to 1 MiB (Zope's
  ``form-memory-limit``) for the servers that hold a body in memory with no limit of their
  own (pyruvate): the balancer enforces theirs (``edge.body_limit_errors``).
- ``max-conflict-retries`` is Zope's own zope.conf key, which plone.recipe.zope2instance
  has no option for: appended to ``zope-conf-additional``; its range keeps Zope's retry
  back-offs within HAProxy's ``timeout server`` (``rules.CONFLICT_RETRIES``).
- ``storage = relstorage`` forces ``zeo-client`` off (the stock recipe refuses both), so a
  part made with ``<= instance`` switches by this one option; ``relstorage-dsn`` must not
  hold a password because zope.conf is world-readable (``options.parse_dsn``).
- ``memory-limit`` (with ``metrics-address``; ``configure_memory_watchdog``): the memory
  watchdog in the metrics filter (plonedeploy.runtime.watchdog); its default is
  ``rules.default_memory_limit`` over ``host-memory`` and ``clients-per-host``
  (docs/tuning.md, "Memory limit"); recycles are recorded in ``<client home>/memory-recycles``
  for the backoff (docs/operations.md, "Memory watchdog").

- ``wsgi-server = mod_wsgi`` (``configure_mod_wsgi``): ``mod-wsgi-express`` must exist at
  build time (scripts/install-system.sh builds it against the system Python); ``run-as``
  is who runs Apache when the client starts as root, so the part gets a Chameleon cache of
  its own (``var/<part>/chameleon``) that this user may write, and a server root per port
  (``var/<part>/mod_wsgi-<port>``); ``max-request-body-size`` becomes Apache's
  ``LimitRequestBody``.
- ``service-user``: ``bin/<part>`` (every command: ``console``, ``fg``, ``run``, ``debug``)
  and ``parts/<part>/bin/interpreter`` start with ``plonedeploy.runtime.access.become``: when
  root runs them, they first give that user what the client writes (``stack.client_layout``:
  its home, caches, blob directory, logs) and search permission on the way to the build,
  then run as it. A ZEO client started by hand as root (``make site``, the load tools' extra
  clients, made with ``<= instance``) then writes blobs as the user the ZEO server runs as,
  which the server can ``chmod``; a root client's blob it could not (EPERM). The stack
  part requires every client's ``service-user`` to be its own.
- ``hello-address`` writes ``etc/hello.ini`` beside ``etc/wsgi.ini``: the same template with
  ``hello_app`` true, so the hello-world app is served by exactly the server section the
  client has (same keys, same stage 2), on another address; the benchmark matrix compares
  the two (loadtests/matrix_servers.py).

The server template is rendered in two stages: Jinja2 fills ``{{ ... }}`` (server, address,
threads), then plone.recipe.zope2instance fills ``%(...)s`` (log files, pipeline, zope.conf
path) as it does for its own ``wsgi-ini-template``; a literal ``%`` must be written ``%%``.

Without a ``user`` option no ``inituser`` is written (the stock recipe would prompt for
one); the admin account is created by ``scripts/create_site.py`` from a generated password
in a 0600 file instead.

Errors: ``zc.buildout.UserError`` naming part, option, value and allowed values.
"""
import logging
import os

import zc.buildout
from plone.recipe.zope2instance import make
from plone.recipe.zope2instance.recipe import Recipe as Zope2InstanceRecipe

from plonedeploy.recipe.edge import default_body_cap
from plonedeploy.recipe.optiontables import INSTANCE, DeclaredOptions
from plonedeploy.stack.rules import CONFLICT_RETRIES, MOD_WSGI_EXPRESS, default_memory_limit, recycle_check_window
from plonedeploy.recipe.stack import check_service_user, client_layout
from plonedeploy.recipe.options import (
    BLOB_FILTER,
    HELLO_APP,
    METRICS_EGG,
    METRICS_FILTER,
    RELSTORAGE_BLOBS,
    RELSTORAGE_EGGS,
    RUNTIME_EGG,
    SERVERS,
    STORAGES,
    add_pipeline_filter,
    auto_threads,
    check_choice,
    fail,
    insert_pipeline_filter_after,
    insert_pool_size,
    parse_byte_size,
    parse_dsn,
    parse_http_address,
    parse_positive_int,
    parse_switch,
    parse_threads,
    relstorage_lines,
    render_template,
    template_option,
)

logger = logging.getLogger("plonedeploy.recipe")

#: ``recipe =`` values that make a part a ZEO client of this recipe.
_INSTANCE_RECIPES = ("plonedeploy.recipe", "plonedeploy.recipe:instance", "plonedeploy.recipe:default")


def _is_instance_part(buildout, part):
    """True if buildout section ``part`` uses this recipe (counted for ``clients-per-host``).

    Reads the raw, unsubstituted sections (zc.buildout's ``_raw``, following ``<=``
    macros) because ``buildout[part]`` would construct that part's recipe now, and the
    haproxy part's recipe reads this client's ``threads`` before it is resolved.
    """
    raw = getattr(buildout, "_raw", {})
    seen = set()
    while part in raw and part not in seen:
        seen.add(part)
        data = raw[part]
        if "recipe" in data:
            return data["recipe"].strip() in _INSTANCE_RECIPES
        macros = data.get("<", "").split()
        if not macros:
            return False
        part = macros[-1]  # the last macro's options win, as in zc.buildout
    return False


def clients_per_host(buildout, name, opts):
    """ZEO clients on the host, for ``threads = auto`` and the default ``memory-limit``:
    ``clients-per-host`` when set, else the ``plonedeploy.recipe:instance`` parts of the
    buildout (``name``'s included). Raises ``zc.buildout.UserError`` for a bad value."""
    clients = opts.get("clients-per-host", "").strip()
    if clients:
        return parse_positive_int(name, clients, "clients-per-host")
    return sum(1 for part in buildout["buildout"]["parts"].split()
               if part == name or _is_instance_part(buildout, part))


def positive_seconds(name, opts, option):
    """``(text, seconds)`` of ``option`` (its default set when absent): a number of seconds
    > 0; raises ``zc.buildout.UserError`` naming the option otherwise."""
    value = opts.setdefault(option).strip()
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        fail(name, option, value, "a number of seconds > 0")
    return value, seconds


def mem_total():
    """Bytes of RAM of this host (``MemTotal`` of /proc/meminfo)."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise zc.buildout.UserError("cannot read MemTotal from /proc/meminfo: set host-memory or memory-limit")


class Recipe(Zope2InstanceRecipe):
    """ZEO client part; see the module docstring for its options."""

    def __init__(self, buildout, name, options):
        self.name = name  # the stock __init__ sets it too, but context() is needed before
        # Reads go through the table (an undeclared option raises); writes to options.
        self.opts = opts = DeclaredOptions(name, options, INSTANCE)
        self.server = check_choice(
            name, "wsgi-server", opts.setdefault("wsgi-server"), tuple(SERVERS)
        )
        options["wsgi-server"] = self.server
        if "http-address" not in opts:
            raise zc.buildout.UserError(
                f"[{name}] http-address is required: one host:port such as 127.0.0.1:8081"
            )
        self.host, self.port = parse_http_address(name, opts["http-address"])
        threads = opts.get("threads")
        if threads is not None and threads.strip() == "auto":
            threads = self.auto_threads(buildout, name, options)
        self.threads = parse_threads(name, self.server, threads)
        options["threads"] = str(self.threads)
        options["pool-size"] = str(self.threads)
        if "zodb-cache-memory" in opts:
            if opts.get("zodb-cache-size-bytes"):
                raise zc.buildout.UserError(
                    f"[{name}] zodb-cache-memory and zodb-cache-size-bytes are both set; "
                    "keep one (zodb-cache-memory = the budget of all threads together)"
                )
            budget = parse_byte_size(name, "zodb-cache-memory", opts["zodb-cache-memory"])
            options["zodb-cache-size-bytes"] = str(budget // self.threads)
            logger.info("[%s] zodb-cache-memory %s -> zodb-cache-size-bytes %s per connection "
                        "(%s threads, one ZODB connection cache each)",
                        name, opts["zodb-cache-memory"].strip(), budget // self.threads, self.threads)
        cap = opts.get("max-request-body-size", "").strip() or str(default_body_cap(self.server))
        options["max-request-body-size"] = str(parse_positive_int(
            name, cap, "max-request-body-size", "a number of bytes such as 1048576"))
        self.mod_wsgi = None
        if self.server == "mod_wsgi":
            self.configure_mod_wsgi(buildout, name, options)
        self.blob_sendfile = parse_switch(name, "blob-sendfile", opts.setdefault("blob-sendfile"))
        options["blob-sendfile"] = "on" if self.blob_sendfile else "off"
        if not self.blob_sendfile and BLOB_FILTER in opts.get("pipeline", "").split():
            raise zc.buildout.UserError(
                f"[{name}] pipeline names {BLOB_FILTER} but blob-sendfile = off; "
                f"remove it from pipeline or set blob-sendfile = on"
            )
        self.metrics_address = None
        if opts.get("metrics-address", "").strip():
            metrics_host, metrics_port = parse_http_address(
                name, opts["metrics-address"], "metrics-address")
            if (metrics_host, metrics_port) == (self.host, self.port):
                fail(name, "metrics-address", opts["metrics-address"],
                     f"a host:port other than http-address = {options['http-address'].strip()}")
            self.metrics_address = f"{metrics_host}:{metrics_port}"
            options["metrics-address"] = self.metrics_address
        elif METRICS_FILTER in opts.get("pipeline", "").split():
            raise zc.buildout.UserError(
                f"[{name}] pipeline names {METRICS_FILTER} but metrics-address is not set; "
                "set metrics-address = host:port or remove it from pipeline"
            )
        self.probes = self.configure_probes(name, opts, options)
        self.probes.update(self.configure_memory_watchdog(buildout, name, options))
        self.hello_address = None
        if opts.get("hello-address", "").strip():
            hello = parse_http_address(name, opts["hello-address"], "hello-address")
            if hello == (self.host, self.port):
                fail(name, "hello-address", opts["hello-address"],
                     f"a host:port other than http-address = {options['http-address'].strip()}")
            self.hello_address = hello
            options["hello-address"] = f"{hello[0]}:{hello[1]}"

        self.storage = self.configure_storage(buildout, name, options)
        self.configure_conflict_retries(name, options)

        if "wsgi-ini-template" in opts:
            raise zc.buildout.UserError(
                f"[{name}] wsgi-ini-template is set by plonedeploy.recipe from "
                "templates-directory/<wsgi-server>.ini.in; remove it and edit that template"
            )
        self.template = template_option(name, opts, "templates-directory", f"{self.server}.ini.in")

        if self.blob_sendfile and f"[filter:{BLOB_FILTER}]" not in render_template(self.template, self.context()):
            raise zc.buildout.UserError(
                f"[{name}] blob-sendfile = on but {self.template} defines no [filter:{BLOB_FILTER}] "
                "(see templates/_common.ini.in); add it or set blob-sendfile = off"
            )

        if self.metrics_address and f"[filter:{METRICS_FILTER}]" not in render_template(self.template, self.context()):
            raise zc.buildout.UserError(
                f"[{name}] metrics-address is set but {self.template} defines no [filter:{METRICS_FILTER}] "
                "(see templates/_common.ini.in); add it or remove metrics-address"
            )

        if self.hello_address and HELLO_APP not in render_template(self.template, self.hello_context()):
            raise zc.buildout.UserError(
                f"[{name}] hello-address is set but {self.template} renders no {HELLO_APP} app when "
                "hello_app is true (see templates/_common.ini.in); add it or remove hello-address"
            )

        self.service_user = opts.setdefault("service-user").strip()
        options["service-user"] = self.service_user
        if self.service_user:
            check_service_user(name, self.service_user)

        eggs = opts.get("eggs", "").split()
        eggs += [egg for egg in SERVERS[self.server] if egg not in eggs]
        # egg:plonedeploy.runtime#blobsendfile, #hello; plonedeploy.runtime.access.become
        if (self.blob_sendfile or self.hello_address or self.service_user) and RUNTIME_EGG not in eggs:
            eggs.append(RUNTIME_EGG)
        if self.metrics_address:
            # egg:plonedeploy.runtime#metrics, which imports prometheus_client
            eggs += [egg for egg in (RUNTIME_EGG, METRICS_EGG) if egg not in eggs]
        if self.storage == "relstorage":
            eggs += [egg for egg in RELSTORAGE_EGGS if egg not in eggs]
        options["eggs"] = "\n".join(eggs)

        location = os.path.join(buildout["buildout"]["parts-directory"], name)
        # The stock recipe %-formats this file; we write it from the Jinja2 template
        # in build_wsgi_ini, just before the stock code reads it.
        options["wsgi-ini-template"] = os.path.join(location, "etc", "wsgi.ini.in")
        super().__init__(buildout, name, options)
        if self.service_user:
            # First thing in bin/<part> and parts/<part>/bin/interpreter, after sys.path and
            # before anything opens a file (the ctl script reads wsgi.ini's logging config and
            # opens the logs before any command runs). Set after the stock __init__, which
            # %-formats the option: the layout's paths are not templates.
            layout = client_layout(buildout, name, options)
            drop = (f"from plonedeploy.runtime.access import become\n"
                    f"become({self.service_user!r}, {layout!r})\n")
            options["initialization"] = drop + options["initialization"]
        if self.blob_sendfile:
            # After the stock __init__, which sets the default pipeline.
            options["pipeline"] = add_pipeline_filter(opts["pipeline"])
        if self.metrics_address:
            # After blobsendfile, which must stay outermost; the metrics filter never wraps
            # the response body, so anything it sees is still the application's own.
            options["pipeline"] = insert_pipeline_filter_after(opts["pipeline"], METRICS_FILTER, BLOB_FILTER)

    @staticmethod
    def configure_probes(name, opts, options):
        """``{"warmup_paths": str, "stall_timeout": float, "storage_grace": float}`` from the
        options of the same names (plonedeploy.runtime.probes; used with metrics-address);
        raises ``zc.buildout.UserError`` naming the option and its allowed values."""
        paths = opts.setdefault("warmup-paths").split()
        if paths == ["off"]:
            paths = []
        bad = [p for p in paths if not p.startswith("/")]
        if bad:
            fail(name, "warmup-paths", opts["warmup-paths"], "URL paths starting with /, or off")
        probes = {"warmup_paths": " ".join(paths)}
        for option in ("stall-timeout", "storage-grace"):
            options[option], probes[option.replace("-", "_")] = positive_seconds(name, opts, option)
        return probes

    def configure_memory_watchdog(self, buildout, name, options):
        """The memory watchdog's filter settings (plonedeploy.runtime.watchdog) from
        ``memory-limit``, ``host-memory``, ``memory-limit-grace``, ``memory-limit-restarts``
        and ``memory-limit-peers``: ``{"memory_limit": bytes or "off", ...}``. The default
        limit is ``rules.default_memory_limit`` (docs/tuning.md). Without ``metrics-address``
        there is no watchdog (it runs in the metrics filter): ``memory_limit`` is "off".
        Raises ``zc.buildout.UserError`` naming the option and its allowed values."""
        opts = DeclaredOptions(name, options, INSTANCE)
        grace, _ = positive_seconds(name, opts, "memory-limit-grace")
        restarts = opts.setdefault("memory-limit-restarts").strip()
        if not restarts.isdigit():
            fail(name, "memory-limit-restarts", restarts, "a whole number >= 0 (recycles per hour)")
        peers = []
        for peer in opts.setdefault("memory-limit-peers").split():
            peer_host, peer_port = parse_http_address(name, peer, "memory-limit-peers")
            peers.append(f"{peer_host}:{peer_port}")
        if self.metrics_address and self.metrics_address in peers:
            fail(name, "memory-limit-peers", opts["memory-limit-peers"],
                 f"the other clients' metrics addresses, not this client's own ({self.metrics_address})")
        limit = opts.get("memory-limit", "").strip()
        if limit.lower() == "off":
            limit = "off"
        elif limit:
            limit = parse_byte_size(name, "memory-limit", limit)
        else:
            host_memory = opts.get("host-memory", "").strip()
            host_memory = (parse_byte_size(name, "host-memory", host_memory) if host_memory
                           else mem_total())
            limit, reason = default_memory_limit(host_memory, clients_per_host(buildout, name, opts))
            if self.metrics_address:
                logger.info("[%s] memory-limit -> %s MiB: %s", name, limit // 1048576, reason)
        options["memory-limit"] = str(limit)
        options["memory-limit-grace"], options["memory-limit-restarts"] = grace, restarts
        options["memory-limit-peers"] = " ".join(peers)
        home = options.get("client-home") or os.path.join(
            options.get("var") or os.path.join(buildout["buildout"]["directory"], "var"), name)
        return {"memory_limit": limit if self.metrics_address else "off", "memory_limit_grace": grace,
                "memory_limit_restarts": restarts, "memory_limit_peers": " ".join(peers),
                "memory_state_file": os.path.join(home, "memory-recycles"),
                "check_window": recycle_check_window()}

    def configure_mod_wsgi(self, buildout, name, options):
        """``mod-wsgi-express`` (must exist) and ``run-as``; the part's own Chameleon cache.

        The daemon runs as ``run-as`` when the client is started as root and cannot write the
        shared ``var/cache`` (root's, files 0600): unless the part sets ``template-cache`` or
        ``CHAMELEON_CACHE`` itself, its cache is ``var/<part>/chameleon``, which the runner
        gives to that user.
        """
        opts = DeclaredOptions(name, options, INSTANCE)
        express = opts.setdefault("mod-wsgi-express").strip()
        if not os.path.isabs(express):
            fail(name, "mod-wsgi-express", express, f"an absolute path such as {MOD_WSGI_EXPRESS}")
        if not os.access(express, os.X_OK):
            fail(name, "mod-wsgi-express", express,
                 f"an existing program: mod_wsgi compiled against the system Python, which "
                 f"scripts/install-system.sh (make system) installs as {MOD_WSGI_EXPRESS}")
        run_as = opts.setdefault("run-as").strip()
        if not run_as:
            fail(name, "run-as", run_as, "a system user such as www-data")
        var = os.path.join(buildout["buildout"]["directory"], "var")
        writable = []
        if "CHAMELEON_CACHE" not in options.get("environment-vars", ""):
            cache = options.get("template-cache", "").strip()
            if cache.lower() in ("", "on", "1", "true", "enabled"):
                cache = os.path.join(var, name, "chameleon")
                options["template-cache"] = cache
            if cache.lower() not in ("off", "0", "false", "disabled"):
                writable.append(cache)
        self.mod_wsgi = {"mod_wsgi_express": express, "run_as": run_as,
                         # + the port (mod_wsgi_context)
                         "server_root": os.path.join(var, name, "mod_wsgi-"),
                         "writable": " ".join(writable),
                         # Apache's LimitRequestBody: the client's own body cap
                         "limit_request_body": options["max-request-body-size"]}

    def configure_conflict_retries(self, name, options):
        """Append ``max-conflict-retries <n>`` (option ``max-conflict-retries``, one of
        ``rules.CONFLICT_RETRIES``) to ``zope-conf-additional``, which the stock recipe puts
        at the end of zope.conf. Raises ``zc.buildout.UserError`` for a value outside them,
        or when ``zope-conf-additional`` sets the key itself (zope.conf would have it twice)."""
        opts = DeclaredOptions(name, options, INSTANCE)
        retries = check_choice(name, "max-conflict-retries", opts.setdefault("max-conflict-retries").strip(),
                               CONFLICT_RETRIES)
        options["max-conflict-retries"] = retries
        additional = opts.get("zope-conf-additional", "")
        if any(line.split()[:1] == ["max-conflict-retries"] for line in additional.splitlines()):
            raise zc.buildout.UserError(
                f"[{name}] zope-conf-additional sets max-conflict-retries; remove it there and set "
                f"the part's option max-conflict-retries (one of: {', '.join(CONFLICT_RETRIES)})")
        options["zope-conf-additional"] = f"{additional.rstrip()}\nmax-conflict-retries {retries}".lstrip("\n")

    def configure_storage(self, buildout, name, options):
        """Check ``storage`` and the ``relstorage-*`` options; return the storage.

        With ``relstorage``, sets the stock recipe's ``rel-storage`` (``options.relstorage_lines``)
        and turns ``zeo-client`` off, which the stock recipe requires (it refuses both).
        Raises ``zc.buildout.UserError`` naming the option and the allowed values.
        """
        opts = DeclaredOptions(name, options, INSTANCE)
        storage = check_choice(name, "storage", opts.setdefault("storage").strip(), STORAGES)
        options["storage"] = storage
        if storage != "relstorage":
            return storage
        if opts.get("rel-storage", "").strip():
            raise zc.buildout.UserError(
                f"[{name}] rel-storage is written by plonedeploy.recipe from storage = relstorage, "
                "relstorage-dsn, relstorage-blobs and relstorage-blob-dir; remove it")
        if not opts.get("relstorage-dsn", "").strip():
            raise zc.buildout.UserError(
                f"[{name}] relstorage-dsn is required with storage = relstorage: a libpq DSN such as "
                "'host=127.0.0.1 port=5432 dbname=plone user=plone passfile=/path/pgpass'")
        parse_dsn(name, "relstorage-dsn", opts["relstorage-dsn"])
        dsn = " ".join(opts["relstorage-dsn"].split("\n")).strip()
        blobs = check_choice(name, "relstorage-blobs",
                             opts.setdefault("relstorage-blobs").strip(),
                             tuple(RELSTORAGE_BLOBS))
        var = os.path.join(buildout["buildout"]["directory"], "var")
        default_dir = (os.path.join(var, "blobcache", name) if blobs == "database"
                       else os.path.join(var, "relstorage-blobs"))
        blob_dir = opts.get("relstorage-blob-dir", "").strip() or default_dir
        if not os.path.isabs(blob_dir):
            fail(name, "relstorage-blob-dir", blob_dir, "an absolute path")
        options["relstorage-blobs"] = blobs
        options["relstorage-blob-dir"] = blob_dir
        options["rel-storage"] = relstorage_lines(dsn, blobs, blob_dir)
        options["zeo-client"] = "off"
        return storage

    def auto_threads(self, buildout, name, options):
        """Resolve ``threads = auto`` (``rules.auto_threads``); log the choice; return it as text."""
        opts = DeclaredOptions(name, options, INSTANCE)
        cores = opts.get("cpu-cores", "").strip()
        cores = (parse_positive_int(name, cores, "cpu-cores") if cores
                 else len(os.sched_getaffinity(0)))
        threads, reason = auto_threads(self.server, cores, clients_per_host(buildout, name, opts))
        logger.info("[%s] threads = auto -> %s: %s", name, threads, reason)
        return str(threads)

    def install(self, update=False):
        if self.opts.get("user"):
            return super().install(update)
        # The stock recipe asks for an initial user on stdin when none is given, which
        # hangs or fails unattended; the admin user is made by scripts/create_site.py.
        ask = make.get_inituser
        make.get_inituser = lambda: (None, None)
        try:
            return super().install(update)
        finally:
            make.get_inituser = ask

    def update(self):
        return self.install(update=True)

    def context(self):
        """The Jinja2 variables of the server templates."""
        return {
            "part": self.name,
            "server": self.server,
            "host": self.host,
            "port": self.port,
            "http_address": f"{self.host}:{self.port}",
            "threads": self.threads,
            "blob_sendfile": self.blob_sendfile,
            "metrics_address": self.metrics_address,
            **self.probes,
            "hello_app": False,
            **self.mod_wsgi_context(self.port),
        }

    def mod_wsgi_context(self, port):
        """The mod_wsgi template's variables (none for the other servers); the server root
        is per port, so that etc/hello.ini's server does not share wsgi.ini's."""
        if self.server != "mod_wsgi":
            return {}
        return {**self.mod_wsgi, "server_root": f"{self.mod_wsgi['server_root']}{port}"}

    def hello_context(self):
        """:meth:`context` for ``etc/hello.ini``: the hello address, the hello app, no filters."""
        host, port = self.hello_address
        return {**self.context(), **self.mod_wsgi_context(port),
                "host": host, "port": port, "http_address": f"{host}:{port}",
                "blob_sendfile": False, "metrics_address": None, "hello_app": True}

    def build_wsgi_ini(self):
        etc = os.path.dirname(self.options["wsgi-ini-template"])
        os.makedirs(etc, exist_ok=True)
        if self.hello_address:
            # Both stages as for wsgi.ini (waitress's section has stage-2 values too), but the
            # stock code writes only etc/wsgi.ini: the hello text goes through it first and is
            # moved to hello.ini before the client's own wsgi.ini is written.
            self.write_stage_one(self.hello_context())
            super().build_wsgi_ini()
            os.replace(os.path.join(etc, "wsgi.ini"), os.path.join(etc, "hello.ini"))
        else:
            try:
                os.remove(os.path.join(etc, "hello.ini"))  # hello-address removed since the last build
            except FileNotFoundError:
                pass
        self.write_stage_one(self.context())
        super().build_wsgi_ini()
        logger.info(
            "%s: %s on %s:%s, %s threads, ZODB pool-size %s, blob-sendfile %s, metrics %s",
            self.name, self.server, self.host, self.port, self.threads, self.threads,
            self.options["blob-sendfile"], self.metrics_address or "off",
        )

    def write_stage_one(self, context):
        """Render the server template with ``context`` into ``wsgi-ini-template`` (stage 1),
        which the stock recipe's build_wsgi_ini reads and %-formats (stage 2)."""
        with open(self.options["wsgi-ini-template"], "w", encoding="utf-8") as fp:
            fp.write(render_template(self.template, context))

    def build_zope_conf(self):
        super().build_zope_conf()
        if self.opts.get("zope-conf"):
            logger.warning(
                "%s: zope-conf is the operator's own file; set 'pool-size %s' in its "
                "<zodb_db main> yourself", self.name, self.threads,
            )
            return
        path = os.path.join(self.options["location"], "etc", "zope.conf")
        with open(path, encoding="utf-8") as fp:
            text = fp.read()
        try:
            text = insert_pool_size(text, self.threads)
        except ValueError as exc:
            raise zc.buildout.UserError(f"[{self.name}] cannot set pool-size: {exc}")
        with open(path, "w", encoding="utf-8") as fp:
            fp.write(text)
