"""The options each plonedeploy recipe reads: name, default, allowed values, one line of doc.

One table per recipe (``TABLES``, keyed by entry point), the single source of the option
reference: the recipes read their part's options only through :class:`DeclaredOptions`
over their table (an undeclared name raises :class:`UndeclaredOption`, so a new option
cannot be read without being declared), ``scripts/gen_reference.py`` writes
docs/reference/recipe.md's option tables from them (rendered by
``plonedeploy.recipe.optionsdoc``; ``tests/test_options.py`` fails when the committed page
differs), and ``tests/test_ansible.py`` compares the Ansible roles'
defaults and choices with them.

The tables live here rather than in each recipe module so that they import without
plone.recipe.zope2instance (which ``instance.py`` subclasses): the doc generator and the
tests run in the project's ``.venv``, which has no Zope eggs. The varnish, postgresql and
relstorage-tools modules take their ``DEFAULT_*`` constants from these tables.
"""
from typing import NamedTuple, Tuple, Union

from plonedeploy.recipe import edge, tls
from plonedeploy.runtime.delay import MAX_DELAY_MS
from plonedeploy.stack import rules, storage
from plonedeploy.recipe.options import (
    BALANCE_ALGORITHMS, DEFAULT_RELSTORAGE_BLOBS, DEFAULT_STORAGE, RELSTORAGE_BLOBS, STORAGES,
    SWITCH_VALUES, TRANSACTION_MODES)


class Option(NamedTuple):
    """One option a recipe reads.

    ``default``: the text used when the part does not set the option (``""``: empty),
    or None when the recipe computes it or the option is required; ``shown_default`` then
    says which (Markdown, for the reference). ``allowed``: a tuple of the exact values
    allowed, or a description (Markdown). ``doc``: one line of Markdown.
    """
    name: str
    default: Union[str, None]
    allowed: Union[Tuple[str, ...], str]
    doc: str
    shown_default: str = ""


class UndeclaredOption(KeyError):
    """A recipe read an option its table does not declare (a bug in the recipe)."""


class DeclaredOptions:
    """A part's options as its recipe reads them: only the names in ``table``.

    ``options``: the zc.buildout options of part ``part`` (any mapping); ``table``: a
    tuple of :class:`Option`. Reads (``[]``, ``get``, ``in``, ``setdefault``) of a name not
    in ``table`` raise :class:`UndeclaredOption`; writes go to ``options`` directly (the
    recipe's outputs for other parts, its resolved values).
    """

    def __init__(self, part, options, table):
        self.part, self.options = part, options
        self.table = {option.name: option for option in table}

    def declared(self, key):
        """The :class:`Option` ``key``; raises :class:`UndeclaredOption` if there is none."""
        if key not in self.table:
            raise UndeclaredOption(
                f"[{self.part}] option {key!r} is read but not declared in its recipe's table "
                "(plonedeploy/recipe/optiontables.py)")
        return self.table[key]

    def __contains__(self, key):
        self.declared(key)
        return key in self.options

    def __getitem__(self, key):
        self.declared(key)
        return self.options[key]

    def get(self, key, default=None):
        """The option's text, or ``default`` when the part does not set it."""
        self.declared(key)
        return self.options.get(key, default)

    def __setitem__(self, key, value):
        """Store the resolved value of the declared option ``key`` (zc.buildout records it)."""
        self.declared(key)
        self.options[key] = value

    def setdefault(self, key, default=None):
        """The option's text; when unset, ``default`` (else the declared default) is stored
        in the part's options first, so zc.buildout records it (a changed default then
        updates the part) and other parts read the resolved value."""
        option = self.declared(key)
        if default is None:
            default = option.default
        if default is None:
            raise ValueError(f"option {key!r} has no declared default: pass one")
        return self.options.setdefault(key, default)


def default_of(table, name):
    """The declared default (text) of option ``name`` in ``table``; KeyError if undeclared."""
    return next(option.default for option in table if option.name == name)


_HOST_PORT = "one `host:port`"
_BYTES = "a positive number of bytes"
_SECONDS = "a positive number of seconds"
_POSITIVE = "a positive integer"
_NETWORKS = "IPv4/IPv6 networks (CIDR or address), whitespace-separated"
_PARTS = "part names, whitespace-separated"
_SWITCH = tuple(SWITCH_VALUES)
_STOCK = "plone.recipe.zope2instance's option, passed on; "

