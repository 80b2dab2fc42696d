"""The stack on RelStorage against a real PostgreSQL 15 (relstorage.cfg; docs/how-to/relstorage.md).

One module-scoped build of relstorage.cfg in a directory of its own, on ports 9650-9663
(``PORTS``): a postgresql part, the page clients ``instance`` (pyruvate) and ``client2``
(waitress) and the upload lane's waitress client ``uploads`` (all RelStorage clients by
relstorage.cfg's one switch), HAProxy, bin/stack, relstorage.cfg's ``relstorage-tools``,
and for the migration: ``filesite`` (a client on a FileStorage, never started, that
scripts/create_site.py writes the demo site into), ``migration`` (a relstorage-tools part
converting that Data.fs into a database of its own) and ``converted`` (a RelStorage client of
that database, started by the conversion test alone, on 9658). It starts the stack, creates the site with
scripts/create_site.py (its 5 MiB blob goes into PostgreSQL), and checks pages, the blob,
a rolling restart under load and a PostgreSQL restart under writes; then the operations of
docs/how-to/relstorage.md: the demo site moved from a Data.fs by bin/zodbconvert and served from
PostgreSQL, bin/postgresql dump and restore in place of a dropped database, bin/zodbpack,
and last the cluster's files. Everything is stopped by PID (bin/stack stop) and the
directory removed at the end.

Why not pytest's tmp_path: it lies below /tmp/pytest-of-<user> (mode 0700), and when the
tests run as root (CI) PostgreSQL runs as the ``postgres`` user, which must be able to enter
every parent directory of its data directory.

Most of its time is the clients' start-ups (twice: the restore needs them stopped; and the
converted site's client) and the site creation (twice: into PostgreSQL and into the Data.fs
to convert). 130-175 s on a quiet 2-core machine before the demo site's conversion was
added; 878 s on 25 Nov 2026 with other test runs beside it (load average 5-7), of it 96 s
for the conversion test (docs/how-to/relstorage.md, "What is tested").
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

from conftest import (RESTART_LOAD_RATE, ROOT, assert_loaded_throughout, longest_gap, port_taken, run, setup_budget,
                      stop_group, wait_for, while_loaded)
from loadtests.core.extrabuild import BUILDOUT, checkout_header
from metrics_address import readiness

pytestmark = pytest.mark.integration

BIN_DIRECTORY = "/usr/lib/postgresql/15/bin"
BLOB = "/Plone/blob-5mb/@@download/file"
BLOB_SIZE = 5 * 1024 * 1024
PORTS = {"haproxy": 9650, "instance": 9651, "postgresql": 9652, "uploads": 9653, "stats": 9654,
         "instance-metrics": 9656, "tls": 9655,
         "uploads-metrics": 9657, "converted": 9658, "client2": 9659, "client2-metrics": 9663,
         # buildout.cfg's cache tier, not built here; moved off the demo's ports all the same
         "varnish": 9660, "cache-fill": 9661, "varnish-metrics": 9662}

# The [buildout] section is loadtests.core.extrabuild.checkout_header's; the rest is str.format'ed.
CONFIG = checkout_header(os.path.join(ROOT, "relstorage.cfg"), [
    "postgresql", "instance", "client2", "uploads", "haproxy", "stack", "relstorage-tools", "migration",
    "filesite", "converted"]) + """

[ports]
{ports}

[instance]
# /readyz counts PostgreSQL away only after this many seconds (default 30 s): shorter here so
# that test_postgresql_away_longer_than_the_grace... waits 10 s, not 30; a PostgreSQL
# restart (2-5 s) stays within it.
storage-grace = 10

[haproxy]
# two page clients: one serves while bin/stack restart drains the other
backends = instance client2
# The cache tier is the same on either storage (tests/test_cache.py): left out here.
cache =

[stack]
cache =

[filesite]
# The demo site as a ZEO build stores it (buildout.cfg's [zeoserver] paths): a FileStorage
# Data.fs with a blob directory, written by "bin/filesite run scripts/create_site.py" with
# the storage opened in that process (the FileStorage that runzeo would serve). Never started.
<= instance
storage = zeo
zeo-client = off
file-storage = ${{buildout:directory}}/var/filestorage/Data.fs
blob-storage = ${{buildout:directory}}/var/blobstorage
http-address = 127.0.0.1:${{ports:converted}}
metrics-address =

