"""plonedeploy.stack.rolling, the rolling restart both deploy paths run: its command line
(as Ansible runs it: the file itself under the system's python3) and its runtime API
conversation, against a real HAProxy of the test's own (no stack: a throwaway config with
one backend, a live server answering the health path and a dead one, ports of the OS's
choosing). The same steps under load, on the real stacks: tests/test_reliability.py
(bin/stack restart) and tests/test_ansible.py (restart.yml, a changed build)."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from urllib.parse import urlsplit

import pytest

from conftest import ROOT, stop_group
from http_stub import answering_server
from loadtests.core.procs import free_local_port
from plonedeploy.stack import rolling

SCRIPT = rolling.__file__  # the file Ansible ships to the balancers (plonedeploy_module_file)
#: The interpreter the balancer hosts have (ansible.builtin.script's executable: python3).
PYTHON3 = shutil.which("python3")

requires_haproxy = pytest.mark.skipif(not shutil.which("haproxy"), reason="no haproxy binary")


def cli(*args, timeout=60):
    """Run rolling.py as Ansible does (a file, python3, no sys.path of ours)."""
    return subprocess.run([PYTHON3, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=tempfile.gettempdir())


def _live(request):
    """``/ok``: 200 at once (the health path); ``/slow/<seconds>``: 200 after that long; else 404."""
    if request.path.startswith("/slow/"):
        time.sleep(float(request.path.rsplit("/", 1)[1]))
    elif request.path != "/ok":
        return 404, {}, b""
    return 200, {}, b"OK"


@pytest.fixture(scope="module")
def live():
    """The base URL of the live server (:func:`_live`), an HTTP server in this process."""
    with answering_server(_live) as url:
        yield url


@pytest.fixture(scope="module")
def balancer(live):
    """A real HAProxy with backend ``b``: ``live`` (the fixture's server) and ``dead`` (a port
    nobody listens on), checks every 200 ms; yields a dict with ``socket``, ``frontend`` (URL)
    and ``live`` (the live server's base URL). Stopped by PID."""
    live_port = urlsplit(live).port
    directory = tempfile.mkdtemp(prefix="rolling-")  # short: a unix socket path has ~100 bytes
    sock, frontend = os.path.join(directory, "haproxy.sock"), free_local_port()
    config, dead = os.path.join(directory, "haproxy.cfg"), free_local_port()
    with open(config, "w", encoding="ascii") as fp:
        fp.write(f"""global
    stats socket {sock} mode 600 level admin
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
frontend fe
    bind 127.0.0.1:{frontend}
    use_backend w if {{ path_beg /slow/w/ }}
    default_backend b
backend b
    option httpchk GET /ok
    timeout check 5s
    # live: 20 failed checks before DOWN, so that a busy machine does not make it flap.
    server live 127.0.0.1:{live_port} check inter 200ms fall 20
    # dead: in MAINT (disabled) but for the tests that need it DOWN: drain waits while a
    # peer is DOWN (never the last one in service)
    server dead 127.0.0.1:{dead} check inter 200ms disabled
# As the kit's write lane: the same servers under the same names, tracking b's.
backend w
    balance source
    server live 127.0.0.1:{live_port} maxconn 1 track b/live
    server dead 127.0.0.1:{dead} maxconn 1 backup track b/dead
""")
    proc = subprocess.Popen(["haproxy", "-db", "-f", config], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                if rolling.server_stats(sock, "b", "live")["status"] == "UP":
                    break
            except rolling.RollingError:
                pass
            assert proc.poll() is None, "haproxy exited"
            assert time.monotonic() < deadline, "haproxy: live not UP within 15 s"
            time.sleep(0.1)
        yield {"socket": sock, "frontend": f"http://127.0.0.1:{frontend}", "live": live}
    finally:
        stop_group(proc, timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


def _slow_request(url):
    """GET ``url`` in a thread; returns (thread, result list that gets the status)."""
    result, opener = [], urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no http_proxy
    thread = threading.Thread(target=lambda: result.append(opener.open(url, timeout=30).status))
    thread.start()
    return thread, result


def _wait_for_session(sock, server="live", backend="b"):
    # 15 s: the thread, urllib and HAProxy on a 2-core machine busy with the other xdist
    # group took more than 5 s once (load 7)
    deadline = time.monotonic() + 15
    while int(rolling.server_stats(sock, backend, server)["scur"] or 0) == 0:
        assert time.monotonic() < deadline, "the slow request never reached the server"
        time.sleep(0.02)


def test_help_names_every_command_and_the_units():
    main = cli("--help")
    assert main.returncode == 0 and all(c in main.stdout for c in ("drain", "enable", "health"))
    for command in ("drain", "enable", "health"):
        text = cli(command, "--help").stdout
        assert "--timeout SECONDS" in text and f"seconds the step may wait (default {rolling.TIMEOUT:g})" in text


@pytest.mark.parametrize("args, message", [
    ((), "the following arguments are required: command"),
    (("drain", "--backend", "b", "--server", "s"), "the following arguments are required: --socket"),
    (("enable", "--socket", "/x", "--backend", "b", "--server", "s", "--timeout", "soon"),
     "argument --timeout: invalid float value: 'soon'"),
    (("health", "--url", "http://127.0.0.1:1/", "--timeout", "0"), "--timeout must be a positive number of seconds"),
])
def test_bad_arguments_exit_2(args, message):
    result = cli(*args)
    assert result.returncode == 2 and message in result.stderr, result
    assert result.stdout == ""


def test_failures_exit_1_with_one_line_naming_the_step(tmp_path):
    missing = str(tmp_path / "haproxy.sock")
    result = cli("drain", "--socket", missing, "--backend", "b", "--server", "s")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(f"rolling.py drain: haproxy runtime API {missing}: "), result.stderr
    port = free_local_port()
    result = cli("health", "--url", f"http://127.0.0.1:{port}/ok", "--timeout", "0.5")
    assert result.returncode == 1
    assert result.stderr.startswith(f"rolling.py health: http://127.0.0.1:{port}/ok: not healthy after 0.5 s ("), \
        result.stderr


@requires_haproxy
def test_unknown_server_and_refused_command(balancer):
    result = cli("enable", "--socket", balancer["socket"], "--backend", "b", "--server", "nope")
    assert result.returncode == 1
    assert result.stderr.strip() == f"rolling.py enable: haproxy {balancer['socket']}: no server nope in backend b"
    with pytest.raises(rolling.RollingError, match=r"'set server b/live state bogus': 'set server <srv> state'"):
        rolling.runtime_api(balancer["socket"], "set server b/live state bogus")


@requires_haproxy
def test_drain_waits_for_the_request_in_flight_then_enable(balancer):
    """drain: the request in flight ends with 200 before the server goes to MAINT; a second
    drain changes nothing; enable puts it back UP; a second enable changes nothing."""
    sock = balancer["socket"]
    # 4 s: the drain must still find the request in flight after rolling.py's own start-up,
    # which took over 1 s under load (a 1.5 s request left it 0.26 s to wait)
    thread, result = _slow_request(balancer["frontend"] + "/slow/4")
    _wait_for_session(sock)
    drained = cli("drain", "--socket", sock, "--backend", "b", "--server", "live")
    thread.join(30)
    assert drained.returncode == 0, drained.stderr
    report = json.loads(drained.stdout)
    assert (report["server"], report["before"], report["after"], report["changed"]) == ("b/live", "UP", "MAINT", True)
    assert report["seconds"] >= 0.5, report  # it waited for the slow request
    assert result == [200]
    again = json.loads(cli("drain", "--socket", sock, "--backend", "b", "--server", "live").stdout)
    assert (again["before"], again["after"], again["changed"]) == ("MAINT", "MAINT", False)
    healthy = cli("health", "--url", balancer["live"] + "/ok")
    assert healthy.returncode == 0 and json.loads(healthy.stdout)["url"] == balancer["live"] + "/ok"
    enabled = json.loads(cli("enable", "--socket", sock, "--backend", "b", "--server", "live").stdout)
    assert (enabled["before"], enabled["after"], enabled["changed"]) == ("MAINT", "UP", True)
    again = json.loads(cli("enable", "--socket", sock, "--backend", "b", "--server", "live").stdout)
    assert (again["before"], again["after"], again["changed"]) == ("UP", "UP", False)


@requires_haproxy
def test_drain_and_enable_take_the_server_in_every_backend_that_has_it(balancer):
    """The write lane: draining b/live drains w/live too (a server of that name in another
    backend) and waits for its request in flight; enable puts both back UP."""
    sock = balancer["socket"]
    # 4 s, as in the test above: rolling.py's start-up took over 1 s under load, and a 1.5 s
    # request left the drain 0.47 s to wait (load average 9)
    thread, result = _slow_request(balancer["frontend"] + "/slow/w/4")
    _wait_for_session(sock, backend="w")
    try:
        assert int(rolling.server_stats(sock, "b", "live")["scur"] or 0) == 0  # only w has the request
        drained = cli("drain", "--socket", sock, "--backend", "b", "--server", "live")
        states = {b: rolling.server_stats(sock, b, "live")["status"] for b in ("b", "w")}
        thread.join(30)
        assert drained.returncode == 0, drained.stderr
        report = json.loads(drained.stdout)
        assert (report["backends"], report["after"], report["changed"]) == (["b", "w"], "MAINT", True)
        assert report["seconds"] >= 0.5, report  # it waited for the slow request in w
        # w/live tracks b/live: HAProxy shows its MAINT as inherited ("MAINT (via b/live)")
        assert result == [200] and states["b"] == "MAINT" and states["w"].startswith("MAINT"), states
    finally:  # the module's later tests need live in service
        enabled = json.loads(cli("enable", "--socket", sock, "--backend", "b", "--server", "live").stdout)
    assert (enabled["backends"], enabled["after"]) == (["b", "w"], "UP")
    assert rolling.server_stats(sock, "w", "live")["status"] == "UP"
    with pytest.raises(rolling.RollingError, match="no server nope in backend w"):
        rolling.backends_of(sock, "w", "nope")


@requires_haproxy
def test_drain_that_times_out_puts_the_server_back(balancer):
    sock = balancer["socket"]
    thread, result = _slow_request(balancer["frontend"] + "/slow/6")  # in flight past the drain's start-up
    _wait_for_session(sock)
    drained = cli("drain", "--socket", sock, "--backend", "b", "--server", "live", "--timeout", "0.5")
    status = rolling.server_stats(sock, "b", "live")["status"]
    thread.join(30)
    assert drained.returncode == 1
    assert re.match(r"rolling\.py drain: b/live: still 1 session\(s\) and 0 queued request\(s\) 0\.5 s "
                    r"after the drain; put back in service \(state ready\), not restarted$",
                    drained.stderr.strip()), drained.stderr
    assert status == "UP" and result == [200]
    assert rolling.server_stats(sock, "w", "live")["status"] == "UP"  # put back in w too


@requires_haproxy
def test_leaving_maint_counts_as_up_before_any_check(balancer):
    """Why the health step comes before enable: HAProxy 2.6 puts a server that leaves MAINT
    into rotation as healthy, even a dead one (``UP``, then ``UP 1/3`` ... until its checks
    fail), so a wait for UP alone does not prove the client serves."""
    sock = balancer["socket"]
    try:
        _dead_down(sock)
        rolling.runtime_api(sock, "set server b/dead state maint")
        rolling.runtime_api(sock, "set server b/dead state ready")
        assert rolling.server_stats(sock, "b", "dead")["status"].startswith("UP")
    finally:
        rolling.runtime_api(sock, "set server b/dead state maint")


def _dead_down(sock):
    """Take b/dead out of MAINT and wait (at most 15 s) until its checks made it DOWN."""
    rolling.runtime_api(sock, "set server b/dead state ready")
    deadline = time.monotonic() + 15
    while rolling.server_stats(sock, "b", "dead")["status"] != "DOWN":
        assert time.monotonic() < deadline, rolling.server_stats(sock, "b", "dead")["status"]
        time.sleep(0.05)


@requires_haproxy
def test_drain_waits_while_a_peer_is_down_and_leaves_the_server_as_it_was(balancer):
    """Never the last one in service: with b/dead DOWN (as a client its memory watchdog
    drained), draining b/live waits for it, and after --timeout fails naming it, with
    b/live still UP; with b/dead in MAINT (an operator's) the drain goes ahead."""
    sock = balancer["socket"]
    try:
        _dead_down(sock)
        started = time.monotonic()
        drained = cli("drain", "--socket", sock, "--backend", "b", "--server", "live", "--timeout", "1")
        assert drained.returncode == 1
        assert time.monotonic() - started >= 1.0
        assert re.match(r"rolling\.py drain: b/live: not drained: dead DOWN 1 s after asking; ",
                        drained.stderr.strip()), drained.stderr
        assert rolling.server_stats(sock, "b", "live")["status"] == "UP"
    finally:
        rolling.runtime_api(sock, "set server b/dead state maint")
    drained = cli("drain", "--socket", sock, "--backend", "b", "--server", "live", "--timeout", "5")
    try:
        assert drained.returncode == 0, drained.stderr
        assert json.loads(drained.stdout)["after"] == "MAINT"
    finally:
        cli("enable", "--socket", sock, "--backend", "b", "--server", "live")


@requires_haproxy
def test_restart_client_runs_the_steps_in_order(balancer):
    """The sequence bin/stack runs: the restart step sees the server in MAINT without
    sessions; afterwards it is UP; one progress line per step."""
    sock, seen, lines = balancer["socket"], [], []
    rolling.restart_client(sock, "b", "live", lambda: seen.append(rolling.server_stats(sock, "b", "live")),
                           balancer["live"] + "/ok", timeout=10, say=lines.append)
    assert [(row["status"], row["scur"]) for row in seen] == [("MAINT", "0")]
    assert rolling.server_stats(sock, "b", "live")["status"] == "UP"
    assert [line.split(":")[1].split()[0] for line in lines] == ["drained", "healthy", "UP"]
    assert lines[-1] == "live: UP again"


def test_ansible_runs_the_steps_in_the_modules_order():
    """ansible/tasks/restart-client.yml runs rolling.py's commands and the process manager's
    restart in the order of rolling.STEPS, as bin/stack does through restart_client."""
    with open(os.path.join(ROOT, "ansible", "tasks", "restart-client.yml"), encoding="utf-8") as fp:
        text = fp.read()
    found = re.findall(r"restart_rolling_script \}\} (\w+)|process_manager/tasks/(restart)\.yml", text)
    assert tuple(a or b for a, b in found) == rolling.STEPS
    assert "'plonedeploy.stack.rolling' | plonedeploy_module_file" in text and "community.general.haproxy" not in text
    assert "recipes/" not in text  # the installed package's file, not a path into the checkout
    # and docs/how-to/ansible.md says so (it once named community.general.haproxy there; the
    # canary deploy's section names it rightly, for the canary's weight)
    with open(os.path.join(ROOT, "docs", "how-to", "ansible.md"), encoding="utf-8") as fp:
        docs = fp.read()
    rolling_section = docs.split("## Rolling restart", 1)[1].split("\n## ", 1)[0]
    assert "plonedeploy.stack.rolling" in rolling_section and "community.general.haproxy" not in rolling_section
