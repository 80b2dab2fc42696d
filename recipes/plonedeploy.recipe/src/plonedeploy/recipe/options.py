"""Validation and rendering helpers shared by the plonedeploy recipes.

Nothing here imports Zope or plone.recipe.zope2instance, so the rules can be unit-tested
without a build. Every validation error is a ``zc.buildout.UserError`` whose message names
the part, the option, the value given and what is allowed, so ``bin/buildout`` stops with
one readable line instead of a traceback.
"""
import ipaddress
import os
import pwd
import re
import shutil
import tempfile

import zc.buildout

from plonedeploy.stack import storage as _storage

# The server and thread rules live in rules.py (plain Python, which Ansible imports too);
# re-exported here for the recipes and tools that import them from options.
from plonedeploy.stack.rules import (  # noqa: E402,F401
    DEFAULT_SERVER, DEFAULT_THREADS, RUNTIME_EGG, SERVERS, SINGLE_THREADED, auto_threads, default_threads,
    threads_error)

#: Values of an on/off option (``blob-sendfile``), mapped to their meaning.
SWITCH_VALUES = {"on": True, "off": False, "true": True, "false": False}

#: Name of the blob WSGI filter in the clients' pipeline (``[filter:blobsendfile]``).
BLOB_FILTER = "blobsendfile"

#: PasteDeploy ``use`` of the hello-world app (``hello-address``: etc/hello.ini).
HELLO_APP = "egg:plonedeploy.runtime#hello"
#: Name of the Prometheus WSGI filter (``[filter:metrics]``, ``metrics-address``) and the
#: egg it needs in the client.
METRICS_FILTER = "metrics"
METRICS_EGG = "prometheus-client"
#: Name of the WSGI filter that puts each request's thread into the transaction package's
#: explicit mode (``[filter:explicittx]``, ``transaction-mode = explicit``;
#: plonedeploy.runtime.explicittx), and the option's values.
EXPLICIT_TX_FILTER = "explicittx"
TRANSACTION_MODES = ("implicit", "explicit")
#: The default by ``storage``: RelStorage polls PostgreSQL at each transaction's start, so
#: explicit mode's one poll per request instead of three gives ``/`` 1.31 (1.26-1.46)x the
#: req/s of implicit mode and leaves /Plone, @json and the blob level (6 rounds of two quiet
#: runs of ``python -m loadtests storage``, docs/how-to/relstorage.md#tuning); a ZEO client
#: does not poll (the ZEO server sends invalidations), so ZEO keeps Zope's stock mode.
DEFAULT_TRANSACTION_MODES = {"zeo": "implicit", "relstorage": "explicit"}
#: Name of the testing aid that slows page requests (``[filter:delay]``, ``added-delay``;
#: plonedeploy.runtime.delay).
DELAY_FILTER = "delay"
#: Name of the filter that serialises AST construction on CPython < 3.12 (``[filter:astlock]``;
#: plonedeploy.runtime.astlock): put in every Zope pipeline whose Python needs it.
AST_LOCK_FILTER = "astlock"

# The shared templates and their renderer (one copy, with bin/stack's; plonedeploy.stack.templates).
from plonedeploy.stack.templates import HAPROXY_TEMPLATE, TEMPLATES_DIRECTORY, render_template  # noqa: E402,F401

# The storage rules (storages, blob modes, DSN keywords) live in storage.py, plain Python
# that Ansible imports too; re-exported here for the recipes that import them from options.
from plonedeploy.stack.storage import (  # noqa: E402,F401
    DEFAULT_RELSTORAGE_BLOBS, DEFAULT_STORAGE, DSN_KEYWORDS, RELSTORAGE_BLOBS, STORAGES, redact_dsn)
#: Eggs a client with ``storage = relstorage`` needs. psycopg2-binary, not psycopg2: the
#: same module (``import psycopg2``, which RelStorage's PostgreSQL adapter loads) as a
#: manylinux wheel with its own libpq, so no host needs gcc, libpq-dev or a compile step;
#: PyPI publishes psycopg2 itself as an sdist only. (RelStorage's ``postgresql`` extra
#: would ask for psycopg2, hence the eggs are named here instead.)
RELSTORAGE_EGGS = ("RelStorage", "psycopg2-binary")

#: HAProxy ``balance`` algorithms that make sense for a pool of ZEO clients.
BALANCE_ALGORITHMS = ("leastconn", "roundrobin", "static-rr", "first", "random", "source")

_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)$")


def fail(part, option, value, allowed):
    """Raise ``zc.buildout.UserError`` naming part, option, value and what is allowed.

    ``allowed`` is a human-readable description, e.g. ``"one of: pyruvate, waitress"``.
    """
    raise zc.buildout.UserError(
        f"[{part}] {option} = {value!r} is invalid: expected {allowed}"
    )