[migration]
# relstorage.cfg's [relstorage-tools] for that Data.fs, into a database of its own: the
# site's database is the running stack's.
<= relstorage-tools
relstorage-dsn = host=127.0.0.1 port={pg_port} dbname=migrated user=plone passfile=${{postgresql:passfile}}
file-storage = ${{filesite:file-storage}}
blob-storage = ${{filesite:blob-storage}}

[converted]
# A RelStorage client of the converted database, started by the conversion test alone.
<= instance
relstorage-dsn = ${{migration:relstorage-dsn}}
http-address = 127.0.0.1:${{ports:converted}}
metrics-address =
"""


@pytest.fixture(scope="module")
@setup_budget(600)  # bin/buildout, bin/stack start and the site (the module: 130-175 s quiet, 878 s busy, all tests)
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


def _admin_auth(directory):
    """``("admin", password)`` of the Zope admin (var/admin-password, scripts/create_site.py)."""
    with open(os.path.join(directory, "var", "admin-password"), encoding="utf-8") as fp:
        return ("admin", fp.read().strip())


def _admin_session(directory):
    """A requests session that speaks plone.restapi's JSON as the Zope admin."""
    session = requests.Session()
    session.auth = _admin_auth(directory)
    session.headers["Accept"] = "application/json"
    return session


def _blob_sha256_in_database(directory, database=None):
    """The sha256 (hex) of the one 5 MiB blob revision in PostgreSQL's ``blob_chunk`` rows
    (of the site's database or ``database``)."""
    in_database = _psql(directory, (
        "SELECT encode(sha256(string_agg(lo_get(chunk), ''::bytea ORDER BY chunk_num)), 'hex') "
        "FROM blob_chunk GROUP BY zoid, tid HAVING sum(octet_length(lo_get(chunk))) = "
        f"{BLOB_SIZE}"), database)
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
    blobcache = os.path.join(directory, "var", "blobcache", "instance")
    cached = [os.path.join(root, name) for root, _, names in os.walk(blobcache)
              for name in names if name.endswith(".blob")]
    assert any(os.path.getsize(path) == BLOB_SIZE for path in cached), cached


def test_rolling_restart_fails_no_request(relstack):
    """bin/stack restart (each page client drained in HAProxy, restarted, UP again; then the
    upload lane's only client, the same way: plonedeploy.stack.rolling) while GETs run
    through HAProxy: none fails, on RelStorage as on ZEO (tests/test_reliability.py)."""
    directory, timings = relstack
    stack = os.path.join(directory, "bin", "stack")
    log = []
    restart, seconds, done, failures = while_loaded(
        f"http://127.0.0.1:{PORTS['haproxy']}/Plone/@@ok",
        # --timeout 300 per client: the upload client took more than 120 s to start beside the
        # other xdist group on a loaded machine (26 Nov)
        lambda: run([stack, "restart", "--timeout", "300"], timeout=1000, cwd_override=directory), threads=2,
        log=log, rate=RESTART_LOAD_RATE)
    timings["rolling restart"] = seconds
    print(f"\nrolling restart on RelStorage: {seconds:.0f} s, {done} requests, {len(failures)} failed")
    # every client HAProxy balances is drained and comes back UP, the upload lane's too
    assert [line for line in restart.stdout.splitlines() if line.endswith("UP again")] == [
        "instance: UP again", "client2: UP again", "uploads: UP again"], restart.stdout
    assert "uploads: ready after" in restart.stdout, restart.stdout
    assert_loaded_throughout(log, seconds)
    assert failures == [], failures[:10]


def _postmaster(directory):
    with open(os.path.join(directory, "var", "postgresql", "data", "postmaster.pid"), encoding="ascii") as fp:
        return int(fp.readline())


