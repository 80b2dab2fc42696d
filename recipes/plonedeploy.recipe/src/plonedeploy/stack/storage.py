"""The storage rules: which storages and blob modes exist, what a RelStorage DSN may hold,
the site role's DSN and its SCRAM-SHA-256 verifier.

Plain Python (no zc.buildout, no Zope), so that Ansible imports the same rules
(``ansible/filter_plugins/plonedeploy_edge.py``: the zeoclient and postgresql roles)
as the recipes do (``options.py`` re-exports them and turns ``ValueError`` into
``zc.buildout.UserError`` naming part and option; ``postgresql.py``).
"""
import base64
import hashlib
import hmac
import os
import re

#: ``storage`` values of the ``instance`` recipe (and ``zeoclient_storage`` of the Ansible
#: role): a ZEO client, or a RelStorage client of PostgreSQL (docs/how-to/relstorage.md).
STORAGES = ("zeo", "relstorage")
DEFAULT_STORAGE = "zeo"
#: ``relstorage-blobs`` values mapped to RelStorage's ``shared-blob-dir``: ``database``
#: keeps blobs in PostgreSQL and ``relstorage-blob-dir`` is each client's own cache of them;
#: ``shared-directory`` keeps them in a directory every client mounts (the database holds
#: no blob data then).
RELSTORAGE_BLOBS = {"database": "false", "shared-directory": "true"}
DEFAULT_RELSTORAGE_BLOBS = "database"

#: PostgreSQL settings the ``postgresql`` part's ``settings`` option may set (``-c`` on the
#: server's command line): the memory and planner ones issue 32 tried. The others the part
#: owns (listen_addresses, port, unix_socket_directories) or leaves to PostgreSQL.
POSTGRESQL_SETTINGS = ("shared_buffers", "work_mem", "effective_cache_size", "jit", "synchronous_commit",
                       "random_page_cost", "plan_cache_mode")
#: A setting's value: a number with an optional unit (``256MB``), or a word (``off``, ``auto``).
POSTGRESQL_VALUE_RE = re.compile(r"^(\d+(\.\d+)?(B|kB|MB|GB|TB|ms|s|min|h|d)?|[a-z_]+)$")


def parse_postgresql_settings(text):
    """``name = value`` lines (blank lines ignored) -> ``{name: value}`` in their order.

    Names from :data:`POSTGRESQL_SETTINGS`, each once; values matching
    :data:`POSTGRESQL_VALUE_RE` (so nothing can be quoted into the command line). PostgreSQL
    itself checks a value's range at start. Raises ``ValueError`` saying what is allowed
    and naming the line (the recipe puts it after "expected")."""
    settings = {}
    for line in (line.strip() for line in text.splitlines()):
        if not line:
            continue
        name, sep, value = (part.strip() for part in line.partition("="))
        if not sep or name not in POSTGRESQL_SETTINGS or name in settings:
            raise ValueError(f"'name = value' lines, each name once, names of: "
                             f"{', '.join(POSTGRESQL_SETTINGS)} (line {line!r})")
        if not POSTGRESQL_VALUE_RE.match(value):
            raise ValueError(f"values such as 256MB, off or 1.1 (line {line!r})")
        settings[name] = value
    return settings


#: PostgreSQL database and role names the kit accepts: lower-case identifiers that need no
#: quoting in SQL (``[a-z_][a-z0-9_]*``, at most 63 bytes, PostgreSQL's NAMEDATALEN - 1).
IDENTIFIER_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

#: libpq connection keywords a ``relstorage-dsn`` may use (PostgreSQL 15,
#: "Parameter Key Words"); ``password`` is left out on purpose.
DSN_KEYWORDS = frozenset("""
    host hostaddr port dbname user passfile channel_binding connect_timeout client_encoding
    options application_name fallback_application_name keepalives keepalives_idle
    keepalives_interval keepalives_count tcp_user_timeout sslmode requiressl sslcompression
    sslcert sslkey sslpassword sslrootcert sslcrl sslcrldir sslsni requirepeer
    ssl_min_protocol_version ssl_max_protocol_version krbsrvname gsslib service
    target_session_attrs
""".split())

_DSN_PAIR_RE = re.compile(r"\s*([A-Za-z_]+)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']+)\s*")

#: What a DSN must look like, the start of every DSN error message.
DSN_ALLOWED = ("libpq key=value pairs such as 'host=127.0.0.1 port=5432 dbname=plone user=plone "
               "passfile=/path/pgpass'")

