"""A/B per balance mode (``python -m loadtests ab --balance``, loadtests.ab.balance): temporary
HAProxys on the real stack.

The integration tests use the session fixture ``stack`` (conftest.py); each mode gets its
own temporary HAProxy on this build's frontend port + 10 and + 11.
"""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import ROOT, boundary, port_taken, run
from loadtests.core import balancers, haproxy_log, stack as core_stack

DEPLOYED_CONFIG = os.path.join(ROOT, "parts", "haproxy", "haproxy.cfg")


def _fingerprint(path):
    with open(path, "rb") as fp:
        return hashlib.sha256(fp.read()).hexdigest(), os.stat(path).st_mtime_ns


def _balancer_gone(pid, config_path):
    """True unless ``pid`` still is the HAProxy started with ``config_path``."""
    try:
        return config_path not in psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("value, bad", [
    ("leastconn,source", "'source'"),
    ("roundrobin,uri", "'uri'"),
    ("random(0)", "'random(0)'"),
    ("leastconn,", "''"),
])
def test_bad_balance_mode_is_refused(tmp_path, value, bad):
    result = run([sys.executable, "-m", "loadtests", "ab", "--balance", value, "--out", str(tmp_path)],
                 timeout=60, check=False)
    assert result.returncode == 2
    assert f"--balance item {bad} is invalid" in result.stderr
    # The message lists what is allowed.
    assert "expected one or more of leastconn, roundrobin, static-rr, first, random, random(2), random(1)" \
        in result.stderr
    assert list(tmp_path.iterdir()) == []  # refused before anything ran


def test_balance_mode_named_twice_is_refused(tmp_path):
    result = run([sys.executable, "-m", "loadtests", "ab", "--balance", "leastconn,roundrobin,leastconn",
                  "--out", str(tmp_path)], timeout=60, check=False)
    assert result.returncode == 2
    assert "names a mode twice" in result.stderr


def test_variant_of_the_built_stack_binds_none_of_its_listeners(tmp_path):
    """The variant rendered from the built stack's template variables (TLS, cache tier,
    upload lane) is valid for haproxy -c and binds only its own two ports: the deployed
    HAProxy keeps 8443, the cache-fill port and its runtime API socket."""
    config = core_stack.load_stack()
    balancer = balancers.TemporaryBalancer(config["haproxy_binary"], config, "random(2)", str(tmp_path), 9590)
    with balancer:
        balancer.write_config()  # haproxy -c, else BalancerError
        text = (tmp_path / "haproxy.cfg").read_text()
        assert re.findall(r"^\s*bind\s+(\S+)", text, re.MULTILINE) == ["127.0.0.1:9590", "127.0.0.1:9591"]
        assert "\n    balance random(2)\n" in text and "balance leastconn" not in text
        assert config["haproxy_socket"] not in text
        assert f"stats socket {balancer.run_directory}/haproxy.sock" in text
        for server in config["servers"]:
            facts = core_stack.client_facts(config, server)
            port = facts["url"].rsplit(":", 1)[1]
            assert f"server {server} 127.0.0.1:{port} maxconn {facts['threads']} check" in text
    assert not os.path.exists(balancer.run_directory)  # removed with the balancer


def test_variant_with_other_servers_and_an_unknown_variable(tmp_path):
    config = core_stack.load_stack()
    servers = [{"name": "s1", "host": "127.0.0.1", "port": 9599, "maxconn": 3, "wsgi_server": "pyruvate"}]
    text = core_stack.render_haproxy(config, servers=servers, balance="first")
    assert "server s1 127.0.0.1:9599 maxconn 3 check" in text and "balance first" in text
    assert "server instance " not in text
    with pytest.raises(KeyError, match="not a variable of .*haproxy.cfg.j2: bogus"):
        core_stack.render_haproxy(config, bogus=1)
    with pytest.raises(core_stack.NotReady, match="no haproxy_context"):
        core_stack.render_haproxy({k: v for k, v in config.items() if k != "haproxy_context"})


def test_queue_waits_counts_queued_requests(tmp_path):
    # Lines as HAProxy 2.6 logs them with the deployed config (option httplog).
    log = tmp_path / "haproxy.log"
    log.write_text(
        '127.0.0.1:50292 [22/Nov/2026:09:51:48.293] stats stats/<STATS> 0/0/0/0/0 200 2900 - - LR-- '
        '1/1/0/0/0 0/0 "GET /stats;csv HTTP/1.1"\n'
        '127.0.0.1:39392 [22/Nov/2026:09:51:49.916] plone zeoclients/instance 0/0/0/13/13 200 1116 - - ---- '
        '10/10/9/1/0 0/0 "GET / HTTP/1.1"\n'
        '127.0.0.1:39368 [22/Nov/2026:09:51:49.917] plone zeoclients/instance 0/13/0/37/50 200 2186 - - ---- '
        '10/10/9/1/0 0/1 "GET /Plone HTTP/1.1"\n'
        '127.0.0.1:39350 [22/Nov/2026:09:51:49.918] plone zeoclients/client2 0/0/0/34/49 200 2200 - - ---- '
        '10/10/8/1/+1 2/0 "GET /Plone HTTP/1.1"\n'
    )
    assert haproxy_log.queue_waits(str(log), "zeoclients") == (3, 2)
    assert haproxy_log.queue_waits(str(log), "other") == (0, 0)