def test_postgresql_restart_loses_no_committed_write(relstack):
    """tests/test_reliability.py's ZEO restart test on RelStorage: plone.restapi POSTs of
    documents through HAProxy in a closed loop, and GETs of /Plone/@@ok beside them, before,
    during and after bin/stack restart postgresql (fast shutdown, new postmaster). Every
    document that got 201 is read back through the upload client, which never loaded it
    (nothing from a client cache); writes succeed again after the restart. Printed: the
    restart's seconds, the writes and reads that failed during it and the longest gap
    without a successful write (read)."""
    directory, timings = relstack
    session = _admin_session(directory)
    frontend = f"http://127.0.0.1:{PORTS['haproxy']}"
    prefix = f"pg-restart-{int(time.time())}"
    auth = _admin_auth(directory)

    def post(session, url, number):
        return session.post(url, json={"@type": "Document", "id": f"{prefix}-{number}",
                                       "title": f"PostgreSQL restart {number}"},
                            auth=auth, headers={"Accept": "application/json"}, timeout=30)

    writes, reads, marks = [], [], {}
    old_pid = _postmaster(directory)

    def restart_and_recover():
        time.sleep(2)  # committed writes before the restart
        marks["restart"] = time.monotonic()
        restart = run([os.path.join(directory, "bin", "stack"), "restart", "postgresql"], timeout=120,
                      cwd_override=directory)
        marks["restarted"] = time.monotonic()
        deadline = marks["restarted"] + 60
        while time.monotonic() < deadline and not any(
                ok and started > marks["restarted"] for _, started, _, ok in writes):
            time.sleep(0.2)
        time.sleep(1)  # a few more writes after the first that succeeded again
        return restart

    def written_during_reads():
        return while_loaded(frontend + "/Plone", restart_and_recover, threads=1, send=post, expect=201,
                            log=writes)

    (restart, seconds, _, write_failures), _, _, read_failures = while_loaded(
        frontend + "/Plone/@@ok", written_during_reads, threads=1, log=reads)
    timings["postgresql restart"] = marks["restarted"] - marks["restart"]
    assert "postgresql: stopped" in restart.stdout, restart.stdout  # not killed after a timeout
    assert _postmaster(directory) != old_pid
    # stopped and started again through the stack's supervisord, which keeps it running
    from plonedeploy.stack.supervisor import running_pids
    config = json.load(open(os.path.join(directory, "parts", "stack", "stack.json"), encoding="utf-8"))
    supervisord = int(open(os.path.join(directory, "var", "run", "supervisord.pid"), encoding="ascii").read())
    assert psutil.Process(running_pids(config)["postgresql"]).ppid() == supervisord
    log = open(os.path.join(directory, "var", "log", "postgresql.stdout.log"), encoding="utf-8").read()
    assert "received fast shutdown request" in log
    committed = sorted(number for number, _, _, ok in writes if ok)
    write_gap, read_gap = longest_gap(writes), longest_gap(reads)
    failed = sorted((started, finished) for _, started, finished, ok in writes if not ok)
    # A closed loop: a failure returns in milliseconds, so the count says little; the window
    # (seconds from the start of bin/stack restart) and the gap say how long writes failed.
    window = (f"{failed[0][0] - marks['restart']:+.1f} to {failed[-1][1] - marks['restart']:+.1f} s"
              if failed else "none")
    uploads = f"http://127.0.0.1:{PORTS['uploads']}"
    lost = [number for number in committed
            if session.get(f"{uploads}/Plone/{prefix}-{number}", timeout=60).status_code != 200]
    print(f"\nPostgreSQL restart under writes: bin/stack restart postgresql {timings['postgresql restart']:.1f} s; "
          f"{len(writes)} POSTs ({len(write_failures)} failed: {sorted(set(map(str, write_failures)))}, "
          f"from {window}), longest gap without a 201 {write_gap:.1f} s; {len(reads)} GETs of @@ok "
          f"({len(read_failures)} failed), longest gap without a 200 {read_gap:.1f} s; "
          f"{len(committed)} documents committed, {len(committed) - len(lost)} of them read back")
    assert any(ok and finished < marks["restart"] for _, _, finished, ok in writes), "no write before the restart"
    assert any(ok and started > marks["restarted"] for _, started, _, ok in writes), \
        "no successful write within 60 s after PostgreSQL came back"
    assert [ok for *_, ok in sorted(reads)[-3:]] == [True] * 3, "reads still failing at the end"
    assert not lost, f"documents that got 201 but are not in PostgreSQL: {lost}"


