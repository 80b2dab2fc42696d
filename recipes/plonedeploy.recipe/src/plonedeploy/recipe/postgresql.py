"""``plonedeploy.recipe:postgresql`` -- a local PostgreSQL cluster for RelStorage, run by ``bin/stack``.

The buildout stack's database when the clients have ``storage = relstorage``
(relstorage.cfg; docs/how-to/relstorage.md). Debian's PostgreSQL 15 binaries
(``scripts/install-system.sh`` installs the ``postgresql`` package), a cluster of its own
in ``var/<part>``, its own port, TCP on a loopback address only. Options:

``address``
    ``host:port`` the server listens on (``listen_addresses``, ``port``); required. The
    host must be a loopback address (``127.0.0.1``, ``::1``, ``localhost``): this part is
    the single-host stack's database, reached over TCP with a password and no TLS.
``database``
    The site's database, default ``plone``; ``user``: the role that owns it and that the
    clients log in as, default ``plone``. Lower-case identifiers (``[a-z_][a-z0-9_]*``).
``bin-directory``
    Where ``initdb``, ``postgres`` and ``pg_isready`` are; default
    ``/usr/lib/postgresql/15/bin``. Checked when bin/buildout installs the part.
``run-as``
    The system user that runs ``initdb`` and ``postgres`` when ``bin/<part>`` (and so
    ``bin/stack``) runs as root, which PostgreSQL refuses; default ``postgres`` (Debian's
    package creates it). Ignored when not root: the server then runs as the invoking user.
``settings``
    ``name = value`` lines, each passed to ``postgres`` as ``-c name=value``: the names of
    ``storage.POSTGRESQL_SETTINGS`` (``shared_buffers``, ``work_mem``, ...), values a number
    with a unit or a word; default none (PostgreSQL's own). Measured for RelStorage's reads
    in docs/how-to/relstorage.md#tuning.

Options set for other parts (``${<part>:dsn}`` ...): ``dsn`` (libpq key=value, with
``passfile`` and without the password: the clients' ``relstorage-dsn``), ``passfile``,
``address``, ``data-directory``, and for ``plonedeploy.recipe:stack`` (its ``database``
option) ``argv`` and ``ready`` (JSON: the foreground command and the readiness probe, a TCP
connect plus ``pg_isready``).

Files, all under ``var/<part>`` (kept by bin/buildout; delete the directory to start over):

- ``data/``: the cluster (``PGDATA``), mode 0700, owned by the server's user;
- ``run/``: its Unix socket (``.s.PGSQL.<port>``), mode 0700, same owner: only that user
  (and root) reaches the socket, where the superuser logs in by ``peer`` authentication;
- ``pgpass``: the site role's generated password (32 URL-safe characters) in libpq's
  passfile format, mode 0600, owned by whoever runs ``bin/stack`` (the clients run as that
  user and read it). Its line matches any database (``*``): a role's password is the same
  in every database of the cluster, and ``restore`` and a ``zodbconvert`` into a second
  database log in as that role too. The password is never printed, never on a command
  line and never sent to the server in clear text: the role gets a SCRAM-SHA-256 verifier
  computed here.

``bin/<part>`` (the part's script)::

    bin/postgresql fg      initialise if needed, then run postgres in the foreground
                           (bin/stack runs this; SIGTERM/SIGINT -> a fast shutdown)
    bin/postgresql init    initialise only: initdb, the role, the database, pgpass
    bin/postgresql psql    psql as the cluster's superuser on the Unix socket
    bin/postgresql dump [FILE]     pg_dump of the site's database, custom format (-Fc), to
                           FILE or var/<part>-backups/<database>-<UTC time>.dump (mode 0600)
    bin/postgresql restore FILE    pg_restore of such a dump in place of the site's database

``dump`` runs while the clients run (pg_dump reads one snapshot: a consistent copy of every
object and blob committed before it began). It logs in as the site role over TCP with the
passfile, like the clients; the role owns every table and large object of its database.
``restore`` needs the clients stopped (``bin/stack stop``, then ``bin/stack start
postgresql``: the database alone; ``bin/stack start`` afterwards): it restores into a new
database ``<database>_restore`` first (``pg_restore --single-transaction --exit-on-error``),
and only when that succeeded drops the site's database and renames the new one, so a
damaged dump leaves the old database as it was.
Dropping fails while a client is still connected ("is being accessed by other users"):
stop it and run ``restore`` again. The default backup directory lies beside
``var/<part>``, not in it, so starting over (deleting ``var/<part>``) keeps the dumps.

Initialisation (first ``fg`` or ``init``) runs ``initdb`` (UTF8, C locale, ``peer`` on the
socket, ``scram-sha-256`` over TCP), then creates role and database in single-user mode
(before the server listens, so no client sees a half-made cluster), and writes ``pgpass``
last: a cluster without ``pgpass`` is initialised again (the role gets a new password), so an
interrupted first start or a lost password file mends itself at the next start.

Why a wrapper stays in front of ``postgres``: ``bin/stack stop`` sends SIGTERM to the
process group, and for PostgreSQL SIGTERM is a *smart* shutdown, which waits for every
client to disconnect (the ZEO clients keep their connections open) until bin/stack's
timeout SIGKILLs it. The wrapper turns SIGTERM into SIGINT, a fast shutdown (clients
disconnected, a checkpoint written). ``runuser`` cannot be that wrapper: on SIGTERM it
kills its child with SIGKILL two seconds later. So the wrapper drops privileges itself
(``setgid``/``setgroups``/``setuid`` in the child).

Errors: ``zc.buildout.UserError`` at build time naming part, option and what is allowed;
``PostgresError`` at run time with the command's output (which never contains the password).
"""
import ipaddress
import json
import os
import sys

