"""The stack on RelStorage against a real PostgreSQL 15 (relstorage.cfg; docs/storage.md).

One module-scoped build of relstorage.cfg in a directory of its own, on ports 9650-9662
(``PORTS``): a postgresql part, the pyruvate client ``instance`` and the upload lane's
waitress client ``uploads`` (both RelStorage clients by relstorage.cfg's one switch), HAProxy
and bin/stack. It starts the stack, creates the site with scripts/create_site.py (its 5 MiB
blob goes into PostgreSQL), and checks pages, the blob, the cluster's files and a PostgreSQL
restart. Everything is stopped by PID (bin/stack stop) and the directory removed at the end.

Why not pytest's tmp_path: it lies below /tmp/pytest-of-<user> (mode 0700), and when the
tests run as root (CI) PostgreSQL runs as the ``postgres`` user, which must be able to enter
every parent directory of its data directory.

About 2-3 minutes on 2 cores, most of it the two clients' start-ups and the site creation.
"""
import hashlib
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

from conftest import ROOT, port_taken, run

pytestmark = pytest.mark.integration

BUILDOUT = os.path.join(ROOT, ".venv-buildout", "bin", "buildout")
BIN_DIRECTORY = "/usr/lib/postgresql/15/bin"
BLOB = "/Plone/blob-5mb/@@download/file"
BLOB_SIZE = 5 * 1024 * 1024
PORTS = {"haproxy": 9650, "instance": 9651, "postgresql": 9652, "uploads": 9653, "stats": 9654,
         "instance-metrics": 9656, "tls": 9655,
         "uploads-metrics": 9657, "zeoserver": 9658, "client2": 9659,
         # buildout.cfg's cache tier, not built here; moved off the demo's ports all the same
         "varnish": 9660, "cache-fill": 9661, "varnish-metrics": 9662}

CONFIG = """\
[buildout]
extends = {root}/relstorage.cfg
develop = {root}/recipes/plonedeploy.recipe
eggs-directory = {root}/eggs
newest = false
parts = postgresql instance uploads haproxy stack

[ports]
{ports}

[instance]
templates-directory = {root}/templates

[haproxy]
template = {root}/haproxy/haproxy.cfg.j2
backends = instance
# The cache tier is the same on either storage (tests/test_cache.py): left out here.
cache =

[stack]
cache =
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
        fp.write(CONFIG.format(root=ROOT, ports=ports))
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


def _psql(directory, sql):
    """Run ``sql`` with bin/postgresql psql (the cluster's superuser on its Unix socket)."""
    result = run([os.path.join(directory, "bin", "postgresql"), "psql", "-At", "-v", "ON_ERROR_STOP=1",
                  "-c", sql], timeout=60, cwd_override=directory)
    return result.stdout.strip()


def _admin(directory):
    with open(os.path.join(directory, "var", "admin-password"), encoding="utf-8") as fp:
        return ("admin", fp.read().strip())


def test_site_and_blob_served_from_postgresql(relstack):
    """/Plone answers 200 through HAProxy and from the client; the 5 MiB blob downloads
    byte-identical to the bytes PostgreSQL holds, and the client's blob cache has it."""
    directory, _ = relstack
    for base in (f"http://127.0.0.1:{PORTS['haproxy']}", f"http://127.0.0.1:{PORTS['instance']}"):
        assert requests.get(base + "/Plone", timeout=60).status_code == 200
    in_database = _psql(directory, (
        "SELECT encode(sha256(string_agg(lo_get(chunk), ''::bytea ORDER BY chunk_num)), 'hex') "
        "FROM blob_chunk GROUP BY zoid, tid HAVING sum(octet_length(lo_get(chunk))) = "
        f"{BLOB_SIZE}"))
    assert re.fullmatch(r"[0-9a-f]{64}", in_database), in_database
    for base in (f"http://127.0.0.1:{PORTS['instance']}", f"http://127.0.0.1:{PORTS['haproxy']}"):
        answer = requests.get(base + BLOB, timeout=60)
        assert answer.status_code == 200 and len(answer.content) == BLOB_SIZE
        assert hashlib.sha256(answer.content).hexdigest() == in_database
    cached = [os.path.join(root, name) for root, _, names in os.walk(os.path.join(directory, "var", "blobcache", "instance"))
              for name in names if name.endswith(".blob")]
    assert any(os.path.getsize(path) == BLOB_SIZE for path in cached), cached


def test_cluster_files_and_secrets(relstack):
    """The cluster lives in var/postgresql, owned by its server's user, listening on
    127.0.0.1 only; the generated password is in a 0600 passfile, in no config file and
    not in any log."""
    directory, _ = relstack
    base = os.path.join(directory, "var", "postgresql")
    passfile = os.path.join(base, "pgpass")
    assert stat.S_IMODE(os.stat(passfile).st_mode) == 0o600
    password = open(passfile, encoding="ascii").read().strip().rsplit(":", 1)[1]
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


def _postmaster(directory):
    with open(os.path.join(directory, "var", "postgresql", "data", "postmaster.pid"), encoding="ascii") as fp:
        return int(fp.readline())


def test_postgresql_restart_keeps_committed_writes(relstack):
    """Documents POSTed (201) before bin/stack restart postgresql are all there after it,
    read through the upload client, which never loaded them (nothing from a client cache);
    a write after the restart succeeds again."""
    directory, timings = relstack
    session = requests.Session()
    session.auth = _admin(directory)
    session.headers["Accept"] = "application/json"
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
