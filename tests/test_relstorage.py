"""The stack on RelStorage against a real PostgreSQL 15 (relstorage.cfg; docs/storage.md).

One module-scoped build of relstorage.cfg in a directory of its own, on ports 9650-9663
(``PORTS``): a postgresql part, the page clients ``instance`` (pyruvate) and ``client2``
(waitress) and the upload lane's waitress client ``uploads`` (all RelStorage clients by
relstorage.cfg's one switch), HAProxy,
bin/stack, relstorage.cfg's ``relstorage-tools`` and a second such part, ``migration``, that
converts into a database of its own. It starts the stack, creates the site with
scripts/create_site.py (its 5 MiB blob goes into PostgreSQL), and checks pages, the blob,
the cluster's files, a rolling restart under load and a PostgreSQL restart; then the operations of docs/storage.md: a
FileStorage with a blob moved in by bin/zodbconvert, bin/postgresql dump and restore in
place of a dropped database, and bin/zodbpack. Everything is stopped by PID (bin/stack
stop) and the directory removed at the end.

Why not pytest's tmp_path: it lies below /tmp/pytest-of-<user> (mode 0700), and when the
tests run as root (CI) PostgreSQL runs as the ``postgres`` user, which must be able to enter
every parent directory of its data directory.

About 2-3 minutes on 2 cores, most of it the two clients' start-ups (twice: the restore
needs them stopped) and the site creation.
"""
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time

import psutil
import pytest
import requests

from conftest import ROOT, port_taken, run, while_loaded

pytestmark = pytest.mark.integration

BUILDOUT = os.path.join(ROOT, ".venv-buildout", "bin", "buildout")
BIN_DIRECTORY = "/usr/lib/postgresql/15/bin"
BLOB = "/Plone/blob-5mb/@@download/file"
BLOB_SIZE = 5 * 1024 * 1024
PORTS = {"haproxy": 9650, "instance": 9651, "postgresql": 9652, "uploads": 9653, "stats": 9654,
         "instance-metrics": 9656, "tls": 9655,
         "uploads-metrics": 9657, "zeoserver": 9658, "client2": 9659, "client2-metrics": 9663,
         # buildout.cfg's cache tier, not built here; moved off the demo's ports all the same
         "varnish": 9660, "cache-fill": 9661, "varnish-metrics": 9662}

CONFIG = """\
[buildout]
extends = {root}/relstorage.cfg
develop = {root}/recipes/plonedeploy.recipe {root}/recipes/plonedeploy.runtime
eggs-directory = {root}/eggs
newest = false
parts = postgresql instance client2 uploads haproxy stack relstorage-tools migration

[ports]
{ports}

[instance]

[haproxy]
# two page clients: one serves while bin/stack restart drains the other
backends = instance client2
# The cache tier is the same on either storage (tests/test_cache.py): left out here.
cache =

[stack]
cache =

[migration]
# relstorage.cfg's [relstorage-tools] for a FileStorage of the test's own, into a database
# of its own: the site's database is the running stack's.
<= relstorage-tools
relstorage-dsn = host=127.0.0.1 port={pg_port} dbname=migrated user=plone passfile=${{postgresql:passfile}}
file-storage = ${{buildout:directory}}/var/migration/Data.fs
blob-storage = ${{buildout:directory}}/var/migration/blobstorage
"""