import zc.buildout

from plonedeploy.recipe.options import fail, parse_http_address
from plonedeploy.recipe.optiontables import POSTGRESQL, DeclaredOptions
# The DSN and the verifier are storage.py's (Ansible's postgresql role uses them too).
from plonedeploy.stack.storage import IDENTIFIER_RE, parse_postgresql_settings, site_dsn
#: The kernel's limit for a Unix socket path (sun_path) minus its terminating NUL.
_SOCKET_PATH_MAX = 107


class Recipe:
    """The PostgreSQL part; see the module docstring for its options."""

    def __init__(self, buildout, name, options):
        self.buildout, self.name, self.options = buildout, name, options
        # Reads go through the table (an undeclared option raises); writes to options.
        opts = DeclaredOptions(name, options, POSTGRESQL)
        host, port = parse_http_address(name, opts.get("address", ""), "address")
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            fail(name, "address", opts["address"],
                 "a loopback host:port such as 127.0.0.1:5432 (the buildout stack's database "
                 "listens on this host only)")
        host = "127.0.0.1" if host == "localhost" else host.strip("[]")
        for key in ("database", "user"):
            value = opts.setdefault(key).strip()
            if not IDENTIFIER_RE.match(value):
                fail(name, key, value, "a lower-case identifier such as plone ([a-z_][a-z0-9_]*)")
        try:
            settings = parse_postgresql_settings(opts.setdefault("settings"))
        except ValueError as exc:
            fail(name, "settings", opts["settings"].strip(), str(exc))
        bin_dir = opts.setdefault("bin-directory")
        run_as = opts.setdefault("run-as").strip()
        directory = os.path.join(buildout["buildout"]["directory"], "var", name)
        self.config = {
            "name": name,
            "host": host,
            "port": port,
            "database": opts["database"].strip(),
            "user": opts["user"].strip(),
            "bin_directory": bin_dir,
            "run_as": run_as,
            "directory": directory,
            "data_directory": os.path.join(directory, "data"),
            "socket_directory": os.path.join(directory, "run"),
            "passfile": os.path.join(directory, "pgpass"),
            # Beside var/<part>, so deleting it to start over keeps the dumps.
            "backup_directory": f"{directory}-backups",
            "settings": settings,
        }
        socket_path = os.path.join(self.config["socket_directory"], f".s.PGSQL.{port}")
        if len(socket_path.encode()) > _SOCKET_PATH_MAX:
            raise zc.buildout.UserError(
                f"[{name}] the Unix socket path {socket_path} is longer than {_SOCKET_PATH_MAX} "
                "bytes, which the kernel refuses; build in a shorter directory")
        options["address"] = f"{host}:{port}"
        options["data-directory"] = self.config["data_directory"]
        options["passfile"] = self.config["passfile"]
        options["dsn"] = site_dsn(self.config)
        location = os.path.join(buildout["buildout"]["parts-directory"], name)
        options["location"] = location
        self.script = os.path.join(buildout["buildout"]["bin-directory"], name)
        options["argv"] = json.dumps([self.script, "fg"])
        options["ready"] = json.dumps({
            "tcp": [host, port],
            # A TCP connect succeeds while PostgreSQL still answers "starting up".
            "command": [os.path.join(bin_dir, "pg_isready"), "-q", "-h", host, "-p", str(port)],
        })
        opts.setdefault("eggs")

    def install(self):
        """Check the binaries, write ``parts/<part>/postgresql.json`` and ``bin/<part>``."""
        import zc.recipe.egg  # only needed at install time, when buildout provides it

        for program in ("initdb", "postgres", "pg_isready", "psql", "pg_dump", "pg_restore"):
            if not os.access(os.path.join(self.config["bin_directory"], program), os.X_OK):
                fail(self.name, "bin-directory", self.config["bin_directory"],
                     f"the directory of PostgreSQL's {program} (Debian: apt-get install postgresql, "
                     "see scripts/install-system.sh)")
        location = self.options["location"]
        os.makedirs(location, exist_ok=True)
        path = os.path.join(location, "postgresql.json")
        with open(path, "w", encoding="utf-8") as fp:
            json.dump(self.config, fp, indent=2, sort_keys=True)
        egg = zc.recipe.egg.Egg(self.buildout, self.options["recipe"], self.options)
        _, working_set = egg.working_set()
        scripts = zc.buildout.easy_install.scripts(
            [(self.name, "plonedeploy.stack.postgresql", "main")],
            working_set, sys.executable, self.buildout["buildout"]["bin-directory"],
            arguments=repr(path),
        )
        return [location] + list(scripts)

    update = install