#: ``plonedeploy.recipe:instance`` (instance.py): a ZEO client. Every option not listed
#: passes through to plone.recipe.zope2instance unread.
INSTANCE = (
    Option("wsgi-server", rules.DEFAULT_SERVER, tuple(rules.SERVERS),
           "the WSGI server ([reference/servers.md](servers.md)); adds its eggs to `eggs` and renders "
           "`etc/wsgi.ini` from `<templates-directory>/<server>.ini.in`"),
    Option("http-address", None, _HOST_PORT + " (a bare port is taken by pyruvate as a Unix socket path)",
           "where the server listens (pyruvate `socket`, waitress `listen`, the others `host` and `port`)",
           "required"),
    Option("threads", None, _POSITIVE + ", or `auto`; only `1` for bjoern and gevent",
           "the server's concurrency (pyruvate `workers`, waitress/cheroot/uWSGI/gunicorn-gthread "
           "`threads`, granian `blocking_threads`) **and** ZODB `pool-size` in `<zodb_db main>` of "
           "`etc/zope.conf`; `auto`: chosen from `cpu-cores` and `clients-per-host` by the rule in "
           "[how-to/tuning.md](../how-to/tuning.md), logged as `[part] threads = auto -> 2: <reason>`",
           f"`{rules.DEFAULT_THREADS}`; `1` for {' and '.join(rules.SINGLE_THREADED)}"),
    Option("mod-wsgi-express", rules.MOD_WSGI_EXPRESS, "an absolute path",
           "only with `wsgi-server = mod_wsgi`: the `mod_wsgi-express` program (mod_wsgi compiled "
           "against the system Python, in a venv `scripts/install-system.sh` makes); the build "
           "fails when it does not exist"),
    Option("run-as", rules.MOD_WSGI_RUN_AS, "a system user",
           "only with `wsgi-server = mod_wsgi`: who runs Apache and the mod_wsgi daemon when "
           "`bin/<part>` runs as root (Apache refuses root); it is given the part's server root "
           "(`var/<part>/mod_wsgi-<port>`), log files and Chameleon cache (`var/<part>/chameleon`)"),
    Option("service-user", "", "an existing system user other than root",
           "who `bin/<part>` (every command: `console`, `fg`, `run`, `debug`) runs as when root "
           "starts it: it first gives that user the client's home, caches, blob directory and logs "
           "and search permission on the way to the build, then drops to it; the stack part requires "
           "its own `service-user` here (buildout.cfg sets both from `[service] user`, "
           "[how-to/operate.md, Users](../how-to/operate.md#users))", "empty (runs as whoever starts it)"),
    Option("cpu-cores", None, _POSITIVE,
           "only with `threads = auto`: cores of the host that runs the clients",
           "CPUs `bin/buildout` may run on"),
    Option("clients-per-host", None, _POSITIVE,
           "with `threads = auto` and for the default `memory-limit`: ZEO clients on that host",
           "`plonedeploy.recipe:instance` parts in `parts`"),
    Option("zodb-cache-memory", "", "bytes such as `512MB`, `1GB`, `65536` (KB/MB/GB: powers of 1024)",
           "memory budget of the client's ZODB object caches together: sets `zodb-cache-size-bytes` "
           "= budget / threads (one connection cache per thread); ZODB counts pickle sizes, so RSS "
           "grows by more ([how-to/tuning.md](../how-to/tuning.md))", "unset"),
    Option("zodb-cache-size-bytes", "", "bytes",
           _STOCK + "read here only to refuse it together with `zodb-cache-memory`", "unset"),
    Option("blob-sendfile", "on", _SWITCH,
           "the `blobsendfile` WSGI filter first in the pipeline (whole-file blob downloads reach "
           "the server's `wsgi.file_wrapper` as a real file), see below"),
    Option("pipeline", None, "PasteDeploy filter names",
           _STOCK + "`blobsendfile` is put first and `metrics` after it unless it names them; "
           "naming one whose option is off is an error", "plone.recipe.zope2instance's"),
    Option("metrics-address", "", _HOST_PORT + ", not `http-address`, one per client",
           "the client's Prometheus metrics (`/metrics`): the WSGI filter `metrics` "
           "(`plonedeploy.runtime.metrics`) and prometheus-client's HTTP server in a thread of the "
           "client; adds `prometheus-client` to `eggs`. A part made with `<= instance` inherits it: "
           "set it per client ([how-to/operate.md, Metrics](../how-to/operate.md#metrics))",
           "unset (buildout.cfg: `127.0.0.1:8071`, `:8072`, `:8073`)"),
    Option("warmup-paths", "/Plone /Plone/++api++ /Plone/@@search",
           "URL paths starting with `/`, separated by white space, or `off`",
           "with `metrics-address`: rendered once each in the client's process (the page, its JSON, "
           "the search page) before `/readyz` says ready, so that HAProxy sends no visitor to empty "
           "caches and uncompiled templates ([how-to/operate.md, Probes](../how-to/operate.md#probes))"),
    Option("stall-timeout", "60", "seconds > 0",
           "with `metrics-address`: `/readyz` says not ready while every thread has held its request "
           "longer than this (a client whose threads are all stuck), so HAProxy takes it out"),
    Option("storage-grace", "30", "seconds > 0",
           "with `metrics-address`: `/readyz` says not ready once the ZEO connection has been down "
           "this long; a shorter ZEO restart takes no client out of the pool"),
    Option("memory-limit", None, "bytes such as `1GB`, `900MB`, `65536` (KB/MB/GB: powers of 1024), or `off`",
           "with `metrics-address`: the memory watchdog recycles the client (drained through `/readyz`, "
           "then SIGTERM to itself; supervisord starts it again) once its RSS has stayed above this for "
           "`memory-limit-grace` ([how-to/operate.md, Memory watchdog](../how-to/operate.md#memory-watchdog))",
           "the rule of [how-to/tuning.md](../how-to/tuning.md#memory-limit): 75 % of `host-memory` beyond 1 GiB, "
           "split over `clients-per-host`, at least 512 MiB"),
    Option("host-memory", None, "bytes such as `16GB`",
           "for the default `memory-limit`: RAM of the host that runs the clients",
           "`MemTotal` of the host `bin/buildout` runs on"),
    Option("memory-limit-grace", rules.MEMORY_LIMIT_GRACE, "seconds > 0",
           "seconds RSS must stay above `memory-limit` without a break before the client is recycled"),
    Option("memory-limit-restarts", rules.MEMORY_LIMIT_RESTARTS, "a whole number >= 0",
           "at most this many recycles per hour; then the client serves on, logs it and sets "
           "`plonedeploy_memory_recycle_blocked{reason=\"backoff\"}` (the alert); `0`: only that"),
    Option("memory-limit-peers", "",
           "`host:port` values separated by white space, not this client's own `metrics-address`",
           "the metrics addresses of the other clients of the same HAProxy backend: the watchdog recycles "
           "only while every one of them answers `/readyz` 200 (never the last one, one at a time); "
           "empty: it never recycles, only logs and sets `reason=\"no_peer\"`", "empty"),
    Option("malloc", rules.DEFAULT_MALLOC, rules.MALLOCS,
           "the memory allocator of the client's process: glibc's own, or jemalloc (Debian's "
           f"`{rules.JEMALLOC_PACKAGE}`, which `make system` and the Ansible role install): `bin/<part>` "
           "puts it into `LD_PRELOAD` of the server process it starts (`console`, `fg`, `start`); the "
           "library is looked up by the multiarch triplet, then `ldconfig -p`, and the build fails "
           "without it ([how-to/tuning.md, Allocator](../how-to/tuning.md#allocator))"),
    Option("malloc-arena-max", "", "a positive integer, or empty",
           "only with `malloc = system`: glibc's `MALLOC_ARENA_MAX` in the server process's environment "
           "(set by `bin/<part>` like `malloc`): fewer arenas hold less memory between requests, at the "
           "cost of threads contending for them", "empty (unset: glibc's 8 arenas per core)"),
    Option("hello-address", "", _HOST_PORT + ", not `http-address`",
           "also write `etc/hello.ini`: the same server with the same settings on this address, "
           "serving the hello-world app `egg:plonedeploy.runtime#hello` instead of Zope (run as "
           "`bin/interpreter -m plonedeploy.runtime.hello etc/hello.ini`; the benchmark matrix's "
           "`hello` path, [how-to/benchmarks.md](../how-to/benchmarks.md#benchmark-matrix)); "
           "adds `plonedeploy.runtime` to `eggs`",
           "unset"),
    Option("max-request-body-size", None, _BYTES,
           "the largest request body this client may receive: waitress spools bodies to disk and "
           "enforces it itself; the others hold a body in memory, so `[haproxy]` refuses a build in "
           "which a lane could send a client more (1 MiB is Zope's own `form-memory-limit`)",
           f"`{edge.SPOOLING_BODY_CAP}` ({', '.join(edge.SPOOLING_SERVERS)}); "
           f"`{edge.MEMORY_BODY_CAP}` (all others)"),
    Option("storage", DEFAULT_STORAGE, STORAGES,
           "`zeo`: plone.recipe.zope2instance's ZEO options apply; `relstorage`: a RelStorage "
           "client of PostgreSQL, `zeo-client` forced off, `RelStorage` and `psycopg2-binary` "
           "added to `eggs` ([how-to/relstorage.md](../how-to/relstorage.md))"),
    Option("relstorage-dsn", None, "libpq `key=value` pairs with `dbname`, without `password` (use `passfile`)",
           "the database of a `storage = relstorage` client (`${postgresql:dsn}`)",
           "required with `storage = relstorage`"),
    Option("relstorage-blobs", DEFAULT_RELSTORAGE_BLOBS, tuple(RELSTORAGE_BLOBS),
           "RelStorage's `shared-blob-dir` false (blobs in PostgreSQL, a cache per client) or "
           "true (blobs only in `relstorage-blob-dir`, which every client mounts)"),
    Option("relstorage-blob-dir", None, "an absolute path",
           "RelStorage's `blob-dir`",
           "`var/blobcache/<part>` (database); `var/relstorage-blobs` (shared-directory)"),
    Option("relstorage-cache-local-mb", "", "a whole number of MB >= 0, or empty",
           "RelStorage's `cache-local-mb`: the pickle cache each client process shares among its threads "
           "(0: none)", "empty (RelStorage's 10)"),
    Option("relstorage-cache-local-dir", "", "an absolute path, or empty",
           "RelStorage's `cache-local-dir`: the local pickle cache is saved there at shutdown and read "
           "at start (warm after a restart)", "empty (not saved)"),
    Option("relstorage-blob-cache-size", "", "a size such as 512MB, or empty; only with `relstorage-blobs = database`",
           "RelStorage's `blob-cache-size`: the client's blob cache is pruned above it", "empty (unbounded)"),
    Option("transaction-mode", None, TRANSACTION_MODES,
           "`explicit`: the `explicittx` WSGI filter puts each request's thread into the transaction "
           "package's explicit mode, so ZODB polls the storage once per request instead of three times "
           "(RelStorage: round trips to PostgreSQL; `/` at 1.31x implicit's req/s, the other paths level: "
           "[how-to/relstorage.md](../how-to/relstorage.md#tuning)); adds `plonedeploy.runtime` to `eggs`",
           "`explicit` with `storage = relstorage`, `implicit` with `zeo` (whose clients do not poll)"),
    Option("added-delay", "0", f"a whole number of milliseconds, 0 to {MAX_DELAY_MS}",
           "**a testing aid, never for a site with visitors**: the `delay` WSGI filter "
           "(plonedeploy.runtime.delay) right before the Zope app sleeps this long in every page "
           "request (the canary judge's class `page`); the canary's tests and benchmark build a "
           "slower release with it ([explanation/canary.md](../explanation/canary.md)); 0: no filter; "
           "else adds `plonedeploy.runtime` to `eggs`"),
    Option("rel-storage", "", "nothing",
           "plone.recipe.zope2instance's option, refused here: written from `storage = relstorage` "
           "and the `relstorage-*` options",
           "unset"),
    Option("max-conflict-retries", rules.DEFAULT_CONFLICT_RETRIES, rules.CONFLICT_RETRIES,
           "Zope's `max-conflict-retries` (written into `etc/zope.conf`): how often a request that "
           "hit a ZODB `ConflictError` is published again, after a random back-off of up to 1, 2, 4, "
           "... s in its worker thread; at most 6, whose back-offs (up to 63 s) stay within HAProxy's "
           "120 s `timeout server` ([how-to/tuning.md](../how-to/tuning.md#conflict-retries))"),
    Option("zope-conf-additional", "", "zope.conf lines",
           _STOCK + "`max-conflict-retries` is appended to it (setting that key here is refused)", "empty"),
    Option("environment-vars", "", "`NAME value` lines",
           _STOCK + "Zope sets them in its process once it reads zope.conf, too late for the "
           "allocator: `LD_PRELOAD` and `MALLOC_ARENA_MAX` are refused here (`malloc`, "
           "`malloc-arena-max` set them before the process starts)", "empty"),
    Option("templates-directory", None, "a directory with `<server>.ini.in`",
           "where the server templates are (a directory of your own to change them)",
           "the project's `templates/` (`plonedeploy.stack.templates.TEMPLATES_DIRECTORY`)"),
    Option("wsgi-ini-template", "", "nothing",
           "plone.recipe.zope2instance's option, refused here: written from `templates-directory`", "unset"),
    Option("eggs", "", "egg names",
           _STOCK + "the server's eggs (and `plonedeploy.recipe`, `prometheus-client`, RelStorage's) "
           "are added to it", "empty"),
    Option("zope-conf", "", "a path",
           _STOCK + "with an own zope.conf the recipe cannot add `pool-size` and logs so", "unset"),
    Option("user", "", "`name:password`",
           _STOCK + "without it no `inituser` is written (the stock recipe would prompt on stdin)",
           "unset"),
)

