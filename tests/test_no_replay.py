"""Writes are never replayed: a POST whose ZEO client died after its transaction committed is
not sent again to another client by HAProxy's layer-7 retries (docs/explanation/edge.md,
"Security defaults").

The test runs a copy of the stack's waitress client (``client2``: its eggs, its zope.conf
with a home of its own, its wsgi.ini on a free port, no metrics port) whose pipeline ends
in a hook, :data:`HOOK`: after Zope has committed a POST that carries
``X-Kill-After-Commit``, the hook kills its own process (SIGKILL) before a byte of the
answer is sent. An HAProxy rendered from the stack's own template and variables, with
``balance first`` and that copy listed first, then the stack's ``client2``, gets one such
``POST /Plone`` (plone.restapi, a Document without an id: a second commit would make a
second document). With ``retry-on empty-response`` and ``option redispatch`` for every
method (main before 26 Nov 2026) HAProxy sent it again to ``client2``: two documents and a
201. Now: exactly one document and an error (502) for the client.
"""
import os
import signal
import subprocess
import time
import uuid

import pytest
import requests

from conftest import ROOT, admin_auth, give_to_service_user, port_taken, stop_group
from loadtests.core.procs import free_local_port
from loadtests.core.stack import render_haproxy
from plonedeploy.stack.rules import ZOPE_HEALTH_CHECK

pytestmark = pytest.mark.integration

#: The hook module: a PasteDeploy filter put right before the Zope app.
HOOK = '''
import os
import signal


def factory(global_conf, **local):
    def wrap(app):
        def kill_after_commit(environ, start_response):
            result = app(environ, start_response)  # Zope's publisher has committed here
            if environ.get("REQUEST_METHOD") == "POST" and environ.get("HTTP_X_KILL_AFTER_COMMIT"):
                os.kill(os.getpid(), signal.SIGKILL)
            return result
        return kill_after_commit
    return wrap
'''


def _wait_port(port, proc, log, seconds=180):
    deadline = time.monotonic() + seconds
    while not port_taken(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"did not listen on {port} (exit {proc.poll()}):\n{open(log).read()[-3000:]}")
        time.sleep(0.5)


def _killer_client(tmp_path, port):
    """Write the copy of client2 (script, zope.conf, wsgi.ini, hook) under ``tmp_path``;
    return the argv that runs it in the foreground."""
    etc = os.path.join(ROOT, "parts", "client2", "etc")
    home = tmp_path / "home"
    home.mkdir()
    zope_conf = open(os.path.join(etc, "zope.conf")).read().replace(
        os.path.join(ROOT, "var", "client2"), str(home))
    (tmp_path / "zope.conf").write_text(zope_conf)
    ini = open(os.path.join(etc, "wsgi.ini")).read()
    client2_port = ini.split("\nlisten = ", 1)[1].split("\n", 1)[0]
    ini = (ini.replace(f"\nlisten = {client2_port}\n", f"\nlisten = 127.0.0.1:{port}\n")
           .replace(os.path.join(etc, "zope.conf"), str(tmp_path / "zope.conf"))
           .replace(os.path.join(ROOT, "var", "log") + "/", str(tmp_path) + "/")
           .replace("\n    metrics\n", "\n")
           .replace("\n    zope\n", "\n    kill_after_commit\n    zope\n")
           + "\n[filter:kill_after_commit]\nuse = call:replay_hook:factory\n")
    assert "kill_after_commit\n    zope" in ini and f"127.0.0.1:{port}" in ini
    (tmp_path / "wsgi.ini").write_text(ini)
    (tmp_path / "replay_hook.py").write_text(HOOK)
    script = open(os.path.join(ROOT, "bin", "client2")).read()
    script = script.replace(os.path.join(etc, "zope.conf"), str(tmp_path / "zope.conf")).replace(
        os.path.join(etc, "wsgi.ini"), str(tmp_path / "wsgi.ini"))
    (tmp_path / "killer").write_text(script)
    return [script.split("\n", 1)[0][2:], str(tmp_path / "killer"), "console"]  # its #! python


def _documents(base, auth, title):
    answer = requests.get(f"{base}/Plone/@search", params={"Title": title, "portal_type": "Document"},
                          auth=auth, headers={"Accept": "application/json"}, timeout=60)
    answer.raise_for_status()
    return [item["@id"] for item in answer.json()["items"] if item["title"] == title]


def test_a_post_killed_after_commit_is_not_committed_twice(stack, tmp_path):
    auth = admin_auth()
    port, front, stats = free_local_port(), free_local_port(), free_local_port()
    argv = _killer_client(tmp_path, port)
    give_to_service_user(stack, tmp_path)  # the copy drops to it: reads its files, writes home/
    log = str(tmp_path / "killer.log")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    client = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                              start_new_session=True)
    haproxy = None
    try:
        _wait_port(port, client, log)
        client2_port = stack.ports["client2"]
        config = tmp_path / "haproxy.cfg"
        config.write_text(render_haproxy(
            stack.config, balance="first", bind=f"127.0.0.1:{front}", stats_bind=f"127.0.0.1:{stats}",
            run_directory=str(tmp_path), tls_bind="", cache_server="", health_check=ZOPE_HEALTH_CHECK,
            servers=[{"name": "killer", "host": "127.0.0.1", "port": port, "maxconn": 2, "wsgi_server": "waitress"},
                     {"name": "client2", "host": "127.0.0.1", "port": client2_port, "maxconn": 2,
                      "wsgi_server": "waitress"}]))
        haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=open(tmp_path / "haproxy.log", "w"),
                                   stderr=subprocess.STDOUT, start_new_session=True)
        _wait_port(front, haproxy, str(tmp_path / "haproxy.log"), 30)
        base = f"http://127.0.0.1:{front}"
        deadline = time.monotonic() + 60  # both servers UP (health checks every 2 s)
        while requests.get(f"http://127.0.0.1:{stats}/stats;csv", timeout=10).text.count(",UP,") < 2:
            assert time.monotonic() < deadline, "HAProxy did not see both servers UP"
            time.sleep(0.5)
        title = f"replay-{uuid.uuid4().hex[:12]}"
        answer = requests.post(f"{base}/Plone", json={"@type": "Document", "title": title}, auth=auth,
                               headers={"Accept": "application/json", "X-Kill-After-Commit": "1"}, timeout=120)
        assert client.wait(30) == -signal.SIGKILL, "the hook did not kill the client: the POST went elsewhere"
        created = _documents(base, auth, title)
        assert len(created) == 1, (answer.status_code, created)
        assert answer.status_code == 502, (answer.status_code, answer.headers)
        # GETs are still retried on the other client: the killed one is gone, /Plone answers
        assert requests.get(f"{base}/Plone", timeout=60).status_code == 200
    finally:
        for proc in (haproxy, client):
            if proc is not None:
                stop_group(proc, timeout=30)