def system_user(part, option, user, hint):
    """The ``pwd`` entry of system user ``user``, the value of ``option`` of ``part``: who a
    service drops to (the ZEO server and clients' service-user, HAProxy's user). Raises
    ``zc.buildout.UserError`` naming the option when the user does not exist (the message
    ends with ``hint``: an existing user and how to make one) or is root (uid 0: dropping to
    it drops nothing)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        fail(part, option, user, hint)
    if entry.pw_uid == 0:
        fail(part, option, user, "a system user other than root (it is what the programs drop to)")
    return entry


def find_program(configured, defaults, missing):
    """Path of a program: ``configured`` (a part's option) if given, else the first of
    ``defaults`` (names or absolute paths) found on PATH. Raises ``zc.buildout.UserError``
    with ``missing`` formatted with ``tried`` (the candidates, comma-separated) when none is
    found."""
    candidates = [configured] if configured else list(defaults)
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found
    raise zc.buildout.UserError(missing.format(tried=", ".join(candidates)))


def write_checked(path, text, check):
    """Write ``text`` to ``path`` (mode 0644) only if ``check(temporary path)`` accepts it.

    The text goes to a temporary file beside ``path`` (same suffix), ``check`` runs on it
    and raises to refuse it (e.g. ``zc.buildout.UserError`` with the checker's message);
    then it replaces ``path`` atomically, so a running process never reads a half-written
    or refused file. The temporary file is removed in every case.
    """
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=os.path.splitext(path)[1])
    with os.fdopen(fd, "w", encoding="utf-8") as fp:
        fp.write(text)
    try:
        os.chmod(tmp, 0o644)
        check(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def parse_http_address(part, value, option="http-address"):
    """Parse ``host:port`` into ``(host, port)``; ``port`` is an int in 1..65535.

    pyruvate takes any ``socket`` value that is not ``host:port`` as a Unix socket path
    (``8080`` creates a file named ``8080``), so a bare port or a list of addresses, which
    plone.recipe.zope2instance would accept, is refused here.

    Raises ``zc.buildout.UserError`` for anything else.
    """
    allowed = "one host:port such as 127.0.0.1:8081 (a bare port is taken by pyruvate as a Unix socket path)"
    text = (value or "").strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host or not _HOST_RE.match(host) or not port.isdigit():
        fail(part, option, value, allowed)
    number = int(port)
    if not 1 <= number <= 65535:
        fail(part, option, value, "a port between 1 and 65535 in host:port")
    return host, number


def parse_positive_int(part, value, option="threads", allowed="a positive integer such as 2"):
    """Parse a positive integer option (``"2"`` -> ``2``): threads, seconds, bytes.

    Raises ``zc.buildout.UserError`` for zero, negative or non-integer values; its message
    ends with ``allowed`` (what the option takes).
    """
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        fail(part, option, value, allowed)
    return int(text)


def parse_network(part, option, value):
    """Parse one IPv4/IPv6 network or address (``"10.0.0.0/8"``, ``"127.0.0.1"``) for an ACL.

    Returns the normalised CIDR string (``"127.0.0.1/32"``). Raises
    ``zc.buildout.UserError`` naming the option when it is not a network.
    """
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        fail(part, option, value, "IPv4/IPv6 networks such as 127.0.0.1/32 10.0.0.0/8")


def parse_threads(part, server, value=None):
    """``threads`` of a ZEO client on ``server`` as an int; ``value`` None means the default.

    (``threads = auto`` is resolved by the recipe with :func:`auto_threads` before this.)

    The default is :data:`DEFAULT_THREADS`, or 1 for :data:`SINGLE_THREADED` servers,
    which refuse any other value (their ZODB pool-size and HAProxy maxconn are then 1).
    Raises ``zc.buildout.UserError`` naming part, option, value and what is allowed.
    """
    if value is None:
        return default_threads(server)
    threads = parse_positive_int(part, value, "threads", "a positive integer such as 2, or auto")
    error = threads_error(server, threads)
    if error:
        fail(part, "threads", value, error)
    return threads


#: Byte-size suffixes of ``zodb-cache-memory`` (binary, as ZConfig's byte-size reads KB/MB/GB).
_BYTE_UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3}


def parse_byte_size(part, option, value):
    """Parse ``"512MB"``, ``"1GB"``, ``"65536"`` (KB/MB/GB are powers of 1024) into bytes.

    Raises ``zc.buildout.UserError`` naming the option for anything else or for 0.
    """
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?B?)\s*", str(value), re.IGNORECASE)
    unit = match.group(2).upper() if match else None
    if not match or unit not in _BYTE_UNITS or int(match.group(1)) == 0:
        fail(part, option, value, "a size in bytes such as 512MB, 1GB or 65536")
    return int(match.group(1)) * _BYTE_UNITS[unit]


def parse_switch(part, option, value):
    """Parse an on/off option (``on``, ``off``, ``true``, ``false``; any case) into a bool.

    Raises ``zc.buildout.UserError`` for anything else.
    """
    text = str(value).strip().lower()
    if text not in SWITCH_VALUES:
        fail(part, option, value, "on or off")
    return SWITCH_VALUES[text]


def add_pipeline_filter(pipeline, name=BLOB_FILTER):
    """Return the PasteDeploy ``pipeline`` (whitespace-separated) with filter ``name`` first.

    First means outermost: the server calls it, and it sees the application's iterable
    before any other middleware could wrap it. A pipeline that already names the filter is
    returned unchanged (its position is then the operator's choice).
    """
    steps = pipeline.split()
    if name not in steps:
        steps.insert(0, name)
    return "\n".join(steps)


def insert_pipeline_filter_after(pipeline, name, after):
    """Return ``pipeline`` with filter ``name`` right after ``after`` (or first without it).

    A pipeline that already names ``name`` is returned unchanged.
    """
    steps = pipeline.split()
    if name not in steps:
        steps.insert(steps.index(after) + 1 if after in steps else 0, name)
    return "\n".join(steps)


def insert_pipeline_filter_before_app(pipeline, name):
    """Return ``pipeline`` with filter ``name`` right before its last step, the application
    (innermost: it runs in the request's thread just before the app is called). A pipeline
    that already names ``name`` is returned unchanged."""
    steps = pipeline.split()
    if name not in steps:
        steps.insert(max(len(steps) - 1, 0), name)
    return "\n".join(steps)


def check_choice(part, option, value, choices):
    """Return ``value`` if it is one of ``choices``, else raise ``zc.buildout.UserError``."""
    if value not in choices:
        fail(part, option, value, "one of: " + ", ".join(choices))
    return value


def template_option(part, options, option, filename, directory=TEMPLATES_DIRECTORY):
    """Resolve a part's template option; return the template file's absolute path.

    ``option`` is ``templates-directory`` (a directory that must hold ``filename``) or
    ``template`` (the file itself); unset, it defaults to the package's own
    (``directory``, default :data:`TEMPLATES_DIRECTORY`, or ``filename`` in it) and is written back into
    ``options`` so that ``bin/buildout annotate`` shows what was used.

    Raises ``zc.buildout.UserError`` naming the part, the option and the value when the
    directory or the file does not exist.
    """
    default = directory if option == "templates-directory" else os.path.join(directory, filename)
    value = options.get(option, "").strip() or default
    options[option] = value
    path = os.path.join(value, filename) if option == "templates-directory" else value
    if not os.path.isfile(path):
        fail(part, option, value,
             f"a directory holding {filename}" if option == "templates-directory"
             else f"an existing template file such as {default}")
    return os.path.abspath(path)


_ZODB_MAIN_RE = re.compile(r"^<zodb_db main>[ \t]*$", re.MULTILINE)


def insert_pool_size(zope_conf, pool_size):
    """Return ``zope_conf`` with ``pool-size <pool_size>`` as first line of ``<zodb_db main>``.

    ZODB opens one connection (with its own object cache) per concurrent request and warns
    when more than ``pool-size`` are open; the pool must match the server's threads.
    plone.recipe.zope2instance has no option for it, hence this edit of its output.

    Raises ``ValueError`` if there is not exactly one ``<zodb_db main>`` section or it
    already sets a pool-size.
    """
    matches = list(_ZODB_MAIN_RE.finditer(zope_conf))
    if len(matches) != 1:
        raise ValueError(
            f"expected one '<zodb_db main>' section in zope.conf, found {len(matches)}"
        )
    end = matches[0].end()
    section = zope_conf[end:zope_conf.index("</zodb_db>", end)]
    if re.search(r"^\s*pool-size\b", section, re.MULTILINE):
        raise ValueError("zope.conf already sets pool-size in <zodb_db main>")
    return f"{zope_conf[:end]}\n    pool-size {pool_size}{zope_conf[end:]}"


def parse_dsn(part, option, value):
    """Parse a libpq keyword/value DSN (``host=127.0.0.1 port=5432 dbname=plone``) to a dict.

    The rules are :func:`plonedeploy.stack.storage.parse_dsn` (no password, no URI, known
    keywords once each, ``dbname`` required, no ``$``); here a refused value raises
    ``zc.buildout.UserError`` naming part and option. The message never repeats a
    password (:func:`redact_dsn`).
    """
    try:
        return _storage.parse_dsn(value)
    except ValueError as exc:
        fail(part, option, redact_dsn(value), str(exc))


def relstorage_lines(dsn, blobs, blob_dir, tuning=()):
    """The ``rel-storage`` option of plone.recipe.zope2instance for PostgreSQL, as text.

    ``dsn``: the checked libpq DSN (:func:`parse_dsn`); ``blobs``: a key of
    :data:`RELSTORAGE_BLOBS`; ``blob_dir``: RelStorage's ``blob-dir`` (the blobs themselves
    with ``shared-directory``, a local cache of them with ``database``); ``tuning``: checked
    ``(key, value)`` pairs of RelStorage's own keys (``cache-local-mb``, ``cache-local-dir``,
    ``blob-cache-size``), written in that order after the others. The stock recipe renders
    it as ``%import relstorage`` and ``<relstorage>`` with ``<postgresql>`` in zope.conf
    (keys with a dash go into ``<relstorage>``). Raises ``KeyError`` for an unknown ``blobs``.
    """
    return "\n".join((
        "type postgresql",
        f"dsn {dsn}",
        f"blob-dir {blob_dir}",
        f"shared-blob-dir {RELSTORAGE_BLOBS[blobs]}",
        *(f"{key} {value}" for key, value in tuning),
    ))
