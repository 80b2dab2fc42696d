"""Per-source limits that an IPv6 /64 cannot dodge, on a real HAProxy in a network namespace.

The demo stack listens on IPv4 only, so this test renders haproxy.cfg.j2 itself (the
template the recipe and the Ansible role render) with a limit of 5 requests per 10 s,
binds it to fd00::1 inside a namespace of its own and sends requests from other fd00::
addresses on that namespace's loopback. One customer's /64 holds 2^64 addresses: keyed on
the full address, each of them would get the whole limit.
"""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import stop_group
from plonedeploy.recipe import edge, options, tls

pytestmark = pytest.mark.integration

PORT = 18680
#: Requests every client sends, one connection each, from inside the namespace.
CLIENT = """
import json, socket, sys
source, count = sys.argv[1], int(sys.argv[2])
statuses = []
for _ in range(count):
    with socket.create_connection(("fd00::1", %d), timeout=10, source_address=(source, 0)) as sock:
        sock.sendall(b"GET /Plone/@@ok HTTP/1.1\\r\\nHost: [fd00::1]\\r\\nConnection: close\\r\\n\\r\\n")
        statuses.append(int(sock.recv(100).split(b" ")[1]))
print(json.dumps(statuses))
""" % PORT


def _render(tmp_path):
    return options.render_template(options.HAPROXY_TEMPLATE, dict(
        part="ipv6", servers=[{"name": "a", "host": "[fd00::1]", "port": PORT + 1, "maxconn": 2,
                               "wsgi_server": "pyruvate"}],
        bind=f"[fd00::1]:{PORT}", stats_bind=f"[fd00::1]:{PORT + 2}", balance="leastconn",
        health_check="/Plone/@@ok", timeout_queue=5, max_body_size=1024, maxconn=100, fd_limit=1000,
        manage_networks=[], run_directory=str(tmp_path),
        **edge.template_context(["[fd00::1]"], per_source={"connections": 100, "requests": 5, "period": 10}),
        **tls.template_context("", "", False, 0)))


@pytest.fixture
def namespace(tmp_path):
    """A network namespace with fd00::1-3 and fd00:0:0:1::2 on its loopback and HAProxy on
    [fd00::1]:18680 (its one server is absent: requests that pass the limits get 503)."""
    if os.geteuid() != 0:
        pytest.fail("this test makes a network namespace: run it as root (make test does)")
    name = f"pdtest-v6-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    proc = None
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=30)
        for address in ("fd00::1", "fd00::2", "fd00::3", "fd00:0:0:1::2"):
            subprocess.run(["ip", "-n", name, "-6", "addr", "add", f"{address}/128", "dev", "lo", "nodad"],
                           check=True, timeout=30)
        config = tmp_path / "haproxy.cfg"
        config.write_text(_render(tmp_path))
        proc = subprocess.Popen(["ip", "netns", "exec", name, "haproxy", "-db", "-f", str(config)],
                                stdout=open(tmp_path / "haproxy.log", "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        probe = [sys.executable, "-c", "import socket; socket.create_connection(('fd00::1', %d), 1).close()" % PORT]
        deadline = time.monotonic() + 20
        while subprocess.run(["ip", "netns", "exec", name] + probe, capture_output=True, timeout=10).returncode:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "haproxy.log").read_text()
            time.sleep(0.2)
        yield name
    finally:
        if proc is not None:
            stop_group(proc, timeout=10)
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


def _statuses(namespace, source, count):
    result = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", CLIENT, source, str(count)],
                            capture_output=True, text=True, timeout=60, check=True)
    return json.loads(result.stdout)


def test_one_ipv6_slash_64_shares_one_limit(namespace):
    """5 requests per 10 s per source: fd00::2 uses 3, fd00::3 (same /64) gets its 2 more
    and then 429; fd00:0:0:1::2 (another /64) still gets its own 5 (503: no server)."""
    assert _statuses(namespace, "fd00::2", 3) == [503] * 3
    assert _statuses(namespace, "fd00::3", 4) == [503, 503, 429, 429]
    assert _statuses(namespace, "fd00:0:0:1::2", 5) == [503] * 5
