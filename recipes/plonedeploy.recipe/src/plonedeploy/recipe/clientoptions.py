"""The option groups of a ZEO client part (``plonedeploy.recipe:instance``), each checked
and resolved into what the part writes: ``threads = auto``, the probes, the memory
watchdog, mod_wsgi, ``max-conflict-retries``, the storage; and the counts they need (ZEO
clients per host, the host's memory), the allocator. Each raises ``zc.buildout.UserError``
naming the part, the option and the allowed values."""
import logging
import os
import re
import shutil
import subprocess
import sysconfig

import zc.buildout
from plonedeploy.runtime.delay import parse_delay_ms

from plonedeploy.recipe.optiontables import INSTANCE, DeclaredOptions
from plonedeploy.stack.rules import (
    CONFLICT_RETRIES, JEMALLOC_LIBRARY, JEMALLOC_PACKAGE, MALLOC_VARIABLES, MALLOCS, MOD_WSGI_EXPRESS,
    default_memory_limit, recycle_check_window)
from plonedeploy.recipe.options import (
    RELSTORAGE_BLOBS,
    DEFAULT_TRANSACTION_MODES,
    TRANSACTION_MODES,
    STORAGES,
    auto_threads,
    check_choice,
    fail,
    parse_byte_size,
    parse_dsn,
    parse_http_address,
    parse_positive_int,
    relstorage_lines,
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


def probes(name, opts, options):
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

def memory_watchdog(buildout, name, options, metrics_address):
    """The memory watchdog's filter settings (plonedeploy.runtime.watchdog) from
    ``memory-limit``, ``host-memory``, ``memory-limit-grace``, ``memory-limit-restarts``
    and ``memory-limit-peers``: ``{"memory_limit": bytes or "off", ...}``. The default
    limit is ``rules.default_memory_limit`` (docs/how-to/tuning.md). Without ``metrics-address``
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
    if metrics_address and metrics_address in peers:
        fail(name, "memory-limit-peers", opts["memory-limit-peers"],
             f"the other clients' metrics addresses, not this client's own ({metrics_address})")
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
        if metrics_address:
            logger.info("[%s] memory-limit -> %s MiB: %s", name, limit // 1048576, reason)
    options["memory-limit"] = str(limit)
    options["memory-limit-grace"], options["memory-limit-restarts"] = grace, restarts
    options["memory-limit-peers"] = " ".join(peers)
    home = options.get("client-home") or os.path.join(
        options.get("var") or os.path.join(buildout["buildout"]["directory"], "var"), name)
    return {"memory_limit": limit if metrics_address else "off", "memory_limit_grace": grace,
            "memory_limit_restarts": restarts, "memory_limit_peers": " ".join(peers),
            "memory_state_file": os.path.join(home, "memory-recycles"),
            "check_window": recycle_check_window()}

def mod_wsgi(buildout, name, options):
    """The mod_wsgi runner's settings (a dict for the wsgi ini): ``mod-wsgi-express`` (must
    exist) and ``run-as``; the part's own Chameleon cache.

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
    return {"mod_wsgi_express": express, "run_as": run_as,
                     # + the port (mod_wsgi_context)
                     "server_root": os.path.join(var, name, "mod_wsgi-"),
                     "writable": " ".join(writable),
                     # Apache's LimitRequestBody: the client's own body cap
                     "limit_request_body": options["max-request-body-size"]}

def conflict_retries(name, options):
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

def storage_options(buildout, name, options):
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
    options["rel-storage"] = relstorage_lines(dsn, blobs, blob_dir, relstorage_tuning(name, opts, blobs))
    options["zeo-client"] = "off"
    return storage