#: ``plonedeploy.recipe:haproxy`` (haproxy.py): the balancer config.
HAPROXY = (
    Option("backends", None, _PARTS + " of `plonedeploy.recipe:instance`",
           "the page pool; each client's `http-address`, `threads` (its `maxconn`) and "
           "`wsgi-server` are read from the part itself", "required"),
    Option("bind", "127.0.0.1:8080", _HOST_PORT, "the frontend"),
    Option("stats-bind", "127.0.0.1:8404", _HOST_PORT, "stats page `/stats`, CSV at `/stats;csv`, "
           "Prometheus at `/metrics`"),
    Option("balance", "leastconn", BALANCE_ALGORITHMS, "HAProxy's `balance` algorithm"),
    Option("health-check", rules.HEALTH_CHECK, "a path starting with `/`, without spaces",
           "HTTP check path: `/readyz`, `/livez` or `/startupz` are asked on each client's "
           "`metrics-address` (which every backend must then have), any other path on its "
           "`http-address` through a Zope thread, e.g. `/Plone/@@ok` (plain TCP probes make pyruvate "
           "log `Incomplete request`; [how-to/operate.md, Probes](../how-to/operate.md#probes))"),
    Option("timeout-queue", "60", _SECONDS, "how long a request may wait for a free server slot (then 503)"),
    Option("max-body-size", str(edge.SPOOLING_BODY_CAP), _BYTES,
           "largest request body: larger → 413 at once; chunked request bodies → 411. Checked with "
           "`upload-threshold` and every client's `max-request-body-size` (`edge.body_limit_errors`)"),
    Option("maxconn", "10000", _POSITIVE,
           "client connections the frontend holds, also its bind `backlog`; global `maxconn` is 16 "
           "more, for the stats page ([fair queueing](../explanation/edge.md#fair-queueing-under-overload))"),
    Option("fd-limit", "20000", "a positive integer, at least maxconn + 16 + the servers' maxconn + 64",
           "HAProxy's `ulimit-n`, at most the hard limit (`ulimit -Hn`, systemd `LimitNOFILE`) of "
           "whoever starts HAProxy; below HAProxy's own 2 × (maxconn + 16) + 64 the config adds "
           "`no strict-limits`"),
    Option("manage-networks", "", _NETWORKS,
           "networks allowed to reach Zope's `manage`/`manage_*` screens (by any path Zope decodes "
           "to one, or a `:method` form directive); others get 403; empty: the ZMI from no address "
           "(buildout.cfg: `127.0.0.1/32`). These networks and `per-source-exempt` also see the "
           "`Server`, `Via`, `X-Served-By`, `X-Cache` headers that visitors do not get", "empty"),
    Option("upload-backends", "", _PARTS + ", waitress clients",
           "the **upload lane** (backend `uploads`): bodies above `upload-threshold` or too large for "
           "HAProxy's buffer, and TUS requests (`/@tus-upload`); each needs `max-request-body-size` "
           "≥ `max-body-size` (buildout.cfg: `uploads`)", "empty"),
    Option("upload-threshold", str(edge.DEFAULT_UPLOAD_THRESHOLD), f"bytes, at most {edge.BUFFERABLE}",
           "the largest body the page pool receives, held whole by HAProxy before a server is "
           f"chosen (`tune.bufsize` {edge.HAPROXY_BUFSIZE} − `tune.maxrewrite` {edge.HAPROXY_MAXREWRITE})"),
    Option("upload-maxconn", "8", _POSITIVE,
           "uploads in transit at once per upload client (its `maxconn`; costs waitress a "
           "connection, not a thread)"),
    Option("write-lane", "on", _SWITCH,
           "the **write lane** (backend `writes`): POST, PUT, PATCH and DELETE not bound for the upload "
           "lane run one at a time across the pool, on the first `backends` client (the others are "
           "backups, used only while it is not UP); the rest wait in HAProxy's queue (`timeout-queue`). "
           "On by default because a lost save is worse than waiting: concurrent creations conflict "
           "on CMFUid's counter, which cannot resolve conflicts, and run out of retries "
           "([Write lane](../explanation/edge.md#write-lane)); reads keep every client and thread"),
    Option("server-names", None, "host names, IPv4 addresses or `[IPv6]`, without port",
           "the `Host` values the site answers to; another → 421, none → 400 "
           "(buildout.cfg: `127.0.0.1 localhost`)",
           "the host of `bind`; required when `bind` is `0.0.0.0`"),
    Option("per-source-connections", str(edge.DEFAULT_PER_SOURCE["connections"]), _POSITIVE,
           "concurrent connections per client address; the request on the next one → 429 with `Retry-After`"),
    Option("per-source-requests", str(edge.DEFAULT_PER_SOURCE["requests"]), _POSITIVE,
           "requests per `per-source-period` per client address; beyond → 429 with `Retry-After`"),
    Option("per-source-period", str(edge.DEFAULT_PER_SOURCE["period"]), _SECONDS,
           "the request-rate window, also the `Retry-After` value"),
    Option("per-source-exempt", "", _NETWORKS,
           "networks not limited per source (buildout.cfg: `127.0.0.1/32`, the kit's load tests)", "empty"),
    Option("tls-bind", "", _HOST_PORT + ", not `bind`",
           "the HTTPS listener of the same frontend: TLS 1.2+ (Mozilla \"intermediate\"), ALPN "
           "`h2,http/1.1`, HSTS; requests reach Zope through the VirtualHostMonster, so links are "
           "`https://` (buildout.cfg: `127.0.0.1:8443`)", "empty (no TLS)"),
    Option("tls-certificate", "", "a PEM file with certificate chain and key",
           "the build makes the self-signed one with `openssl` and renews it when the names change "
           "or < 30 days remain", "a self-signed one for `server-names` in `var/tls/<part>.pem` (0600)"),
    Option("tls-redirect", "on", _SWITCH,
           "with `tls-bind`: 301 from the plain `bind` to the same URL over https (buildout.cfg: "
           "`off`, load tests use the plain port)"),
    Option("tls-redirect-exempt", "", _NETWORKS,
           "with `tls-redirect`: networks whose plain requests are served, not redirected (remote "
           "A/B load generators, [how-to/ansible.md](../how-to/ansible.md#load-generators-on-other-hosts))", "empty"),
    Option("hsts-max-age", str(tls.DEFAULT_HSTS_MAX_AGE), "seconds, or `0` for no header",
           "`Strict-Transport-Security` on HTTPS answers"),
    Option("cache", "", "a `plonedeploy.recipe:varnish` part",
           "over TLS, GET and HEAD without a body go to it (backend `cache`) while HAProxy's check "
           "of it passes; HAProxy binds its `backend` as the `cache_fill` listener. Needs `tls-bind` "
           "(buildout.cfg: `varnish`, [Cache](../explanation/edge.md#cache))", "empty (no cache)"),
    Option("template", None, "a Jinja2 template", "the config template (the Ansible role renders it too)",
           "the project's `haproxy/haproxy.cfg.j2`"),
    Option("user", "", "an existing system user other than root",
           "who HAProxy runs as once it has bound its listeners and read the certificate (global "
           "`user`) when started as root; buildout.cfg sets `haproxy` (Debian's) with `[service] user`: "
           "a HAProxy taken over can then write nothing of the site's data, which the service user owns",
           "empty (no drop)"),
    Option("group", "", "an existing group other than root", "with `user`: HAProxy's group (global `group`)",
           "the user's own group"),
    Option("chroot", "auto", "`auto`, `none`, or with `user` an absolute path of an existing directory "
           "root owns and nobody else may write",
           "the empty directory HAProxy confines itself to once it has bound its listeners (global "
           "`chroot`): a HAProxy taken over sees no file of the host. `auto`: `parts/<name>/empty` "
           "(made empty by the recipe) with `user`, none without (as root, a chroot confines nothing)"),
    Option("haproxy", "", "a program", "the binary for `haproxy -c -f` and `bin/stack`",
           "`haproxy` on PATH, else `/usr/sbin/haproxy`"),
    Option("run-directory", None, "a directory", "where the admin socket `haproxy.sock` is "
           "(`bin/stack restart` drains clients through it)", "`${buildout:directory}/var/run`"),
)