@pytest.fixture(scope="module")
def relstack():
    """Build relstorage.cfg in a fresh directory, start it, create the site; stop it by PID.

    Yields ``(directory, timings)``; ``timings`` collects seconds per step for the report.
    """
    if not os.access(os.path.join(BIN_DIRECTORY, "initdb"), os.X_OK):
        pytest.fail(f"{BIN_DIRECTORY}/initdb missing: run 'make system' (scripts/install-system.sh)")
    taken = {name: port for name, port in PORTS.items() if port_taken(port)}
    if taken:
        pytest.fail(f"ports in use: {taken}")
    directory = tempfile.mkdtemp(prefix="plonedeploy-relstorage-")
    os.chmod(directory, 0o755)  # PostgreSQL's user must enter it (see the module docstring)
    ports = "\n".join(f"{name} = {port}" for name, port in PORTS.items())
    with open(os.path.join(directory, "buildout.cfg"), "w", encoding="utf-8") as fp:
        fp.write(CONFIG.format(root=ROOT, ports=ports, pg_port=PORTS["postgresql"]))
    stack = os.path.join(directory, "bin", "stack")
    timings = {}
    try:
        started = time.monotonic()
        run([BUILDOUT, "-c", os.path.join(directory, "buildout.cfg")], timeout=600, cwd_override=directory)
        timings["bin/buildout"] = time.monotonic() - started
        started = time.monotonic()
        run([stack, "start", "--no-wait-up"], timeout=300, cwd_override=directory)
        timings["bin/stack start"] = time.monotonic() - started
        started = time.monotonic()
        site = run([os.path.join(directory, "bin", "instance"), "run",
                    os.path.join(ROOT, "scripts", "create_site.py")], timeout=600, cwd_override=directory)
        assert "site ready" in site.stdout, site.stdout + site.stderr
        run([stack, "wait-up", "--timeout", "120"], timeout=180, cwd_override=directory)
        timings["create_site + wait-up"] = time.monotonic() - started
        yield directory, timings
    finally:
        stopped = run([stack, "stop"], timeout=180, check=False, cwd_override=directory) \
            if os.path.exists(stack) else None
        leftovers = [p.info for p in psutil.process_iter(["pid", "cmdline"])
                     if any(directory in part for part in (p.info["cmdline"] or []))]
        print(f"\nrelstorage stack: {', '.join(f'{k} {v:.0f} s' for k, v in timings.items())}")
        shutil.rmtree(directory, ignore_errors=not leftovers)
        assert not leftovers, f"processes left after bin/stack stop: {leftovers}\n{stopped and stopped.stdout}"


def _psql(directory, sql, database=None):
    """Run ``sql`` with bin/postgresql psql (the cluster's superuser on its Unix socket), in
    the site's database or ``database``."""
    extra = ["-d", database] if database else []  # psql takes the last -d
    result = run([os.path.join(directory, "bin", "postgresql"), "psql", "-At", "-v", "ON_ERROR_STOP=1",
                  *extra, "-c", sql], timeout=60, cwd_override=directory)
    return result.stdout.strip()


def _admin_session(directory):
    """A requests session that speaks plone.restapi's JSON as the Zope admin."""
    session = requests.Session()
    with open(os.path.join(directory, "var", "admin-password"), encoding="utf-8") as fp:
        session.auth = ("admin", fp.read().strip())
    session.headers["Accept"] = "application/json"
    return session


def _blob_sha256_in_database(directory):
    """The sha256 (hex) of the one 5 MiB blob revision in PostgreSQL's ``blob_chunk`` rows."""
    in_database = _psql(directory, (
        "SELECT encode(sha256(string_agg(lo_get(chunk), ''::bytea ORDER BY chunk_num)), 'hex') "
        "FROM blob_chunk GROUP BY zoid, tid HAVING sum(octet_length(lo_get(chunk))) = "
        f"{BLOB_SIZE}"))
    assert re.fullmatch(r"[0-9a-f]{64}", in_database), in_database
    return in_database


def test_site_and_blob_served_from_postgresql(relstack):
    """/Plone answers 200 through HAProxy and from the client; the 5 MiB blob downloads
    byte-identical to the bytes PostgreSQL holds, and the client's blob cache has it."""
    directory, _ = relstack
    for base in (f"http://127.0.0.1:{PORTS['haproxy']}", f"http://127.0.0.1:{PORTS['instance']}"):
        assert requests.get(base + "/Plone", timeout=60).status_code == 200
    in_database = _blob_sha256_in_database(directory)
    for base in (f"http://127.0.0.1:{PORTS['instance']}", f"http://127.0.0.1:{PORTS['haproxy']}"):
        answer = requests.get(base + BLOB, timeout=60)
        assert answer.status_code == 200 and len(answer.content) == BLOB_SIZE
        assert hashlib.sha256(answer.content).hexdigest() == in_database
    cached = [os.path.join(root, name) for root, _, names in os.walk(os.path.join(directory, "var", "blobcache", "instance"))
              for name in names if name.endswith(".blob")]
    assert any(os.path.getsize(path) == BLOB_SIZE for path in cached), cached


