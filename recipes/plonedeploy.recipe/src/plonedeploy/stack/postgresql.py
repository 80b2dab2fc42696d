"""``bin/postgresql`` (the program ``plonedeploy.recipe:postgresql`` writes for its part):
initialise the cluster, run it in the foreground under bin/stack, psql, dump and restore.
Its configuration is the part's ``postgresql.json``; the commands are in
:mod:`plonedeploy.recipe.postgresql`'s docstring."""
import json
import os
import pwd
import re
import secrets
import signal
import subprocess
import sys
import time

from plonedeploy.runtime import access
from plonedeploy.stack.storage import scram_verifier, site_dsn


class PostgresError(Exception):
    """Initialising or running the cluster failed; the message says what and why."""


def server_user(config):
    """``(uid, gid)`` the server must run as, or None to run as the invoking user.

    Root: ``run_as`` (PostgreSQL refuses to run as root). Raises PostgresError when that
    user does not exist.
    """
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(config["run_as"])
    except KeyError:
        raise PostgresError(
            f"{config['name']}: running as root, but run-as user {config['run_as']!r} does not exist "
            "(PostgreSQL refuses to run as root; Debian's postgresql package creates 'postgres')")
    return entry.pw_uid, entry.pw_gid


def _as_user(user):
    """``subprocess`` keyword arguments that run a child as ``user`` (from :func:`server_user`)."""
    if user is None:
        return {}
    uid, gid = user
    return {"user": uid, "group": gid, "extra_groups": [], "env": _server_env(uid)}


def _server_env(uid):
    entry = pwd.getpwuid(uid)
    env = {key: value for key, value in os.environ.items() if key in ("PATH", "LANG", "TZ")}
    env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
    return env


def _make_directory(path, user):
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    if user is not None:
        os.chown(path, *user)


def _run(config, argv, user, what, stdin=None):
    """Run a PostgreSQL program as ``user``; return its output; raise PostgresError on failure.

    Single-user mode exits 0 even when a statement failed: ``ERROR``/``FATAL`` in its output
    count as failure too.
    """
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False,
                            cwd=config["directory"], **_as_user(user))
    output = result.stdout + result.stderr
    failed = result.returncode != 0 or re.search(r"^\S.*\b(ERROR|FATAL|PANIC):", output, re.MULTILINE)
    if failed and not (stdin and _only_exists_errors(output)):
        raise PostgresError(f"{config['name']}: {what} failed (exit {result.returncode}):\n{output}")
    return output


def _only_exists_errors(output):
    errors = re.findall(r"\b(?:ERROR|FATAL|PANIC):\s*(.*)", output)
    return bool(errors) and all(re.fullmatch(r'database ".*" already exists', e.strip()) for e in errors)


def _write_private(path, text):
    """Write ``text`` to ``path`` with mode 0600, atomically (a temporary file renamed)."""
    tmp = f"{path}.tmp"
    if os.path.exists(tmp):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fp:
        fp.write(text)
        fp.flush()
        os.fsync(fp.fileno())
    os.replace(tmp, path)