#: ``plonedeploy.recipe:varnish`` (varnish.py): the cache tier.
VARNISH = (
    Option("bind", "127.0.0.1:6081", "`host:port` addresses, whitespace-separated",
           "where varnish listens; HAProxy sends visitors' requests to the first, the ZEO clients "
           "their PURGE requests to any"),
    Option("backend", "127.0.0.1:6088", _HOST_PORT + ", not one of `bind`",
           "HAProxy's cache-fill listener, through which varnish fetches misses from the pool"),
    Option("clients", None, _PARTS + " of `plonedeploy.recipe:instance`",
           "the ZEO clients whose hosts (`http-address`) may PURGE and BAN", "required"),
    Option("purge-networks", "", _NETWORKS, "further networks allowed to PURGE and BAN", "empty"),
    Option("cache-size", "256M", "a number with `K`, `M` or `G`", "memory for cached objects (`-s malloc,<size>`)"),
    # The cookies Plone itself reads (plone.recipe.varnish's "cookie-whitelist" and
    # plone.restapi's auth_token); all others are tracking cookies as far as the cache knows.
    Option("cookie-allowlist", "__ac _ZopeId __cp statusmessages auth_token I18N_LANGUAGE",
           "cookie names (letters, digits, `_`, `-`), whitespace-separated",
           "cookies kept on requests to Plone; every other one is dropped before the lookup, and a "
           "request still carrying one of these is passed"),
    Option("metrics-address", "", _HOST_PORT,
           "where Debian's `prometheus-varnish-exporter` serves varnish's counters (`bin/stack` "
           "starts it with varnish); keep it on a local or admin address", "empty (no exporter)"),
    Option("exporter", "prometheus-varnish-exporter", "a program",
           "the exporter binary, with `metrics-address`"),
    Option("template", None, "a Jinja2 template", "the VCL template (the Ansible role renders it too)",
           "`varnish.vcl.j2` of the project's `templates/`"),
    Option("jail", "none", ("unix", "none"),
           "varnishd's jail when `bin/stack` starts it as root: `unix` runs the manager as Debian's "
           "`varnish` and the cache process, which talks to clients, as `vcache` (`bin/stack start` "
           "gives both search permission on the way to the VCL and working directory), and the "
           "exporter of `metrics-address` as `varnishlog` (group `varnish`, which may read the "
           "shared memory); `none` keeps the user that starts it. `make build` as root sets `unix` "
           "with the service user"),
    Option("varnishd", "", "a program", "the binary for `varnishd -C` and `bin/stack`",
           "`varnishd` on PATH, else `/usr/sbin/varnishd`"),
)