def test_rolling_restart_fails_no_request(relstack):
    """bin/stack restart (each page client drained in HAProxy, restarted, UP again; then the
    upload client, which this HAProxy does not balance) while GETs run
    through HAProxy: none fails, on RelStorage as on ZEO (tests/test_reliability.py)."""
    directory, timings = relstack
    stack = os.path.join(directory, "bin", "stack")
    restart, seconds, done, failures = while_loaded(
        f"http://127.0.0.1:{PORTS['haproxy']}/Plone/@@ok",
        lambda: run([stack, "restart", "--timeout", "120"], timeout=400, cwd_override=directory), threads=2)
    timings["rolling restart"] = seconds
    print(f"\nrolling restart on RelStorage: {seconds:.0f} s, {done} requests, {len(failures)} failed")
    # the page clients are drained and come back UP; uploads has no server in this HAProxy
    assert [line for line in restart.stdout.splitlines() if line.endswith("UP again")] == [
        "instance: UP again", "client2: UP again"], restart.stdout
    assert "uploads: ready after" in restart.stdout, restart.stdout
    assert done > 0
    assert failures == [], failures[:10]


def _postmaster(directory):
    with open(os.path.join(directory, "var", "postgresql", "data", "postmaster.pid"), encoding="ascii") as fp:
        return int(fp.readline())


def test_postgresql_restart_keeps_committed_writes(relstack):
    """Documents POSTed (201) before bin/stack restart postgresql are all there after it,
    read through the upload client, which never loaded them (nothing from a client cache);
    a write after the restart succeeds again."""
    directory, timings = relstack
    session = _admin_session(directory)
    frontend = f"http://127.0.0.1:{PORTS['haproxy']}"
    prefix = f"pg-restart-{int(time.time())}"
    for number in range(3):
        answer = session.post(frontend + "/Plone", json={"@type": "Document", "id": f"{prefix}-{number}",
                                                         "title": f"before {number}"}, timeout=60)
        assert answer.status_code == 201, answer.text[:500]
    old_pid = _postmaster(directory)
    started = time.monotonic()
    restart = run([os.path.join(directory, "bin", "stack"), "restart", "postgresql"], timeout=120,
                  cwd_override=directory)
    timings["postgresql restart"] = time.monotonic() - started
    assert "postgresql: stopped" in restart.stdout, restart.stdout  # not killed after a timeout
    assert _postmaster(directory) != old_pid
    log = open(os.path.join(directory, "var", "log", "postgresql.stdout.log"), encoding="utf-8").read()
    assert "received fast shutdown request" in log
    uploads = f"http://127.0.0.1:{PORTS['uploads']}"
    for number in range(3):
        answer = session.get(f"{uploads}/Plone/{prefix}-{number}", timeout=60)
        assert answer.status_code == 200 and answer.json()["title"] == f"before {number}"
    # The first request after the restart may meet a connection PostgreSQL closed.
    statuses = []
    for _ in range(5):
        statuses.append(session.post(frontend + "/Plone", json={"@type": "Document", "id": f"{prefix}-after",
                                                                 "title": "after"}, timeout=60).status_code)
        if statuses[-1] == 201:
            break
        time.sleep(1)
    print(f"\nwrites after the PostgreSQL restart: {statuses}")
    assert statuses[-1] == 201, statuses
    assert session.get(f"{uploads}/Plone/{prefix}-after", timeout=60).status_code == 200