def initialise(config):
    """Make the cluster usable: directories, ``initdb``, role, database and ``pgpass``.

    Idempotent and quick when done (two ``stat`` calls). Returns True if it initialised
    anything. Raises PostgresError with the failing command's output.
    """
    user = server_user(config)
    os.makedirs(config["directory"], exist_ok=True)
    if user is not None:
        # A checkout under a mode-0700 directory (root's home, a mktemp -d clone): the server's
        # user gets search permission on the way to var/<part>, nothing more, and we say so.
        try:
            access.grant_search(config["run_as"], [config["directory"]],
                                f"it runs PostgreSQL in {config['directory']}")
        except (access.AccessError, OSError) as exc:
            raise PostgresError(f"{config['name']}: {exc}") from None
    data, bin_dir = config["data_directory"], config["bin_directory"]
    fresh = not os.path.exists(os.path.join(data, "PG_VERSION"))
    if fresh:
        _make_directory(data, user)
        _run(config, [os.path.join(bin_dir, "initdb"), "-D", data, "--encoding=UTF8", "--no-locale",
                      "--auth-local=peer", "--auth-host=scram-sha-256"], user, "initdb")
    if not fresh and os.path.exists(config["passfile"]):
        return False
    _make_directory(config["socket_directory"], user)
    password = secrets.token_urlsafe(24)
    role, database = config["user"], config["database"]
    verifier = scram_verifier(password)
    # One statement per line (single-user mode); identifiers checked at build time.
    statements = (
        f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') "
        f"THEN CREATE ROLE {role} LOGIN; END IF; END$$;\n"
        f"ALTER ROLE {role} LOGIN PASSWORD '{verifier}';\n"
        f"CREATE DATABASE {database} OWNER {role};\n"
    )
    _run(config, [os.path.join(bin_dir, "postgres"), "--single", "-D", data,
                  "-c", "listen_addresses=", "-c", "unix_socket_directories=", "postgres"],
         user, "creating the role and the database", stdin=statements)
    _write_private(config["passfile"], f"{config['host']}:{config['port']}:*:{role}:{password}\n")
    return True


def server_argv(config):
    """The ``postgres`` command line of this cluster: the settings the buildout owns, then the
    part's ``settings`` (checked by ``storage.parse_postgresql_settings``), each as ``-c``."""
    return [
        os.path.join(config["bin_directory"], "postgres"), "-D", config["data_directory"],
        "-c", f"listen_addresses={config['host']}",
        "-c", f"port={config['port']}",
        "-c", f"unix_socket_directories={config['socket_directory']}",
        *(arg for name, value in config.get("settings", {}).items() for arg in ("-c", f"{name}={value}")),
    ]


def serve(config):
    """Initialise if needed, run postgres in the foreground; return its exit status.

    SIGTERM and SIGINT to this process become SIGINT to postgres (a fast shutdown; see the
    module docstring). Raises PostgresError if the initialisation fails.
    """
    if initialise(config):
        print(f"{config['name']}: initialised {config['data_directory']} (password in "
              f"{config['passfile']}, mode 0600)", flush=True)
    child = subprocess.Popen(server_argv(config), cwd=config["directory"], **_as_user(server_user(config)))

    def fast_shutdown(signum, frame):
        if child.poll() is None:
            child.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, fast_shutdown)
    signal.signal(signal.SIGINT, fast_shutdown)
    return child.wait()