#: ``plonedeploy.recipe:stack`` (stack.py): ``parts/<part>/stack.json`` and ``bin/<part>``.
STACK = (
    Option("zeoserver", "", "a plone.recipe.zeoserver part",
           "its `zeo-address` and `parts/<name>/bin/runzeo`; empty with `database`",
           "required without `database`"),
    Option("database", "", "a `plonedeploy.recipe:postgresql` part",
           "for `storage = relstorage` clients: its server starts in the ZEO server's place "
           "(relstorage.cfg)", "empty"),
    Option("clients", None, _PARTS + " of `plonedeploy.recipe:instance`",
           "the A/B pool, started one after the other as `bin/<part> console`", "required"),
    Option("upload-clients", "", _PARTS + " of `plonedeploy.recipe:instance`",
           "the upload lane's clients: started and restarted like the others, not in the A/B pool",
           "empty"),
    Option("haproxy", None, "a `plonedeploy.recipe:haproxy` part", "the balancer, started last", "required"),
    Option("cache", "", "a `plonedeploy.recipe:varnish` part",
           "started after the clients and before HAProxy", "empty"),
    Option("eggs", "plonedeploy.recipe", "egg names",
           "zc.recipe.egg's: the eggs `bin/<part>` runs with; `supervisor` (its supervisord) is always added"),
    Option("service-user", "", "an existing system user other than root",
           "who runs the ZEO server and the ZEO clients when `bin/<part>` runs as root (supervisord's "
           "`user=`): it owns what they write in `var/` (data, blobs, their logs, caches, pid files) and "
           "nothing of the build; `bin/<part> start` gives it search permission (POSIX ACL) on the "
           "directories on the way to the build it cannot enter. Empty: they run as whoever runs "
           "`bin/<part>` (as root with a warning). Every client part's `service-user` must be the "
           "same (buildout.cfg sets both from `[service] user`; `make build` as root sets `plonedeploy` "
           "and creates the user, [how-to/operate.md, Users](../how-to/operate.md#users))", "empty"),
)