@pytest.mark.integration
def test_ab_per_balance_mode(stack, tmp_path):
    config_before = _fingerprint(DEPLOYED_CONFIG)
    deployed_pid = stack.pids()["haproxy"]
    port = stack.ports["haproxy"] + 10
    # --warmup 0: Locust's and HAProxy's counts then agree up to the requests in flight when
    # Locust stops at --duration (HAProxy counted them, Locust cancels them unrecorded): one per
    # user, plus on a busy machine what Locust sent but had not reported when it stopped
    # (conftest.boundary; 17 of 72 on one server at load average 6).
    users = 6
    result = run([sys.executable, "-m", "loadtests", "ab", "--balance", "leastconn,roundrobin",
                  "--warmup", "0", "--duration", "8", "--users", str(users), "--spawn-rate", str(users),
                  "--out", str(tmp_path)],
                 timeout=180)
    (folder,) = list(tmp_path.iterdir())
    for name in ("report.md", "report.json", "modes.png"):
        assert (folder / name).stat().st_size > 0, name
    report = json.loads((folder / "report.json").read_text())
    assert list(report["modes"]) == ["leastconn", "roundrobin"]
    assert "| leastconn | instance | pyruvate |" in (folder / "report.md").read_text()
    for mode, data in report["modes"].items():
        servers = data["servers"]
        assert set(servers) == {"instance", "client2"}, mode
        for name, server in servers.items():
            assert server["requests"] > 0, (mode, name)
            assert server["failures"] == 0, (mode, name)
            # Locust's count (X-Served-By) and this mode's own HAProxy's stot agree (see above).
            assert server["requests"] <= server["haproxy_sessions"] <= server["requests"] + boundary(
                users, server["requests"], 8), (mode, name)
            assert server["p50_ms"] <= server["p95_ms"] <= server["p99_ms"], (mode, name)
        totals = data["totals"]
        assert 0 < totals["requests"] <= totals["haproxy_sessions"] <= totals["requests"] + boundary(
            users, totals["requests"], 8), mode
        assert sum(s["share"] for s in servers.values()) == pytest.approx(1.0), mode
        assert 0.0 <= data["totals"]["queued_share"] <= 1.0, mode
        (run_info,) = data["rounds"]
        run_dir = folder / run_info["directory"]
        # The run really went through a temporary HAProxy with this mode and other ports.
        cfg = (run_dir / "haproxy.cfg").read_text()
        assert f"\n    balance {mode}\n" in cfg
        # (the frontend's bind line goes on with "backlog N")
        assert re.search(rf"\n    bind 127\.0\.0\.1:{port}[ \n]", cfg), cfg
        assert f"bind 127.0.0.1:{port + 1}\n" in cfg
        single = json.loads((run_dir / "report.json").read_text())
        assert single["meta"]["host"] == f"http://127.0.0.1:{port}"
        assert single["meta"]["balance"] == mode
        assert (run_dir / "ab.png").stat().st_size > 0
        # Stopped by PID once its run was over.
        assert _balancer_gone(run_info["balancer_pid"], str(run_dir / "haproxy.cfg")), mode
        assert f"[{mode}, round 1/1] temporary HAProxy pid {run_info['balancer_pid']} stopped" in result.stdout
    assert re.search(r"\[roundrobin\]\s+5/8 s  requests: instance \d+, client2 \d+", result.stdout)
    assert not port_taken(port) and not port_taken(port + 1)
    # The deployed HAProxy: same process, same file, still balancing both servers.
    assert _fingerprint(DEPLOYED_CONFIG) == config_before
    assert stack.pids()["haproxy"] == deployed_pid
    assert stack.states() == {"instance": "UP", "client2": "UP", "BACKEND": "UP"}


@pytest.mark.integration
def test_interrupted_run_stops_its_balancer(stack, tmp_path):
    """SIGTERM to abtest in the middle of a mode: its temporary HAProxy and Locust stop too."""
    port = stack.ports["haproxy"] + 10
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtests", "ab", "--balance", "first,random", "--duration", "60",
         "--users", "4", "--spawn-rate", "4", "--out", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pid = None
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            match = re.search(r"\[first, round 1/1\] temporary HAProxy pid (\d+), servers UP", line)
            if match:
                pid = int(match.group(1))
                break
            assert time.monotonic() < deadline, "no temporary HAProxy within 60 s"
        assert pid and psutil.pid_exists(pid)
        time.sleep(3)  # Locust is sending traffic through the temporary HAProxy now
        locust = [c for c in psutil.Process(proc.pid).children() if "locust" in " ".join(c.cmdline())]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert locust and not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in locust)
    assert not port_taken(port) and not port_taken(port + 1)
    assert "[random, round 1/1]" not in proc.stdout.read()  # the next mode never started


@pytest.mark.integration
def test_balance_needs_the_deployed_haproxy_config(stack, tmp_path):
    # The Ansible role's abtest.json names no processes and no template variables: the
    # plain run works with it, a per-mode run cannot render a config it does not know, and says so.
    config = {k: v for k, v in dict(stack.config, processes=[]).items() if k != "haproxy_context"}
    path = tmp_path / "abtest.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "reports"
    result = run([sys.executable, "-m", "loadtests", "ab", "--stack-config", str(path),
                  "--balance", "leastconn,roundrobin", "--out", str(out)], timeout=60, check=False)
    assert result.returncode == 2
    assert "--balance needs the deployed HAProxy's template variables (haproxy_context)" in result.stderr
    assert not out.exists()