#: SCRAM-SHA-256 iterations, PostgreSQL's default (scram_iterations).
SCRAM_ITERATIONS = 4096
_SCRAM_RE = re.compile(r"^SCRAM-SHA-256\$(\d+):([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+):([A-Za-z0-9+/=]+)$")


def redact_dsn(text):
    """``text`` with every password in it replaced by ``***`` (for error messages).

    Covers ``password=...`` pairs (quoted or not) and the ``user:password@`` of a URI.
    """
    text = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", text or "")
    return re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)


def parse_dsn(value):
    """Parse a libpq keyword/value DSN (``host=127.0.0.1 port=5432 dbname=plone``) to a dict.

    Values may be single-quoted (``passfile='/a b/pgpass'``; quotes are kept out of the
    result). Raises ``ValueError`` whose message says what is allowed (it starts with
    :data:`DSN_ALLOWED` and never repeats the value) for: an empty value, URI form
    (``postgresql://...``), unknown keywords, a keyword given twice, no ``dbname``, ``$``
    (ZConfig would substitute it in zope.conf), and ``password``: zope.conf is a readable
    file, so the password belongs in a 0600 ``passfile`` (libpq's ``.pgpass`` format).
    """
    text = (value or "").strip()
    if not text or "://" in text:
        raise ValueError(DSN_ALLOWED)
    if "$" in text:
        raise ValueError(DSN_ALLOWED + " without '$' (ZConfig substitutes it in zope.conf)")
    pairs, position = {}, 0
    while position < len(text):
        match = _DSN_PAIR_RE.match(text, position)
        if not match:
            raise ValueError(DSN_ALLOWED)
        key, raw = match.group(1), match.group(2)
        if key == "password":
            raise ValueError(DSN_ALLOWED + " without password (zope.conf is world-readable: "
                             "put it into a 0600 passfile and name that with passfile=)")
        if key not in DSN_KEYWORDS:
            raise ValueError(DSN_ALLOWED + f" ({key!r} is not a libpq keyword)")
        if key in pairs:
            raise ValueError(DSN_ALLOWED + f" ({key!r} given twice)")
        if raw.startswith("'"):
            raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
        pairs[key] = raw
        position = match.end()
    if "dbname" not in pairs:
        raise ValueError(DSN_ALLOWED + " (dbname is missing)")
    return pairs


def site_dsn(config, database=None):
    """The libpq DSN of the site role over TCP, with the passfile and no password.

    ``config``: a dict with ``host``, ``port``, ``database``, ``user`` and ``passfile``
    (the postgresql recipe's runtime config; the Ansible roles pass the same keys);
    ``database``: another database than ``config["database"]``. Returns a str such as
    ``host=10.0.0.2 port=5432 dbname=plone user=plone passfile=/srv/pgpass``.
    """
    return (f"host={config['host']} port={config['port']} dbname={database or config['database']} "
            f"user={config['user']} passfile={config['passfile']}")


def scram_verifier(password, salt=None, iterations=SCRAM_ITERATIONS):
    """Return PostgreSQL's SCRAM-SHA-256 verifier of ``password`` (RFC 5802/7677).

    ``CREATE ROLE ... PASSWORD '<verifier>'`` stores it as is, so the server, its log and
    its statement text never see the password. ``salt``: 16 random bytes unless given
    (bytes). ``password`` must need no SASLprep (ASCII without control characters; the
    generated ones are URL-safe base64). Raises ValueError otherwise.
    """
    if not password or not password.isascii() or not password.isprintable():
        raise ValueError("the password must be printable ASCII")
    salt = salt if salt is not None else os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("ascii"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    b64 = lambda data: base64.b64encode(data).decode("ascii")  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def scram_verifier_for(password, current=""):
    """``current`` when it is a SCRAM-SHA-256 verifier of ``password``, else a new one.

    For idempotent role passwords (the Ansible postgresql role): the stored verifier
    (``pg_authid.rolpassword``, or empty/None when the role has none) is kept as long as
    the password is unchanged, so a second run changes nothing; a changed password gets
    a verifier with a fresh random salt. Raises ValueError like :func:`scram_verifier`.
    """
    match = _SCRAM_RE.match(current or "")
    if match:
        try:
            salt = base64.b64decode(match.group(2), validate=True)
        except ValueError:
            salt = None
        if salt is not None and hmac.compare_digest(
                scram_verifier(password, salt, int(match.group(1))), current):
            return current
    return scram_verifier(password)