def _superuser_sql(config, statements, what):
    """Run ``statements`` with psql as the cluster's superuser on the Unix socket, each in
    a transaction of its own (``CREATE``/``DROP DATABASE`` refuse a transaction block),
    stopping at the first error. Raises PostgresError with psql's output."""
    argv = [os.path.join(config["bin_directory"], "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
            "-h", config["socket_directory"], "-p", str(config["port"]), "-d", "postgres"]
    for statement in statements:
        argv += ["-c", statement]
    return _run(config, argv, server_user(config), what)


def dump(config, path=None):
    """``pg_dump`` the site's database in custom format to ``path``; return the path.

    Default ``path``: ``<backup_directory>/<database>-<UTC YYYYmmdd-HHMMSS>.dump`` (the
    directory made with mode 0700). The file gets mode 0600 (it holds every password hash
    of the site) and is written as ``<path>.partial`` first, renamed when pg_dump exited 0:
    a file with the final name is a complete dump. Refuses to overwrite ``path``. Runs as
    the invoking user, logged in as the site role with the passfile (:func:`site_dsn`).
    Raises PostgresError.
    """
    if path is None:
        os.makedirs(config["backup_directory"], mode=0o700, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = os.path.join(config["backup_directory"], f"{config['database']}-{stamp}.dump")
    path = os.path.abspath(path)
    if os.path.exists(path):
        raise PostgresError(f"{config['name']}: {path} exists; name another file")
    partial = f"{path}.partial"
    if os.path.exists(partial):
        os.unlink(partial)  # pg_dump would keep a stale file's mode
    result = subprocess.run(
        [os.path.join(config["bin_directory"], "pg_dump"), "--format=custom", f"--file={partial}",
         f"--dbname={site_dsn(config)}"],
        capture_output=True, text=True, check=False, umask=0o077)
    if result.returncode != 0:
        if os.path.exists(partial):
            os.unlink(partial)
        raise PostgresError(f"{config['name']}: pg_dump failed (exit {result.returncode}):\n"
                            f"{result.stdout}{result.stderr}")
    os.replace(partial, path)
    return path


def restore_database_name(database):
    """The name of the database ``restore`` fills before it replaces ``database``."""
    return f"{database[:63 - len('_restore')]}_restore"


def restore(config, path):
    """Replace the site's database by the dump at ``path`` (from :func:`dump`).

    Restores into :func:`restore_database_name` first, as the site role, in one transaction
    (``--single-transaction --exit-on-error``; owners and grants of the dumped cluster are
    not restored: the site role owns everything), then drops the site's database and renames
    the restored one. The clients must be stopped: PostgreSQL refuses to drop a database
    with sessions. Raises PostgresError; until the drop, the site's database is untouched.
    """
    if not os.path.isfile(path):
        raise PostgresError(f"{config['name']}: no dump file {path}")
    database, role = config["database"], config["user"]
    staging = restore_database_name(database)
    _superuser_sql(config, [f"DROP DATABASE IF EXISTS {staging}", f"CREATE DATABASE {staging} OWNER {role}"],
                   f"creating {staging}")
    result = subprocess.run(
        [os.path.join(config["bin_directory"], "pg_restore"), "--single-transaction", "--exit-on-error",
         "--no-owner", "--no-privileges", f"--dbname={site_dsn(config, staging)}", os.path.abspath(path)],
        capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PostgresError(f"{config['name']}: pg_restore of {path} into {staging} failed (exit "
                            f"{result.returncode}); {database} is unchanged:\n{result.stdout}{result.stderr}")
    try:
        _superuser_sql(config, [f"DROP DATABASE IF EXISTS {database}",
                                f"ALTER DATABASE {staging} RENAME TO {database}"],
                       f"replacing {database} by {staging}")
    except PostgresError as exc:
        raise PostgresError(f"{exc}\nStop the clients (bin/stack stop; bin/stack start {config['name']}) and "
                            f"run restore again; the restored copy waits in database {staging}.") from None


def main(config_path, argv=None):
    """Entry point of ``bin/<part>``: ``fg``, ``init``, ``psql [ARGS...]``, ``dump [FILE]`` or
    ``restore FILE``; see the module docstring."""
    with open(config_path, encoding="utf-8") as fp:
        config = json.load(fp)
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else ""
    if (command not in ("fg", "init", "psql", "dump", "restore") or (command == "dump" and len(args) > 1)
            or (command == "restore" and len(args) != 1)):
        print(f"usage: bin/{config['name']} fg | init | psql [PSQL ARGS...] | dump [FILE] | restore FILE",
              file=sys.stderr)
        return 2
    try:
        if command == "fg":
            return serve(config)
        started = time.monotonic()
        if command == "dump":
            path = dump(config, *args)
            print(f"{path}: {os.path.getsize(path)} bytes in {time.monotonic() - started:.1f} s", flush=True)
            return 0
        if command == "restore":
            restore(config, args[0])
            print(f"{config['database']}: restored from {args[0]} in {time.monotonic() - started:.1f} s",
                  flush=True)
            return 0
        initialise(config)
        if command == "psql":
            user = server_user(config)
            return subprocess.call(
                [os.path.join(config["bin_directory"], "psql"), "-h", config["socket_directory"],
                 "-p", str(config["port"]), "-d", config["database"], *args],
                cwd=config["directory"], **_as_user(user))
        return 0
    except PostgresError as exc:
        print(f"bin/{config['name']} {command}: {exc}", file=sys.stderr)
        return 1