def relstorage_tuning(name, opts, blobs):
    """RelStorage's cache keys from the part's options (``opts``: its DeclaredOptions), as
    ``[(key, value)]`` for :func:`options.relstorage_lines`; an empty option writes nothing
    (RelStorage's default). ``relstorage-cache-local-mb``: whole MB >= 0 (0: no local
    cache); ``relstorage-cache-local-dir``: an absolute path (RelStorage creates it);
    ``relstorage-blob-cache-size``: a byte size, only with ``relstorage-blobs = database``
    (with a shared directory the blobs are no cache). Raises ``zc.buildout.UserError``
    naming the option and the allowed values."""
    tuning = []
    megabytes = opts.setdefault("relstorage-cache-local-mb").strip()
    if megabytes:
        if not megabytes.isdigit():
            fail(name, "relstorage-cache-local-mb", megabytes,
                 "a whole number of MB >= 0 (0: no local pickle cache), or empty for RelStorage's 10")
        tuning.append(("cache-local-mb", str(int(megabytes))))
    directory = opts.setdefault("relstorage-cache-local-dir").strip()
    if directory:
        if not os.path.isabs(directory):
            fail(name, "relstorage-cache-local-dir", directory, "an absolute path, or empty (no persistent cache)")
        tuning.append(("cache-local-dir", directory))
    size = opts.setdefault("relstorage-blob-cache-size").strip()
    if size:
        if blobs != "database":
            fail(name, "relstorage-blob-cache-size", size,
                 "empty with relstorage-blobs = shared-directory (the blobs there are no cache)")
        tuning.append(("blob-cache-size", str(parse_byte_size(name, "relstorage-blob-cache-size", size))))
    return tuning


def transaction_mode(name, options, storage):
    """Check ``transaction-mode`` (one of ``options.TRANSACTION_MODES``; unset: the default of
    ``storage``, ``options.DEFAULT_TRANSACTION_MODES``); return True for ``explicit``, which
    puts the ``explicittx`` filter (plonedeploy.runtime.explicittx) in the pipeline. Raises
    ``zc.buildout.UserError`` naming the option and the allowed values."""
    opts = DeclaredOptions(name, options, INSTANCE)
    mode = check_choice(name, "transaction-mode",
                        opts.setdefault("transaction-mode", DEFAULT_TRANSACTION_MODES[storage]).strip(),
                        TRANSACTION_MODES)
    options["transaction-mode"] = mode
    return mode == "explicit"

def added_delay(name, options):
    """Check ``added-delay`` (whole milliseconds, ``plonedeploy.runtime.delay.parse_delay_ms``:
    the filter's own rule); return it as an int, 0 meaning no ``delay`` filter. Raises
    ``zc.buildout.UserError`` naming the part, the option and the allowed values."""
    opts = DeclaredOptions(name, options, INSTANCE)
    value = opts.setdefault("added-delay")
    try:
        milliseconds = parse_delay_ms(value)
    except ValueError as exc:
        raise zc.buildout.UserError(f"[{name}] {exc}") from None
    options["added-delay"] = str(milliseconds)
    if milliseconds:
        logger.warning("[%s] added-delay = %s: page requests sleep %s ms first (a testing aid, "
                       "never for a site with visitors)", name, milliseconds, milliseconds)
    return milliseconds


def resolve_auto_threads(buildout, name, options, server):
    """Resolve ``threads = auto`` (``rules.auto_threads``); log the choice; return it as text."""
    opts = DeclaredOptions(name, options, INSTANCE)
    cores = opts.get("cpu-cores", "").strip()
    cores = (parse_positive_int(name, cores, "cpu-cores") if cores
             else len(os.sched_getaffinity(0)))
    threads, reason = auto_threads(server, cores, clients_per_host(buildout, name, opts))
    logger.info("[%s] threads = auto -> %s: %s", name, threads, reason)
    return str(threads)

def jemalloc_candidates(multiarch, ldconfig_output):
    """Paths that may hold jemalloc's library (:data:`rules.JEMALLOC_LIBRARY`), best first:
    Debian's multiarch directories for ``multiarch`` (such as ``x86_64-linux-gnu``; empty or
    None: none), then the paths ``ldconfig -p`` (its text, ``ldconfig_output``) lists for
    the library, those of ``multiarch`` first (ldconfig also lists other architectures')."""
    first = [f"{top}/{multiarch}/{JEMALLOC_LIBRARY}" for top in ("/usr/lib", "/lib")] if multiarch else []
    listed = [m.group(1).strip() for m in re.finditer(rf"^\s*{re.escape(JEMALLOC_LIBRARY)} \(.*\) => (.+)$",
                                                      ldconfig_output or "", re.MULTILINE)]
    listed.sort(key=lambda path: not (multiarch and f"/{multiarch}/" in path))
    return list(dict.fromkeys(first + listed))