#: ``plonedeploy.recipe:postgresql`` (postgresql.py): the buildout stack's database.
POSTGRESQL = (
    Option("address", None, "a loopback `host:port`", "where the server listens (TCP, this host only)",
           "required"),
    Option("database", "plone", "a lower-case identifier (`[a-z_][a-z0-9_]*`)", "the site's database"),
    Option("user", "plone", "a lower-case identifier (`[a-z_][a-z0-9_]*`)",
           "the role that owns the database and that the clients log in as"),
    Option("bin-directory", "/usr/lib/postgresql/15/bin", "a directory",
           "where `initdb`, `postgres` and `pg_isready` are (checked at install)"),
    Option("run-as", "postgres", "a system user",
           "who runs `initdb` and `postgres` when `bin/<part>` runs as root (PostgreSQL refuses root)"),
    Option("eggs", "plonedeploy.recipe", "egg names", "zc.recipe.egg's: the eggs `bin/<part>` runs with"),
    Option("settings", "", "`name = value` lines; names: " + ", ".join(f"`{n}`" for n in storage.POSTGRESQL_SETTINGS)
           + "; values such as `256MB`, `off`, `1.1`",
           "PostgreSQL settings, each given to `postgres` as `-c name=value` after the part's own",
           "empty (PostgreSQL's defaults)"),
)

#: ``plonedeploy.recipe:relstorage-tools`` (relstoragetools.py): zodbconvert's and zodbpack's configs.
RELSTORAGE_TOOLS = (
    Option("client", "instance", "a `plonedeploy.recipe:instance` part with `storage = relstorage`",
           "whose `relstorage-dsn`, `relstorage-blobs` and `relstorage-blob-dir` the files use"),
    Option("relstorage-dsn", None, "libpq `key=value` pairs with `dbname`, without `password`",
           "the database to convert into and to pack", "the client's"),
    Option("file-storage", None, "an absolute path",
           "the Data.fs `zodbconvert` reads (read-only, no lock: stop the ZEO server first)", "required"),
    Option("blob-storage", "", "an absolute path", "that FileStorage's blob directory", "empty (no blobs)"),
)

#: Every recipe's table by its entry point name (``recipe = plonedeploy.recipe:<name>``).
TABLES = {
    "instance": INSTANCE,
    "haproxy": HAPROXY,
    "varnish": VARNISH,
    "stack": STACK,
    "postgresql": POSTGRESQL,
    "relstorage-tools": RELSTORAGE_TOOLS,
}