def test_postgresql_away_longer_than_the_grace_makes_clients_not_ready_but_live(relstack):
    """tests/test_selfheal.py's ZEO grace test on RelStorage, whose clients keep no
    connection to watch: each client's /readyz pings PostgreSQL (probes.DatabasePing, every
    5 s). PostgreSQL stopped: every /readyz stays 200 and every server UP for the first half
    of storage-grace (10 s in this build), then 503 "storage disconnected" while /livez
    stays 200, and HAProxy takes the clients out; PostgreSQL back: all ready and UP again."""
    from plonedeploy.stack import balancer as stack_balancer, supervisor as stack_supervisor

    directory, timings = relstack
    grace, ping = 10.0, 5.0
    config = json.load(open(os.path.join(directory, "parts", "stack", "stack.json"), encoding="utf-8"))
    bases = {name: f"http://127.0.0.1:{PORTS[name + '-metrics']}" for name in ("instance", "client2", "uploads")}

    def status(url):
        try:
            return requests.get(url, timeout=5).status_code
        except requests.RequestException as exc:
            return repr(exc)

    def states():  # {client: HAProxy status}, each in its own backend (pool, upload lane)
        return stack_balancer.server_states(config, timeout=5)

    # Every client's /readyz says "ready", not "ready; storage disconnected for N s": a client
    # whose ping had not yet seen PostgreSQL back after the restart test before this one
    # counts on from that outage and reaches the grace early (CI, 27 Nov: client2 503 at 5 s).
    # HAProxy's UP says neither. Up to two pings (5 s each) and the check interval.
    settled = wait_for(lambda: set(readiness(bases).values()) == {(200, "ready")}, 30,
                       "/readyz 'ready' on every client before PostgreSQL is stopped",
                       detail=lambda: readiness(bases))
    assert set(states().values()) == {"UP"}, states()
    stack_supervisor.stop_process(config, "postgresql")
    try:
        stopped = time.monotonic()
        time.sleep(grace / 2)
        half = readiness(bases)
        assert {code for code, _ in half.values()} == {200}, half
        assert all(text.startswith("ready; storage disconnected for ") for _, text in half.values()), half
        assert set(states().values()) == {"UP"}, states()
        wait_for(lambda: all(code == 503 for code, _ in readiness(bases).values()),
                 grace + 3 * ping + 10, "/readyz 503 on every client", detail=lambda: readiness(bases))
        after = time.monotonic() - stopped
        answers = {name: requests.get(base + "/readyz", timeout=5).text for name, base in bases.items()}
        assert all(text.startswith("storage disconnected for ") for text in answers.values()), answers
        assert all(status(base + "/livez") == 200 for base in bases.values())
        wait_for(lambda: set(states().values()) == {"DOWN"}, 30, "every server DOWN in HAProxy")
        page = requests.get(f"http://127.0.0.1:{PORTS['haproxy']}/Plone", timeout=30).status_code
    finally:
        run([os.path.join(directory, "bin", "stack"), "start", "postgresql"], timeout=120, cwd_override=directory)
    back = wait_for(lambda: set(states().values()) == {"UP"}, 120, "every server UP after PostgreSQL came back")
    timings["postgresql away, readyz"] = after
    print(f"\nEvery /readyz 'ready' {settled:.1f} s after the test began; "
          f"PostgreSQL stopped: every /readyz 503 after {after:.1f} s (storage-grace {grace:g} s), "
          f"/livez 200, /Plone through HAProxy {page}; PostgreSQL back: all UP after {back:.1f} s")
    assert after > grace
    assert page == 503
    assert requests.get(f"http://127.0.0.1:{PORTS['haproxy']}/Plone", timeout=30).status_code == 200


def _password(directory):
    with open(os.path.join(directory, "var", "postgresql", "pgpass"), encoding="ascii") as fp:
        return fp.read().strip().rsplit(":", 1)[1]


