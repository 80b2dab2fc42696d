"""``plonedeploy.recipe:instance`` -- a ZEO client served by one of several WSGI servers.

A thin layer over ``plone.recipe.zope2instance``: every option it does not read passes
through to it unchanged (``zeo-client``, ``zeo-address``, ``blob-storage``,
``zodb-cache-size``, ``event-log``, ...).

Options read here: ``optiontables.INSTANCE`` (name, default, allowed values, one line
each; docs/reference/recipe.md's table is generated from it). The reasons behind them:

- ``threads`` is also the ZODB ``pool-size`` written into ``<zodb_db main>`` of
  ``etc/zope.conf``: each concurrent request holds one ZODB connection with its own object
  cache of ``zodb-cache-size`` objects (memory ~ threads x zodb-cache-size x object size).
  ``auto`` is ``rules.auto_threads`` (docs/how-to/tuning.md); ``zodb-cache-memory`` is divided by
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
  hold a password because zope.conf is world-readable (``options.parse_dsn``). The
  ``relstorage-cache-local-mb``, ``relstorage-cache-local-dir`` and ``relstorage-blob-cache-size``
  options become RelStorage's own keys (``clientoptions.relstorage_tuning``), unset by default.
- ``transaction-mode = explicit`` (``clientoptions.transaction_mode``): the ``explicittx``
  filter (plonedeploy.runtime.explicittx) last before the Zope app in the pipeline, so each
  request's thread uses the transaction package's explicit mode: one storage poll per
  request instead of three (docs/how-to/relstorage.md#tuning).
- The ``astlock`` filter (plonedeploy.runtime.astlock), no option: put in the pipeline when the
  Python that runs buildout, and so the server, is older than 3.12, whose AST constructor
  breaks when two threads parse at once (a page template's first compile could fail with
  ``SystemError`` in a multi-threaded server).
- ``added-delay`` (``clientoptions.added_delay``): a testing aid, never in a default: the
  ``delay`` filter (plonedeploy.runtime.delay) before the Zope app makes page requests that
  many ms slower, so the canary's tests and benchmark can build a release known to be slower
  (docs/explanation/canary.md). 0, the default, renders no filter.
- ``memory-limit`` (with ``metrics-address``; ``clientoptions.memory_watchdog``): the memory
  watchdog in the metrics filter (plonedeploy.runtime.watchdog); its default is
  ``rules.default_memory_limit`` over ``host-memory`` and ``clients-per-host``
  (docs/how-to/tuning.md#memory-limit); recycles are recorded in ``<client home>/memory-recycles``
  for the backoff (docs/how-to/operate.md#memory-watchdog).

- ``wsgi-server = mod_wsgi`` (``clientoptions.mod_wsgi``): ``mod-wsgi-express`` must exist at
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
- ``malloc`` and ``malloc-arena-max`` (``clientoptions.malloc_environment``): the allocator
  is chosen when a process starts (the dynamic loader reads ``LD_PRELOAD``, glibc its
  tunables before ``main``), so ``bin/<part>`` puts the variables into its own environment,
  which the ctl script hands to the server process it execs (``console``) or starts (``fg``,
  ``start``); Zope's ``environment-vars`` would come too late and are refused for them.
  jemalloc's library must exist at build time (Debian's libjemalloc2).
- ``hello-address`` writes ``etc/hello.ini`` beside ``etc/wsgi.ini``: the same template with
  ``hello_app`` true, so the hello-world app is served by exactly the server section the
  client has (same keys, same stage 2), on another address; the benchmark matrix compares
  the two (loadtests/matrix/matrix_servers.py).

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
import sys

import zc.buildout
from plone.recipe.zope2instance import make
from plone.recipe.zope2instance.recipe import Recipe as Zope2InstanceRecipe

from plonedeploy.recipe import clientoptions
from plonedeploy.recipe.edge import default_body_cap
from plonedeploy.recipe.optiontables import INSTANCE, DeclaredOptions
from plonedeploy.recipe.service import check_service_user, client_layout
from plonedeploy.recipe.options import (
    AST_LOCK_FILTER,
    BLOB_FILTER,
    DELAY_FILTER,
    EXPLICIT_TX_FILTER,
    HELLO_APP,
    METRICS_EGG,
    METRICS_FILTER,
    RELSTORAGE_EGGS,
    RUNTIME_EGG,
    SERVERS,
    add_pipeline_filter,
    check_choice,
    fail,
    insert_pipeline_filter_after,
    insert_pipeline_filter_before_app,
    insert_pool_size,
    parse_byte_size,
    parse_http_address,
    parse_positive_int,
    parse_switch,
    parse_threads,
    render_template,
    template_option,
)

logger = logging.getLogger("plonedeploy.recipe")

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
            threads = clientoptions.resolve_auto_threads(buildout, name, options, self.server)
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
            self.mod_wsgi = clientoptions.mod_wsgi(buildout, name, options)
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
        self.probes = clientoptions.probes(name, opts, options)
        self.probes.update(clientoptions.memory_watchdog(buildout, name, options, self.metrics_address))
        self.hello_address = None
        if opts.get("hello-address", "").strip():
            hello = parse_http_address(name, opts["hello-address"], "hello-address")
            if hello == (self.host, self.port):
                fail(name, "hello-address", opts["hello-address"],
                     f"a host:port other than http-address = {options['http-address'].strip()}")
            self.hello_address = hello
            options["hello-address"] = f"{hello[0]}:{hello[1]}"

        self.storage = clientoptions.storage_options(buildout, name, options)
        clientoptions.conflict_retries(name, options)
        self.explicit_tx = clientoptions.transaction_mode(name, options, self.storage)
        if not self.explicit_tx and EXPLICIT_TX_FILTER in opts.get("pipeline", "").split():
            raise zc.buildout.UserError(
                f"[{name}] pipeline names {EXPLICIT_TX_FILTER} but transaction-mode = implicit; "
                f"remove it from pipeline or set transaction-mode = explicit")
        self.added_delay = clientoptions.added_delay(name, options)
        if not self.added_delay and DELAY_FILTER in opts.get("pipeline", "").split():
            raise zc.buildout.UserError(
                f"[{name}] pipeline names {DELAY_FILTER} but added-delay = 0; "
                f"remove it from pipeline or set added-delay = <milliseconds>")

        # CPython before 3.12 breaks when two threads parse at once (plonedeploy.runtime.astlock);
        # the part's server runs on the Python that runs buildout.
        self.ast_lock = sys.version_info < (3, 12)

        if "wsgi-ini-template" in opts:
            raise zc.buildout.UserError(
                f"[{name}] wsgi-ini-template is set by plonedeploy.recipe from "
                "templates-directory/<wsgi-server>.ini.in; remove it and edit that template"
            )
        self.template = template_option(name, opts, "templates-directory", f"{self.server}.ini.in")

        # Each filter the options put into the pipeline needs its section in the template:
        # (needed, filter, why, what to do), checked on one rendering.
        required = [
            (self.blob_sendfile, BLOB_FILTER, "blob-sendfile = on", "add it or set blob-sendfile = off"),
            (self.metrics_address, METRICS_FILTER, "metrics-address is set", "add it or remove metrics-address"),
            (self.explicit_tx, EXPLICIT_TX_FILTER, "transaction-mode = explicit",
             "add it or set transaction-mode = implicit"),
            (self.added_delay, DELAY_FILTER, "added-delay is set", "add it or set added-delay = 0"),
            (self.ast_lock, AST_LOCK_FILTER,
             f"Python {sys.version_info[0]}.{sys.version_info[1]} needs the {AST_LOCK_FILTER} filter", "add it"),
        ]
        if any(needed for needed, *_ in required):
            rendered = render_template(self.template, self.context())
            for needed, section, why, fix in required:
                if needed and f"[filter:{section}]" not in rendered:
                    raise zc.buildout.UserError(
                        f"[{name}] {why} but {self.template} defines no [filter:{section}] "
                        f"(see templates/_common.ini.in); {fix}")

        if self.hello_address and HELLO_APP not in render_template(self.template, self.hello_context()):
            raise zc.buildout.UserError(
                f"[{name}] hello-address is set but {self.template} renders no {HELLO_APP} app when "
                "hello_app is true (see templates/_common.ini.in); add it or remove hello-address"
            )

        # malloc, malloc-arena-max: {variable: value} the server process starts with
        self.malloc_environment = clientoptions.malloc_environment(name, options)
        for variable, value in self.malloc_environment.items():
            logger.info("[%s] malloc = %s: bin/%s starts the server with %s=%s",
                        name, options["malloc"], name, variable, value)

        self.service_user = opts.setdefault("service-user").strip()
        options["service-user"] = self.service_user
        if self.service_user:
            check_service_user(name, self.service_user)

        eggs = opts.get("eggs", "").split()
        eggs += [egg for egg in SERVERS[self.server] if egg not in eggs]
        # egg:plonedeploy.runtime#blobsendfile, #hello; plonedeploy.runtime.access.become
        if (self.blob_sendfile or self.hello_address or self.service_user or self.explicit_tx
                or self.added_delay or self.ast_lock) and RUNTIME_EGG not in eggs:
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
        if self.malloc_environment:
            # Likewise after the stock __init__; only os.environ, which the ctl script hands to
            # the server process it execs or starts (the allocator is chosen when a process starts).
            options["initialization"] = (clientoptions.malloc_initialization(self.malloc_environment)
                                         + options["initialization"])
        # After the stock __init__, which sets the default pipeline.
        if self.ast_lock:
            # First inserted, so the filters below still end up in their places; it only
            # patches the process when the pipeline is loaded, its place does not matter.
            options["pipeline"] = insert_pipeline_filter_before_app(opts["pipeline"], AST_LOCK_FILTER)
        if self.blob_sendfile:
            options["pipeline"] = add_pipeline_filter(opts["pipeline"])
        if self.metrics_address:
            # After blobsendfile, which must stay outermost; the metrics filter never wraps
            # the response body, so anything it sees is still the application's own.
            options["pipeline"] = insert_pipeline_filter_after(opts["pipeline"], METRICS_FILTER, BLOB_FILTER)
        if self.added_delay:
            # Before the app, inside the metrics filter: its latency sees the delay as slower code's.
            options["pipeline"] = insert_pipeline_filter_before_app(opts["pipeline"], DELAY_FILTER)
        if self.explicit_tx:
            # Innermost, so that nothing runs in the request's thread between it and Zope.
            options["pipeline"] = insert_pipeline_filter_before_app(opts["pipeline"], EXPLICIT_TX_FILTER)

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
            "explicit_tx": self.explicit_tx,
            "ast_lock": self.ast_lock,
            "added_delay": self.added_delay,
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
                "blob_sendfile": False, "metrics_address": None, "explicit_tx": False, "added_delay": 0,
                "hello_app": True}

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
