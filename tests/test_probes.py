"""The probes of plonedeploy.runtime.probes without Zope (a fake clock, fake apps), and where
the recipes point HAProxy's health check. The probes on the running stack: test_selfheal.py."""
import http.server
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import zc.buildout

from conftest import wait_for
from fake_buildout import fake_buildout
from loadtests.core.procs import free_local_port
from plonedeploy.stack import rules
from plonedeploy.runtime import metrics, probes


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_probe_names_are_the_recipes():
    assert (probes.LIVE, probes.READY, probes.STARTUP) == rules.PROBE_PATHS
    assert rules.HEALTH_CHECK == probes.READY


def test_not_ready_until_every_warmup_path_was_rendered():
    health = probes.Health(2, warmup_paths=2, clock=Clock())
    assert health.ready() == (False, "warming up: 0 of 2 paths rendered")
    health.warmed_path("/Plone", "200 OK", 1.5)
    assert not health.started and not health.ready()[0]
    health.warmed_path("/Plone/++api++", "500 Internal Server Error", 0.2)  # rendered, whatever it said
    assert health.started and health.ready() == (True, "ready")
    assert probes.Health(1).started  # no warm-up: started at once


def test_storage_disconnect_counts_only_after_the_grace():
    clock, state = Clock(), {"connected": True}
    health = probes.Health(2, storage_grace=30, connected=lambda: state["connected"], clock=clock)
    assert health.ready() == (True, "ready")
    state["connected"] = False
    assert health.ready() == (True, "ready; storage disconnected for 0 s (storage-grace 30 s)")  # first seen down
    clock.now += 30
    # not more than the grace
    assert health.ready() == (True, "ready; storage disconnected for 30 s (storage-grace 30 s)")
    clock.now += 1
    assert health.ready() == (False, "storage disconnected for 31 s (storage-grace 30 s)")
    state["connected"] = True
    assert health.ready() == (True, "ready")  # back: ready at once, and the count starts again
    state["connected"] = False
    clock.now += 20
    assert health.ready()[0] and health.storage_down_for() == 0.0
    # unknown (no ZEO) and a storage that raises count as connected
    assert probes.Health(1, connected=lambda: None).storage_down_for() is None
    assert probes.Health(1, connected=lambda: 1 / 0).storage_down_for() is None


def test_busy_is_ready_stuck_is_not():
    """One request longer than stall-timeout is a slow page; every thread held that long is stuck."""
    clock = Clock()
    health = probes.Health(2, stall_timeout=60, clock=clock)
    first = health.begin()
    clock.now += 61
    second = health.begin()
    assert health.stuck() == 1 and health.ready()[0]
    clock.now += 60.5
    assert health.stuck() == 2
    assert health.ready() == (False, "stuck: 2 requests in the application for more than 60 s "
                                     "(stall-timeout), 2 threads")
    health.end(first)
    assert health.ready()[0]
    health.end(second)
    health.end(second)  # a second end is harmless
    assert health.stuck() == 0


def test_storage_connected_asks_zeo_and_knows_nothing_of_other_storages():
    class ZEO:
        def __init__(self, up):
            self.up = up

        def is_connected(self):
            return self.up

    class DB:
        def __init__(self, storage):
            self.storage = storage

    assert probes.storage_connected(lambda: DB(ZEO(True)))() is True
    assert probes.storage_connected(lambda: DB(ZEO(False)))() is False
    assert probes.storage_connected(lambda: DB(object()))() is None   # FileStorage, RelStorage
    assert probes.storage_connected(lambda: None)() is None           # before Zope opened it


