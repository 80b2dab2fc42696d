"""The A/B test as an operator runs it against the deployment: Locust's master on the
control host, its users on lg1's two workers, HAProxy's stats through an SSH tunnel to lb1."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

from .common import MASTER_PORT, ROOT, SSH_OPTIONS, WORK, in_ns, stop


def ab_with_remote_workers():
    """The A/B test as an operator runs it: Locust's master on the control host (this
    namespace, 10.231.0.1), the users on lg1's workers, HAProxy's stats (on lb1's localhost)
    through an SSH tunnel. Returns ``[(label, passed, detail)]``."""
    results = []
    plain = in_ns("pdmh-lg", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                  "http://10.231.0.4:8080/Plone/@@ok", capture=True, check=False)
    results.append(("lg1 is served on the plain port (haproxy_tls_redirect_exempt)", plain == "200", plain))
    # A free port, not a fixed one: a fixed 18404 was once the stats port of make test's local
    # converge running beside this harness, and the A/B then read that HAProxy's servers.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        stats_port = sock.getsockname()[1]
    stats_url = f"http://127.0.0.1:{stats_port}/stats;csv"
    tunnel = subprocess.Popen(
        ["ssh", "-N", "-i", os.path.join(WORK, "id_ed25519"), *SSH_OPTIONS, "-o", "ExitOnForwardFailure=yes",
         "-L", f"127.0.0.1:{stats_port}:127.0.0.1:8404", "root@10.231.0.4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(30):
            if tunnel.poll() is not None:
                results.append(("SSH tunnel to lb1's HAProxy stats", False, f"ssh exited {tunnel.returncode}"))
                return results
            try:
                urllib.request.urlopen(stats_url, timeout=2).read()
                break
            except OSError:
                time.sleep(0.5)
        with open(f"{WORK}/lb1/haproxy/abtest.json", encoding="utf-8") as fp:
            config = json.load(fp)
        config["stats_url"] = stats_url
        config_path = os.path.join(WORK, "abtest-control.json")
        with open(config_path, "w", encoding="utf-8") as fp:
            json.dump(config, fp)
        log_path = f"{WORK}/lb1/var/log/haproxy.log"
        log_start = os.path.getsize(log_path)
        out = os.path.join(WORK, "ab")
        shutil.rmtree(out, ignore_errors=True)
        result = subprocess.run(
            [sys.executable, "-m", "loadtests", "ab", "--deployed", "--stack-config", config_path,
             "--remote-workers", "2", "--master-bind", "10.231.0.1", "--master-port", str(MASTER_PORT),
             "--users", "8", "--spawn-rate", "8", "--warmup", "3", "--duration", "10", "--out", out],
            cwd=ROOT, text=True, capture_output=True, timeout=300, check=False)
    finally:
        stop(tunnel)
    results.append(("A/B with the master here and lg1's workers exits 0", result.returncode == 0,
                    (result.stdout + result.stderr)[-1500:] if result.returncode else ""))
    if result.returncode != 0:
        return results
    (folder,) = os.listdir(out)
    with open(os.path.join(out, folder, "report.json"), encoding="utf-8") as fp:
        report = json.load(fp)
    servers = {name: (s["requests"], s["failures"]) for name, s in report["servers"].items()}
    results.append(("A/B: every server of the pool answered, no failure",
                    len(servers) == 4 and all(n > 0 and f == 0 for n, f in servers.values()), servers))
    results.append(("A/B report names the 2 remote workers", report["meta"]["remote_workers"] == 2,
                    report["meta"]["remote_workers"]))
    with open(log_path, encoding="utf-8", errors="replace") as fp:
        fp.seek(log_start)
        # requests of the frontend "plone" (the stats listener logs the tunnel's scrapes)
        sources = re.findall(r"^(\d+\.\d+\.\d+\.\d+):\d+ \[[^]]+\] plone ", fp.read(), re.MULTILINE)
    counted = {address: sources.count(address) for address in set(sources)}
    requests = sum(n for n, _f in servers.values())
    results.append(("every request HAProxy logged during the A/B came from lg1 (10.231.0.5)",
                    set(counted) == {"10.231.0.5"} and counted["10.231.0.5"] >= requests, counted))
    return results