def ldconfig_listing():
    """Text of ``ldconfig -p`` (the dynamic linker's cache), or ``""`` when there is no
    ldconfig (it is in /sbin, which a user's PATH may lack) or it fails."""
    program = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None)
    if not program:
        return ""
    try:
        return subprocess.run([program, "-p"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def find_jemalloc():
    """Absolute path of jemalloc's library on this host (the first of
    :func:`jemalloc_candidates` for this Python's multiarch triplet that is a file), or None."""
    candidates = jemalloc_candidates(sysconfig.get_config_var("MULTIARCH"), ldconfig_listing())
    return next((path for path in candidates if os.path.isfile(path)), None)


def malloc_environment(name, options, find=find_jemalloc):
    """The allocator options ``malloc`` and ``malloc-arena-max``, checked and resolved into
    the variables the client's server process must start with: ``{"LD_PRELOAD": path of
    jemalloc's library}`` with ``malloc = jemalloc`` (``find()`` looks it up), ``{"MALLOC_ARENA_MAX":
    text}`` with an arena count, ``{}`` for glibc's defaults. Raises ``zc.buildout.UserError``
    naming the option for a value outside its choices, an arena count with jemalloc (glibc's
    variable, which jemalloc ignores), a missing library (naming the package to install), and
    for ``environment-vars`` that set one of :data:`rules.MALLOC_VARIABLES` (Zope sets those
    once the process runs, with no effect on its allocator)."""
    opts = DeclaredOptions(name, options, INSTANCE)
    malloc = check_choice(name, "malloc", opts.setdefault("malloc").strip(), MALLOCS)
    arena = opts.setdefault("malloc-arena-max").strip()
    if arena:
        arena = str(parse_positive_int(name, arena, "malloc-arena-max", "a positive integer such as 2 "
                                       "(glibc's malloc arenas), or empty for glibc's default"))
        if malloc != "system":
            fail(name, "malloc-arena-max", arena,
                 f"empty with malloc = {malloc} (MALLOC_ARENA_MAX is glibc's; jemalloc ignores it), "
                 "or malloc = system")
    options["malloc"], options["malloc-arena-max"] = malloc, arena
    variables = opts.get("environment-vars", "").split()
    for variable in MALLOC_VARIABLES:
        if variable in variables:
            raise zc.buildout.UserError(
                f"[{name}] environment-vars sets {variable}, which Zope sets only once the process runs, "
                "too late for the allocator; remove it there and set the part's options malloc (one of: "
                f"{', '.join(MALLOCS)}) and malloc-arena-max")
    environment = {}
    if malloc == "jemalloc":
        library = find()
        if not library:
            raise zc.buildout.UserError(
                f"[{name}] malloc = jemalloc needs {JEMALLOC_LIBRARY}, which is not on this host (looked in "
                f"the multiarch directories and ldconfig -p): apt-get install {JEMALLOC_PACKAGE} (make system "
                f"installs it), or set malloc to another of: {', '.join(MALLOCS)}")
        environment["LD_PRELOAD"] = library
    if arena:
        environment["MALLOC_ARENA_MAX"] = arena
    return environment


def malloc_initialization(environment):
    """Python lines for the top of ``bin/<part>`` (zc.recipe.egg's ``initialization``) that put
    ``environment`` (:func:`malloc_environment`'s) into ``os.environ``: the ctl script hands
    its environment to the server process it execs (``console``) or starts (``fg``,
    ``start``), which so starts with them. A library of ``LD_PRELOAD`` goes first, once, before
    any the environment names already. ``""`` for an empty ``environment``."""
    if not environment:
        return ""
    lines = ["import os as _plonedeploy_os  # the allocator (plonedeploy.recipe: malloc, malloc-arena-max)"]
    for key, value in environment.items():
        if key == "LD_PRELOAD":
            lines += [f"_plonedeploy_preload = [p for p in _plonedeploy_os.environ.get('LD_PRELOAD', '')"
                      f".replace(':', ' ').split() if p != {value!r}]",
                      f"_plonedeploy_os.environ['LD_PRELOAD'] = ' '.join([{value!r}] + _plonedeploy_preload)"]
        else:
            lines.append(f"_plonedeploy_os.environ[{key!r}] = {value!r}")
    return "\n".join(lines) + "\n"