class _ConnectionManager:
    """RelStorage's ``connmanager.open_and_call`` as DatabasePing uses it: calls back with
    a cursor whose ``execute`` succeeds, raises (a refused connection) or blocks (a hung
    connect) as the test says. tests/test_relstorage.py pings a real PostgreSQL."""

    def __init__(self):
        self.mode, self.released, self.calls = "answer", threading.Event(), 0

    def open_and_call(self, callback):
        self.calls += 1
        if self.mode == "refuse":
            raise OSError("connection refused")
        if self.mode == "hang":
            self.released.wait(30)
        executed = []
        callback(None, type("Cursor", (), {"execute": lambda self, sql: executed.append(sql)})())
        assert executed == ["SELECT 1"], executed


def test_database_ping_says_whether_relstorage_database_answers_without_waiting_on_it():
    """Answering, refusing, hanging (False after 3 pings' time, the probe not waiting),
    answering again; and storage_connected starts one ping per RelStorage storage."""
    manager = _ConnectionManager()

    class RelStorage:
        _adapter = type("Adapter", (), {"connmanager": manager})()

    class DB:
        storage = RelStorage()

    def until(what, timeout=5.0):
        wait_for(lambda: connected() is what, timeout, f"connected() is {what}", interval=0.01)

    connected = probes.storage_connected(lambda: DB(), ping_interval=0.05)
    until(True)
    assert connected() is True and manager.calls >= 1
    manager.mode = "refuse"
    until(False)
    manager.mode = "answer"
    until(True)
    manager.mode = "hang"
    until(False, timeout=2)
    started = time.monotonic()
    assert connected() is False
    assert time.monotonic() - started < 0.05  # answered from the last ping, not by waiting
    calls = manager.calls
    time.sleep(0.2)
    assert manager.calls == calls  # one hung connection, not one more every interval
    manager.mode = "answer"
    manager.released.set()
    until(True)
    with pytest.raises(ValueError, match=r"ping interval = 0 is invalid: expected seconds > 0"):
        probes.DatabasePing(manager, 0)


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode(), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers


def test_the_probe_server_answers_while_the_application_threads_are_held():
    """Over real HTTP: the probes and /metrics from the server's own thread while two
    "worker threads" sit in a WSGI app that never returns until released."""
    health = probes.Health(2, stall_timeout=0.2, warmup_paths=1)
    release = threading.Event()

    def slow_app(environ, start_response):
        release.wait(30)
        start_response("200 OK", [])
        return [b""]

    app = metrics.Middleware(slow_app, _metrics(), health)

    def metrics_app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"zope_http_requests_total 1\n"]

    port = free_local_port()
    server = probes.serve("127.0.0.1", port, probes.probe_app(health, metrics_app))
    base = f"http://127.0.0.1:{port}"
    workers = [threading.Thread(target=app, args=({"REQUEST_METHOD": "GET"}, lambda *a: None)) for _ in range(2)]
    try:
        assert _get(base + "/startupz")[:2] == (503, "warming up: 0 of 1 paths rendered\n")
        assert _get(base + "/readyz")[0] == 503
        health.warmed_path("/Plone", "200 OK", 0.1)
        status, body, headers = _get(base + "/readyz")
        assert (status, body, headers["Cache-Control"]) == (200, "ready\n", "no-store")
        for worker in workers:
            worker.start()
        time.sleep(0.5)  # both held longer than stall-timeout (0.2 s)
        started = time.monotonic()
        assert _get(base + "/livez")[:2] == (200, "live\n")
        assert _get(base + "/readyz")[0] == 503
        assert _get(base + "/startupz")[0] == 200
        assert time.monotonic() - started < 2.0
        assert _get(base + "/metrics")[:2] == (200, "zope_http_requests_total 1\n")
        assert _get(base + "/")[0] == 404 and _get(base + "/Plone")[0] == 404
        release.set()
        for worker in workers:
            worker.join(10)
        assert _get(base + "/readyz")[0] == 200
    finally:
        release.set()
        server.shutdown()
        server.server_close()


class _Instrument:
    def labels(self, *names):
        return self

    def inc(self, amount=1):
        pass

    dec = observe = inc


