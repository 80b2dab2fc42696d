"""Every added wsgi-server value really serves Zope: one ZEO client at a time, on the
session stack's ZEO server and blob directory (so /Plone and its 5 MiB blob exist).

The clients are the ``c_<server>`` parts of ``servers_build`` (conftest.py), on the ports
after this build's client2. Each test starts one with ``bin/c_<server> console`` (the way
bin/stack starts a client), waits for ``GET /``, checks ``/``, ``/Plone``, the blob,
keep-alive, and the process model (how many processes, and that exactly one of them
holds a ZEO connection), then stops it with SIGTERM to its process group. pyruvate and
waitress are left out: they are the session stack's own clients, checked on the same
paths by tests/test_integration.py. About 15 s per server here. mod_wsgi started as root
runs as www-data (its run-as): the test opens pytest's directories to it (o+x) while it runs,
and the runner itself gives www-data search permission by ACL on the checkout's closed
parents (root's home, a ``mktemp -d`` clone), which the test checks: no skip.
"""
import http.client
import os
import pathlib
import signal
import subprocess
import time

import psutil
import pytest
import requests

from conftest import ROOT, port_taken

pytestmark = pytest.mark.integration

BLOB_SIZE = 5 * 1024 * 1024
STARTED_WITHIN = 180  # seconds for Zope to start on a busy 2-core machine
#: Processes per client: the supervisor factories (servers/__init__.py) run a supervisor
#: that never loads Zope plus one worker; the others serve in runwsgi's process. mod_wsgi:
#: Apache's parent, its event-MPM children (one at start, more under load: Apache spawns
#: them itself) and one mod_wsgi daemon process.
PROCESSES = {"gunicorn": 2, "granian": 2, "mod_wsgi": range(3, 8)}
#: ``Server`` header each server sends (bjoern and uWSGI send none).
SERVER_HEADER = {"gunicorn": "gunicorn", "cheroot": "Cheroot/", "granian": "granian",
                 "gevent": "gevent/", "bjoern": None, "uwsgi": None, "mod_wsgi": "Apache"}


def _wait_for_root(url, proc, log):
    deadline = time.monotonic() + STARTED_WITHIN
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"client exited {proc.returncode} before serving:\n{log.read_text()[-3000:]}")
        try:
            response = requests.get(url + "/", timeout=10)
            if response.status_code == 200:
                return response
        except requests.RequestException:  # refused, or accepted by a supervisor whose worker is not up yet
            pass
        time.sleep(0.5)
    pytest.fail(f"no 200 on {url}/ within {STARTED_WITHIN} s:\n{log.read_text()[-3000:]}")


def _let_run_as_in(directory):
    """Started as root, the mod_wsgi client runs as its run-as user (www-data), who must
    enter this test's build directory (pytest makes its base directory 0700): search
    permission (o+x) on the directories of pytest's own tree up to it, for this test only.
    Returns ``{path: former mode}`` to restore. The checkout itself (its eggs, develop eggs)
    under a closed directory (root's home, a ``mktemp -d`` clone) is the runner's to open:
    it grants www-data search permission by ACL and says so (mod_wsgi.grant_search), which
    the test checks in the client's log."""
    import stat

    opened = {}
    for path in [directory, *list(directory.parents)[:2]]:  # servers0, pytest-<n>, pytest-of-<user>
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if not mode & 0o001:
            opened[path] = mode
            os.chmod(path, mode | 0o001)
    return opened


def _closed_parents(path, user):
    """The directories on the way to ``path`` that ``user`` (a name) cannot enter without
    an ACL entry of its own: closed to others (no o+x) and neither its own nor its group's."""
    import grp
    import pwd

    entry = pwd.getpwnam(user)
    groups = {g.gr_gid for g in grp.getgrall() if user in g.gr_mem} | {entry.pw_gid}
    closed = []
    for parent in reversed(list(path.parents)):
        info = os.stat(parent)
        if not info.st_mode & 0o001 and info.st_uid != entry.pw_uid and info.st_gid not in groups:
            closed.append(str(parent))
    return closed


def _group(proc):
    """The client's processes: the one bin/<part> started and its descendants."""
    parent = psutil.Process(proc.pid)
    return [parent] + parent.children(recursive=True)


@pytest.mark.parametrize("server", list(SERVER_HEADER))
def test_server_serves_zope_with_one_zeo_client(stack, servers_build, server):
    directory, ports, _ = servers_build
    port = ports[server]
    assert not port_taken(port), f"port {port} is taken"
    url = f"http://127.0.0.1:{port}"
    # mod_wsgi's runner drops to its run-as (www-data) only when root starts it: with the
    # stack's service user, the client's script has dropped to that user first.
    as_root = server == "mod_wsgi" and os.geteuid() == 0 and not (stack.config.get("service") or {}).get("user")
    opened = _let_run_as_in(directory) if as_root else {}
    # A checkout under a closed directory: the runner must open it for www-data (a POSIX ACL,
    # said in its output), where this test used to skip.
    closed = _closed_parents(pathlib.Path(ROOT), "www-data") if as_root else []
    log = directory / "var" / "log" / f"c_{server}.console.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([str(directory / "bin" / f"c_{server}"), "console"], cwd=directory,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        root = _wait_for_root(url, proc, log)
        assert "plone-overview" in root.text  # the Zope root lists its Plone sites
        if closed:  # this start or an earlier one granted www-data search permission there
            said = log.read_text()
            for parent in closed:
                acl = subprocess.run(["getfacl", "-cp", parent], capture_output=True, text=True, timeout=30)
                assert "user:www-data:--x" in acl.stdout, (parent, acl.stdout, said[-2000:])
        expected = SERVER_HEADER[server]
        if expected:
            assert root.headers.get("Server", "").lower().startswith(expected.lower())
        page = requests.get(url + "/Plone", timeout=30)
        assert page.status_code == 200 and "<html" in page.text[:2000].lower()
        blob = requests.get(url + "/Plone/blob-5mb/@@download/file", timeout=60)
        assert blob.status_code == 200
        assert len(blob.content) == BLOB_SIZE == int(blob.headers["Content-Length"])

        # keep-alive: a second request on the same connection is answered
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/Plone/@@ok")
        first = conn.getresponse()
        assert first.read() == b"OK" and not first.will_close
        sock = conn.sock
        conn.request("GET", "/Plone/@@ok")
        second = conn.getresponse()
        assert second.read() == b"OK" and conn.sock is sock
        conn.close()

        # one process serves (plus a supervisor for gunicorn/granian); one ZEO client
        zeo_port = stack.ports["zeoserver"]
        group = _group(proc)
        expected = PROCESSES.get(server, 1)
        assert len(group) in (expected if isinstance(expected, range) else (expected,)), \
            [p.cmdline()[-2:] for p in group]
        with_zeo = [p.pid for p in group
                    if any(c.raddr and c.raddr.port == zeo_port for c in p.net_connections("tcp"))]
        assert len(with_zeo) == 1, with_zeo
        listening = [p.pid for p in group
                     if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                            for c in p.net_connections("tcp"))]
        assert listening, "no process of the client listens on its port"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            pytest.fail(f"{server} did not stop within 45 s of SIGTERM")
        finally:
            for path, mode in opened.items():  # pytest's directories closed again
                os.chmod(path, mode)
    assert not port_taken(port)