# Run by the instance part's interpreter (ZODB, RelStorage and psycopg2 on its path).
MAKE_FILESTORAGE = """\
import json, sys
import ZODB, ZODB.FileStorage
from persistent.mapping import PersistentMapping
from ZODB.blob import Blob

path, blob_dir, payload = sys.argv[1:4]
db = ZODB.DB(ZODB.FileStorage.FileStorage(path, blob_dir=blob_dir))
with db.transaction() as conn:
    conn.root()["migrated"] = PersistentMapping(title="before")
with db.transaction() as conn:
    folder = conn.root()["migrated"]
    folder["title"] = "after"  # a second revision: zodbconvert copies history too
    with open(payload, "rb") as fp:
        folder["blob"] = Blob(fp.read())
print(json.dumps({"transactions": len(list(db.storage.iterator()))}))
db.close()
"""

READ_RELSTORAGE = """\
import hashlib, json, sys
import ZODB, ZODB.config

config, blob_cache = sys.argv[1:3]
# zodbpack.conf's one <relstorage> section, with a blob cache of its own that starts empty:
# the blob's bytes come from PostgreSQL.
text = "%import relstorage\\n" + open(config).read()
text = "\\n".join(f"    blob-dir {blob_cache}" if line.strip().startswith("blob-dir ") else line
                   for line in text.splitlines())
storage = ZODB.config.storageFromString(text)
db = ZODB.DB(storage)
conn = db.open()
folder = conn.root()["migrated"]
with folder["blob"].open("r") as fp:
    data = fp.read()
print(json.dumps({"title": folder["title"], "sha256": hashlib.sha256(data).hexdigest(),
                  "transactions": len(list(storage.iterator()))}))
conn.close()
db.close()
"""


def _interpreter(directory, code, *args, timeout=120):
    """Run ``code`` (written to a file) with the instance part's Python; return its last
    stdout line as JSON."""
    path = os.path.join(directory, "var", f"script-{hashlib.sha256(code.encode()).hexdigest()[:8]}.py")
    with open(path, "w", encoding="utf-8") as fp:
        fp.write(code)
    result = run([os.path.join(directory, "parts", "instance", "bin", "interpreter"), path, *args],
                 timeout=timeout, cwd_override=directory)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _password(directory):
    with open(os.path.join(directory, "var", "postgresql", "pgpass"), encoding="ascii") as fp:
        return fp.read().strip().rsplit(":", 1)[1]


def test_zodbconvert_moves_a_filestorage_with_its_blob_into_postgresql(relstack):
    """docs/storage.md's migration: with the built config, bin/zodbconvert --dry-run lists
    the transactions of a FileStorage made here (two transactions, a 1 MiB blob) and
    bin/zodbconvert copies them into an empty database; read back through RelStorage with
    an empty blob cache, the title, the blob's sha256 and the number of transactions are the
    source's. A second run refuses a destination that has data."""
    directory, timings = relstack
    source = os.path.join(directory, "var", "migration")
    os.makedirs(source)
    payload = os.urandom(1024 * 1024 + 17)
    with open(os.path.join(source, "payload"), "wb") as fp:
        fp.write(payload)
    made = _interpreter(directory, MAKE_FILESTORAGE, os.path.join(source, "Data.fs"),
                        os.path.join(source, "blobstorage"), os.path.join(source, "payload"))
    assert made["transactions"] == 3  # ZODB's root, then the two above
    _psql(directory, "CREATE DATABASE migrated OWNER plone")
    config = os.path.join(directory, "parts", "migration", "zodbconvert.conf")
    text = open(config, encoding="utf-8").read()
    assert f"passfile={directory}/var/postgresql/pgpass" in text and _password(directory) not in text
    zodbconvert = os.path.join(directory, "bin", "zodbconvert")
    dry = run([zodbconvert, "--dry-run", config], timeout=300, cwd_override=directory)
    assert f"Would copy {made['transactions']} transactions" in dry.stdout + dry.stderr, dry.stderr
    started = time.monotonic()
    converted = run([zodbconvert, config], timeout=300, cwd_override=directory)
    timings["zodbconvert (1 MiB blob)"] = time.monotonic() - started
    assert _password(directory) not in converted.stdout + converted.stderr
    again = run([zodbconvert, config], timeout=300, check=False, cwd_override=directory)
    assert again.returncode != 0 and "the destination storage has data" in again.stdout + again.stderr
    read = _interpreter(directory, READ_RELSTORAGE, os.path.join(directory, "parts", "migration", "zodbpack.conf"),
                        tempfile.mkdtemp(prefix="blobcache-", dir=os.path.join(directory, "var")))
    assert read == {"title": "after", "sha256": hashlib.sha256(payload).hexdigest(),
                    "transactions": made["transactions"]}