def _metrics():
    """Stand-ins for metrics.Metrics' prometheus-client instruments (the project's .venv
    has no prometheus-client; test_metrics_filter.py runs the real ones in a client's Python)."""
    class Instruments:
        requests = duration = in_progress = _Instrument()
    return Instruments()


def test_warm_up_renders_each_path_in_process_and_goes_on_after_an_error():
    seen = []

    def app(environ, start_response):
        seen.append((environ["PATH_INFO"], environ["QUERY_STRING"], environ["HTTP_ACCEPT"], environ["HTTP_HOST"]))
        if environ["PATH_INFO"] == "/boom":
            raise RuntimeError("boom")
        start_response("200 OK", [("Content-Type", "text/html")])
        return iter([b"<html>", b"</html>"])

    health = probes.Health(2, warmup_paths=3)
    warmed = probes.warm_up(app, ["/Plone", "/boom", "/Plone/++api++?expand=navigation"], health,
                            "127.0.0.1", 8081)
    assert seen == [("/Plone", "", "text/html", "127.0.0.1:8081"), ("/boom", "", "text/html", "127.0.0.1:8081"),
                    ("/Plone/++api++", "expand=navigation", "application/json", "127.0.0.1:8081")]
    assert [(path, outcome) for path, outcome, _ in warmed] == [
        ("/Plone", "200 OK"), ("/boom", "RuntimeError: boom"), ("/Plone/++api++?expand=navigation", "200 OK")]
    assert health.started and health.ready()[0]


def test_warm_threads_waits_for_the_server_then_reaches_every_worker_thread():
    """The server binds 0.5 s after the call (as a client's server binds after the warm-up
    started); the 3 requests of a round are in the server at the same time (each holds a
    worker thread: a server with 3 threads gives each one), twice; Host names the server's
    address."""
    served, port, lock, inside = [], free_local_port(), threading.Lock(), [0, 0]  # now, most

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with lock:
                inside[0] += 1
                inside[1] = max(inside)
            served.append((self.path, self.headers["Host"]))
            time.sleep(0.3)
            with lock:
                inside[0] -= 1
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    servers = []

    def bind_later():
        time.sleep(0.5)
        servers.append(http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler))
        servers[0].serve_forever(poll_interval=0.05)

    threading.Thread(target=bind_later, daemon=True).start()
    try:
        results = probes.warm_threads("0.0.0.0", port, "/Plone", 3, wait=10)
    finally:
        while not servers:
            time.sleep(0.05)
        servers[0].shutdown()
        servers[0].server_close()
    assert [outcome for outcome, _ in results] == [200] * 6
    assert all(seconds >= 0.3 for _, seconds in results)
    assert inside[1] == 3, inside
    assert served == [("/Plone", f"127.0.0.1:{port}")] * 6