def _wait_http(url, process, timeout=180):
    """Wait until ``url`` answers 200 while ``process`` (a Popen) runs; fail the test otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if requests.get(url, timeout=10).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} did not answer 200 within {timeout} s (exit status {process.poll()})")


def test_zodbconvert_moves_the_demo_site_into_postgresql(relstack):
    """docs/how-to/relstorage.md's migration on the demo site: scripts/create_site.py writes the site
    with its 5 MiB blob into a FileStorage Data.fs and blob directory (where a ZEO build keeps
    them); with the built config bin/zodbconvert --dry-run lists its transactions and
    bin/zodbconvert copies all of them (history too) into an empty database; a RelStorage client
    of that database, started with an empty blob cache, serves /Plone and the blob with the
    source blob's sha256 from PostgreSQL's bytes. Data.fs is left as it was; no password in
    the output; a second run refuses a destination that has data."""
    directory, timings = relstack
    started = time.monotonic()
    site = run([os.path.join(directory, "bin", "filesite"), "run", os.path.join(ROOT, "scripts", "create_site.py")],
               timeout=600, cwd_override=directory)
    assert "site ready" in site.stdout, site.stdout + site.stderr
    timings["create_site into a FileStorage"] = time.monotonic() - started
    data_fs = os.path.join(directory, "var", "filestorage", "Data.fs")
    blobs = [os.path.join(folder, name) for folder, _, names in os.walk(os.path.join(directory, "var", "blobstorage"))
             for name in names if name.endswith(".blob")]
    source_blob = {hashlib.sha256(open(path, "rb").read()).hexdigest() for path in blobs
                   if os.path.getsize(path) == BLOB_SIZE}
    assert len(source_blob) == 1, blobs
    before = (os.path.getsize(data_fs), os.stat(data_fs).st_mtime_ns)
    _psql(directory, "CREATE DATABASE migrated OWNER plone")
    config = os.path.join(directory, "parts", "migration", "zodbconvert.conf")
    text = open(config, encoding="utf-8").read()
    assert f"path {data_fs}\n" in text and f"passfile={directory}/var/postgresql/pgpass" in text
    assert _password(directory) not in text
    zodbconvert = os.path.join(directory, "bin", "zodbconvert")
    dry = run([zodbconvert, "--dry-run", config], timeout=300, cwd_override=directory)
    planned = re.search(r"Would copy (\d+) transactions", dry.stdout + dry.stderr)
    assert planned and int(planned.group(1)) > 10, dry.stdout + dry.stderr
    started = time.monotonic()
    converted = run([zodbconvert, config], timeout=600, cwd_override=directory)
    timings["zodbconvert (the demo site)"] = time.monotonic() - started
    output = converted.stdout + converted.stderr
    assert _password(directory) not in output
    copied = _psql(directory, "SELECT count(*) FROM transaction WHERE tid > 0", database="migrated")
    print(f"\nzodbconvert of the demo site: {planned.group(1)} transactions planned, {copied} in PostgreSQL, "
          f"Data.fs {before[0]} bytes, {timings['zodbconvert (the demo site)']:.1f} s")
    assert int(copied) == int(planned.group(1))
    assert _blob_sha256_in_database(directory, database="migrated") == source_blob.pop()
    assert (os.path.getsize(data_fs), os.stat(data_fs).st_mtime_ns) == before
    again = run([zodbconvert, config], timeout=300, check=False, cwd_override=directory)
    assert again.returncode != 0 and "the destination storage has data" in again.stdout + again.stderr
    # Served from PostgreSQL: the client's blob cache starts empty.
    assert not os.path.exists(os.path.join(directory, "var", "blobcache", "converted"))
    with open(os.path.join(directory, "var", "log", "converted.stdout.log"), "ab") as log:
        process = subprocess.Popen([os.path.join(directory, "bin", "converted"), "console"], cwd=directory,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{PORTS['converted']}"
        started = time.monotonic()
        _wait_http(base + "/Plone/@@ok", process)
        timings["converted client up"] = time.monotonic() - started
        page = requests.get(base + "/Plone", timeout=60)
        assert page.status_code == 200 and "<html" in page.text
        answer = requests.get(base + BLOB, timeout=60)
        assert answer.status_code == 200 and len(answer.content) == BLOB_SIZE
        assert hashlib.sha256(answer.content).hexdigest() == _blob_sha256_in_database(directory, "migrated")
    finally:
        stop_group(process)


def test_dump_and_restore_bring_back_content_and_blob(relstack):
    """bin/postgresql dump while the clients run; a document written after it; a restore
    refused while the clients are connected; the stack stopped and PostgreSQL started alone
    (docs/how-to/relstorage.md's steps); a truncated dump refused with the database untouched; the
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