def test_dump_and_restore_bring_back_content_and_blob(relstack):
    """bin/postgresql dump while the clients run; a document written after it; a restore
    refused while the clients are connected; the stack stopped and PostgreSQL started alone
    (docs/storage.md's steps); a truncated dump refused with the database untouched; the
    site's database dropped, bin/postgresql restore, the stack started with empty blob
    caches: the document from before the dump is there, the one from after it is not, and
    the 5 MiB blob downloads with the sha256 it had."""
    directory, timings = relstack
    session = _admin_session(directory)
    frontend = f"http://127.0.0.1:{PORTS['haproxy']}"
    prefix = f"backup-{int(time.time())}"
    blob = hashlib.sha256(requests.get(frontend + BLOB, timeout=60).content).hexdigest()
    assert blob == _blob_sha256_in_database(directory)
    answer = session.post(frontend + "/Plone", json={"@type": "Document", "id": f"{prefix}-kept",
                                                     "title": "in the dump"}, timeout=60)
    assert answer.status_code == 201, answer.text[:500]
    postgresql = os.path.join(directory, "bin", "postgresql")
    started = time.monotonic()
    dumped = run([postgresql, "dump"], timeout=300, cwd_override=directory)
    timings["pg_dump"] = time.monotonic() - started
    path = dumped.stdout.split(":")[0]
    assert os.path.dirname(path) == os.path.join(directory, "var", "postgresql-backups"), dumped.stdout
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and os.path.getsize(path) > BLOB_SIZE
    answer = session.post(frontend + "/Plone", json={"@type": "Document", "id": f"{prefix}-lost",
                                                     "title": "after the dump"}, timeout=60)
    assert answer.status_code == 201, answer.text[:500]
    # With the clients connected, the restore stops before it replaces anything.
    refused = run([postgresql, "restore", path], timeout=300, check=False, cwd_override=directory)
    assert refused.returncode == 1 and "is being accessed by other users" in refused.stderr, refused.stderr
    assert "Stop the clients" in refused.stderr
    stack = os.path.join(directory, "bin", "stack")
    outage = time.monotonic()
    run([stack, "stop"], timeout=120, cwd_override=directory)
    run([stack, "start", "postgresql"], timeout=120, cwd_override=directory)  # the database alone
    assert not port_taken(PORTS["instance"]) and not port_taken(PORTS["haproxy"])
    # A truncated dump fails in pg_restore and leaves the site's database as it was.
    revisions = _psql(directory, "SELECT count(*) FROM object_state")
    truncated = path + ".truncated"
    with open(path, "rb") as whole, open(truncated, "wb") as part:
        part.write(whole.read(os.path.getsize(path) // 2))
    damaged = run([postgresql, "restore", truncated], timeout=300, check=False, cwd_override=directory)
    assert damaged.returncode == 1 and "plone is unchanged" in damaged.stderr, damaged.stderr
    assert _psql(directory, "SELECT count(*) FROM object_state") == revisions
    _psql(directory, "DROP DATABASE plone", database="postgres")
    for client in ("instance", "uploads"):  # the blob must come from the restored database
        cache = os.path.join(directory, "var", "blobcache", client)
        if os.path.isdir(cache):
            shutil.rmtree(cache)
    started = time.monotonic()
    restored = run([postgresql, "restore", path], timeout=300, cwd_override=directory)
    timings["pg_restore"] = time.monotonic() - started
    size = _psql(directory, "SELECT pg_database_size('plone')")
    print(f"\n{dumped.stdout.strip()}\n{restored.stdout.strip()}; pg_database_size {size} bytes")
    started = time.monotonic()
    run([stack, "start"], timeout=400, cwd_override=directory)
    timings["bin/stack start after the restore"] = time.monotonic() - started
    timings["restore outage, bin/stack stop to all UP"] = time.monotonic() - outage
    uploads = f"http://127.0.0.1:{PORTS['uploads']}"
    assert session.get(f"{uploads}/Plone/{prefix}-kept", timeout=60).json()["title"] == "in the dump"
    assert session.get(f"{uploads}/Plone/{prefix}-lost", timeout=60).status_code == 404
    for base in (f"http://127.0.0.1:{PORTS['instance']}", frontend):
        answer = requests.get(base + BLOB, timeout=60)
        assert answer.status_code == 200 and hashlib.sha256(answer.content).hexdigest() == blob


def test_zodbpack_removes_history_and_leaves_the_site_readable(relstack):
    """bin/zodbpack -d 0 with the built config, beside the running clients: fewer object
    revisions in PostgreSQL afterwards (the site's history is gone), /Plone still answers
    and the blob is still the same bytes."""
    directory, timings = relstack
    revisions = "SELECT count(*) FROM object_state"
    before = int(_psql(directory, revisions))
    blob = _blob_sha256_in_database(directory)
    started = time.monotonic()
    packed = run([os.path.join(directory, "bin", "zodbpack"), "-d", "0",
                  os.path.join(directory, "parts", "relstorage-tools", "zodbpack.conf")],
                 timeout=300, cwd_override=directory)
    timings["zodbpack"] = time.monotonic() - started
    assert "Packed" in packed.stdout + packed.stderr
    after = int(_psql(directory, revisions))
    print(f"\nobject_state rows: {before} before zodbpack -d 0, {after} after")
    assert after < before
    assert _blob_sha256_in_database(directory) == blob
    frontend = f"http://127.0.0.1:{PORTS['haproxy']}"
    assert requests.get(frontend + "/Plone", timeout=60).status_code == 200
    answer = requests.get(f"http://127.0.0.1:{PORTS['uploads']}" + BLOB, timeout=60)
    assert answer.status_code == 200 and hashlib.sha256(answer.content).hexdigest() == blob


def test_cluster_files_and_secrets(relstack):
    """The cluster lives in var/postgresql, owned by its server's user, listening on
    127.0.0.1 only; the generated password is in a 0600 passfile, in no config file and
    not in any log. Last in the module: after the conversion, the dumps, the restores and
    the pack, so it reads their configs and what PostgreSQL logged of them too."""
    directory, _ = relstack
    base = os.path.join(directory, "var", "postgresql")
    passfile = os.path.join(base, "pgpass")
    assert stat.S_IMODE(os.stat(passfile).st_mode) == 0o600
    password = _password(directory)
    assert len(password) >= 32
    data = os.stat(os.path.join(base, "data"))
    assert stat.S_IMODE(data.st_mode) == 0o700
    if os.geteuid() == 0:
        assert data.st_uid == psutil.Process(_postmaster(directory)).uids().real != 0
    listening = {c.laddr for c in psutil.net_connections("inet") if c.status == "LISTEN"
                 and c.laddr.port == PORTS["postgresql"]}
    assert listening == {("127.0.0.1", PORTS["postgresql"])}, listening
    for root in (os.path.join(directory, "parts"), os.path.join(directory, "var", "log")):
        for folder, _, names in os.walk(root):
            for name in names:
                with open(os.path.join(folder, name), "rb") as fp:
                    assert password.encode() not in fp.read(), os.path.join(folder, name)