def test_warm_threads_gives_up_on_a_server_that_never_listens():
    started = time.monotonic()
    assert probes.warm_threads("127.0.0.1", free_local_port(), "/Plone", 2, wait=0.5) == []
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("option, value, message", [
    ("threads", "0", "threads = '0' is invalid: expected a whole number >= 1"),
    ("stall_timeout", "-1", "stall_timeout = '-1' is invalid: expected seconds > 0"),
    ("storage_grace", "soon", "storage_grace = 'soon' is invalid: expected seconds > 0"),
    ("warmup_paths", "/Plone Plone", "warmup_paths names Plone: expected paths starting with /"),
])
def test_filter_refuses_bad_settings_before_anything_listens(option, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        metrics.filter_factory({}, "127.0.0.1:1", **{option: value})


def test_release_id_is_read_from_the_build_of_the_wsgi_ini(tmp_path):
    """plonedeploy_release_info's label: RELEASE of the build three levels above PasteDeploy's
    ``here`` (parts/<part>/etc), as the Ansible buildout role writes it into each release."""
    build = tmp_path / "releases" / "3f2a9c1b7d04"
    etc = build / "parts" / "client1" / "etc"
    etc.mkdir(parents=True)
    conf = {"here": str(etc), "__file__": str(etc / "wsgi.ini")}
    assert metrics.release_id(conf) is None  # a build without RELEASE (make build's stack)
    (build / "RELEASE").write_text("3f2a9c1b7d04\n")
    assert metrics.release_id(conf) == "3f2a9c1b7d04"
    assert metrics.release_id({}) is None
    for bad in ("", "a b", 'x"}', "x" * 65):
        (build / "RELEASE").write_text(bad + "\n")
        assert metrics.release_id(conf) is None, bad


def test_check_target_sends_probe_paths_to_the_metrics_address():
    assert rules.check_target("/readyz", "c1", "127.0.0.1:8071") == {"check_addr": "127.0.0.1", "check_port": 8071}
    assert rules.check_target("/livez", "c1", "[fd00::1]:8071") == {"check_addr": "fd00::1", "check_port": 8071}
    assert rules.check_target("/Plone/@@ok", "c1", "") == {}
    with pytest.raises(ValueError, match="client c1 has no metrics address, where the health check /readyz"):
        rules.check_target("/readyz", "c1", "")


def _buildout(tmp_path, **uploads):
    buildout = fake_buildout(tmp_path)
    buildout["uploads"].update(uploads)
    buildout["haproxy"] = {"backends": "instance", "upload-backends": "uploads", "bind": "127.0.0.1:9903",
                           "stats-bind": "127.0.0.1:9904"}
    return buildout


def test_haproxy_recipe_checks_each_client_on_its_metrics_address(tmp_path):
    from plonedeploy.recipe import haproxy

    buildout = _buildout(tmp_path)
    recipe = haproxy.Recipe(buildout, "haproxy", buildout["haproxy"])
    assert buildout["haproxy"]["health-check"] == "/readyz"
    assert [(s["name"], s["check_addr"], s["check_port"]) for s in recipe.servers + recipe.upload_servers] == [
        ("instance", "127.0.0.1", 9911), ("uploads", "127.0.0.1", 9913)]
    context = json.loads(buildout["haproxy"]["template-context"])
    assert "metrics_address" not in context["servers"][0]
    recipe.install()  # haproxy -c accepts it
    text = open(buildout["haproxy"]["config"]).read()
    assert "option httpchk GET /readyz" in text
    assert "server instance 127.0.0.1:9901 maxconn 2 check addr 127.0.0.1 port 9911" in text
    assert "server uploads 127.0.0.1:9902 maxconn 8 check addr 127.0.0.1 port 9913" in text
    # a stopped client out within inter x fall: each check bounded by 0.5 s and by a 1 s
    # connect (the defaults' 5 s made a timed-out check last 1.5 s), in both checked backends
    for backend in ("zeoclients", "uploads"):
        section = text.split(f"\nbackend {backend}\n")[1].split("\nbackend ")[0]
        settings = [line.split("#")[0].strip() for line in section.splitlines()]
        assert "timeout connect 1s" in settings and "timeout check 500ms" in settings, (backend, section)


def test_haproxy_recipe_refuses_a_probe_check_of_a_client_without_metrics(tmp_path):
    from plonedeploy.recipe import haproxy

    buildout = _buildout(tmp_path, **{"metrics-address": ""})
    with pytest.raises(zc.buildout.UserError, match=r"\[haproxy\] health-check = /readyz: client uploads has no "
                                                    r"metrics address"):
        haproxy.Recipe(buildout, "haproxy", buildout["haproxy"])
    # a Zope path is asked on the client's own port, as before the probes
    buildout["haproxy"]["health-check"] = rules.ZOPE_HEALTH_CHECK
    recipe = haproxy.Recipe(buildout, "haproxy", buildout["haproxy"])
    assert all("check_port" not in s for s in recipe.servers + recipe.upload_servers)
