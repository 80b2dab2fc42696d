"""Crash, self-healing and alerts: a host's processes killed under writes and booted again
(crash_test), lb1's /readyz probes and client2's memory watchdog (selfheal_checks), and
SiteDown through Alertmanager to the webhook receiver this harness runs on the control
host (alert_test; main() starts the receiver as ``RECEIVER``)."""
import base64
import json
import os
import re
import shlex
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from plonedeploy.stack import rolling

from .common import BOOTED, CLIENT_PROGRAMS, HOSTS, WORK, boot_unit, in_ns, sh


def crash_test(name):
    """Kill every process of host ``name``'s namespace with SIGKILL while a writer posts
    documents through HAProxy, restart its sshd, run what boot runs (the boot unit's
    ExecStart), and require /Plone 200 through HAProxy within 120 s and every write that got
    a 201 readable. Returns ``[(label, passed, detail)]``."""
    ns = HOSTS[name][0]
    password = open(f"{WORK}/app1/zeoclient/var/admin-password", encoding="ascii").read().strip()
    auth = "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE

    def call(method, path, body=None):
        request = urllib.request.Request(
            "https://10.231.0.4" + path, method=method, data=json.dumps(body).encode() if body else None,
            headers={"Authorization": auth, "Accept": "application/json", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=15, context=insecure) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError as exc:
            return type(exc).__name__

    writes, stop, killed_at = [], threading.Event(), []

    def writer():
        number = 0
        while not stop.is_set():
            number += 1
            document = f"crash-{name}-{number}"
            status = call("POST", "/Plone", {"@type": "Document", "id": document, "title": document})
            writes.append((document, status, bool(killed_at)))
            time.sleep(0.2)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while sum(1 for w in writes if w[1] == 201) < 5 and time.monotonic() < deadline:
        time.sleep(0.5)
    pids = sh("ip", "netns", "pids", ns, capture=True).split()
    killed_at.append(time.monotonic())
    for pid in pids:
        sh("kill", "-KILL", pid, check=False)
    for _ in range(50):
        if not sh("ip", "netns", "pids", ns, capture=True).split():
            break
        time.sleep(0.1)
    in_ns(ns, "/usr/sbin/sshd", "-f", os.path.join(WORK, f"sshd-{name}.conf"))
    unit = open(boot_unit(name), encoding="utf-8").read()
    exec_start = shlex.split(re.search(r"^ExecStart=(.*)$", unit, re.MULTILINE).group(1))
    booted = time.monotonic()
    BOOTED.append(subprocess.Popen(["ip", "netns", "exec", ns, *exec_start], start_new_session=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    up = None
    while time.monotonic() < booted + 120:
        if call("GET", f"/Plone?crash-probe={time.monotonic()}") == 200:  # a new URL: past the cache
            up = time.monotonic() - booted
            break
        time.sleep(1)
    time.sleep(5)  # a few writes after the recovery too
    stop.set()
    thread.join(30)
    acknowledged = [w for w in writes if w[1] == 201]
    lost = [document for document, _status, _after in acknowledged if call("GET", f"/Plone/{document}") != 200]
    before = sum(1 for w in acknowledged if not w[2])
    failed = len(writes) - len(acknowledged)
    return [(f"crash of {name} (SIGKILL to its {len(pids)} processes, boot unit's ExecStart): /Plone 200 through "
             f"HAProxy {'in %.0f s' % up if up is not None else 'not within 120 s'}; {len(acknowledged)} writes "
             f"acknowledged ({before} before the kill), {len(lost)} lost; {failed} refused during the outage",
             up is not None and not lost and before >= 5, {"lost": lost[:10]})]


class WebhookReceiver:
    """Alertmanager's webhook receiver: a small HTTP server on the control host that keeps
    every notification (its JSON) with the time it arrived (time.monotonic())."""

    def __init__(self, address):
        self.received = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    payload = json.loads(body)
                except ValueError:
                    payload = {"unparsed": body.decode(errors="replace")}
                receiver.received.append((time.monotonic(), payload))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(address, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, alertname, status, since, timeout):
        """Seconds from ``since`` until a notification of ``alertname`` with ``status``
        (firing, resolved) that arrived after ``since``; None after ``timeout`` s."""
        deadline = since + timeout
        while True:
            for arrived, payload in list(self.received):
                if arrived >= since and payload.get("status") == status and any(
                        a.get("labels", {}).get("alertname") == alertname and a.get("status") == status
                        for a in payload.get("alerts", [])):
                    return arrived - since
            if time.monotonic() > deadline:
                return None
            time.sleep(1)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


#: Started by main() once the bridge exists.
RECEIVER = None


#: The metrics (and probes) port of each ZEO client on app1 (group_vars/zeoclients.yml).
METRICS_PORTS = {"client1": 8091, "client2": 8092, "client3": 8094, "client4": 8095, "uploads": 8093}


def _from_lb1(url):
    """``(status, body)`` of a GET of ``url`` from lb1's namespace (app1's firewall lets the
    balancer reach the metrics ports, not this control host)."""
    out = in_ns("pdmh-lb", "curl", "-s", "--max-time", "10", "-w", "\n%{http_code}", url, check=False, capture=True)
    body, _, status = out.rpartition("\n")
    return int(status) if status.isdigit() else None, body.strip()


def selfheal_checks(wait=300):
    """Issue 28 across hosts. Probes: lb1's HAProxy checks ``/readyz`` on each client's
    metrics port on 10.231.0.3 (``check addr ... port ...``) and every check passes (L7OK);
    each client answers ``/readyz`` 200 to lb1. Memory watchdog: client2 (``memory_limit:
    64MB`` in the inventory, grace 20 s, 1 recycle per hour) was recycled once by its
    watchdog (its state file has one time) and is then held by the backoff
    (``plonedeploy_memory_recycle_blocked{reason="backoff"} 1``,
    ``plonedeploy_memory_restarts_total 1``); client1's peers are the other page clients'
    addresses; the alert ZopeClientMemoryNotRecycled reached the webhook. Waits at most
    ``wait`` seconds for the recycle, the backoff and the alert. Returns ``[(label, passed,
    detail)]``."""
    out = []
    config = open(f"{WORK}/lb1/haproxy/haproxy.cfg", encoding="utf-8").read()
    lines = {name: f" check addr 10.231.0.3 port {port}" in config for name, port in METRICS_PORTS.items()}
    socket_path = re.search(r"^\s*stats socket (\S+)", config, re.MULTILINE).group(1)
    checks = {}
    for _ in range(30):  # a check under way after the deploy's restarts: look again
        checks = {name: rolling.server_stats(socket_path, "uploads" if name == "uploads" else "zeoclients",
                                             name)["check_status"] for name in METRICS_PORTS}
        if set(checks.values()) == {"L7OK"}:
            break
        time.sleep(2)
    out.append(("probes: lb1's HAProxy checks GET /readyz on each client's metrics port on 10.231.0.3, all L7OK",
                config.count("option httpchk GET /readyz") >= 2 and all(lines.values())
                and set(checks) == set(METRICS_PORTS) and set(checks.values()) == {"L7OK"},
                {"check addr/port": lines, "check_status": checks}))
    answers = {name: _from_lb1(f"http://10.231.0.3:{port}/readyz") for name, port in METRICS_PORTS.items()}
    out.append(("probes: every client answers /readyz 200 ready to lb1",
                all(answer == (200, "ready") for answer in answers.values()), answers))

    def ini(name):
        return open(f"{WORK}/app1/zeoclient/current/parts/{name}/etc/wsgi.ini", encoding="utf-8").read()

    def setting(text, key):
        found = re.search(rf"^{key} = (.*)$", text, re.MULTILINE)
        return found.group(1).strip() if found else None

    peers = setting(ini("client1"), "memory_limit_peers")
    out.append(("watchdog: client1's peers are client2's, client3's and client4's metrics addresses (not uploads')",
                sorted((peers or "").split()) == ["10.231.0.3:8092", "10.231.0.3:8094", "10.231.0.3:8095"], peers))
    state_file = setting(ini("client2"), "memory_state_file")
    deadline, recycles, series = time.monotonic() + wait, [], {}
    while True:
        recycles = open(state_file).read().split() if state_file and os.path.exists(state_file) else []
        status, text = _from_lb1("http://10.231.0.3:8092/metrics")
        series = {name: float(value) for name, value in re.findall(
            r'^(plonedeploy_memory_(?:restarts_total|recycle_blocked\{reason="backoff"\}|limit_bytes)) (\S+)$',
            text or "", re.MULTILINE)}
        if (len(recycles) == 1 and series.get('plonedeploy_memory_recycle_blocked{reason="backoff"}') == 1) \
                or time.monotonic() > deadline:
            break
        time.sleep(5)
    out.append(("watchdog: client2 (memory_limit 64MB, 1 per hour) recycled once by itself, then held by the backoff",
                len(recycles) == 1 and series.get("plonedeploy_memory_restarts_total") == 1
                and series.get('plonedeploy_memory_recycle_blocked{reason="backoff"}') == 1
                and series.get("plonedeploy_memory_limit_bytes") == 64 * 1024 * 1024,
                {"state file": state_file, "recycles": recycles, "metrics": series}))

    def alerted():
        return any(a.get("labels", {}).get("alertname") == "ZopeClientMemoryNotRecycled"
                   and a.get("labels", {}).get("reason") == "backoff" and a.get("status") == "firing"
                   for _, payload in list(RECEIVER.received) for a in payload.get("alerts", []))

    while not alerted() and time.monotonic() < deadline + 180:  # Prometheus' for: 2m after the backoff
        time.sleep(5)
    out.append(("watchdog: ZopeClientMemoryNotRecycled (reason backoff) reached the webhook", alerted(),
                sorted({a.get("labels", {}).get("alertname")
                        for _, p in RECEIVER.received for a in p.get("alerts", [])})))
    return out


def alert_test():
    """Stop every ZEO client of app1: HAProxy answers 503, the blackbox exporter's probe on
    lb1 fails, Prometheus fires SiteDown after monitoring_site_down_for, Alertmanager sends
    it to the receiver. Then start them again and wait for the resolution.
    Returns ``[(label, passed, detail)]``."""
    supervisorctl = ["supervisorctl", "-c", f"{WORK}/app1/etc/supervisord.conf"]
    stopped = time.monotonic()
    in_ns("pdmh-app", *supervisorctl, "stop", *CLIENT_PROGRAMS, capture=True, check=False)
    fired = RECEIVER.wait_for("SiteDown", "firing", stopped, 180)
    others = sorted({a.get("labels", {}).get("alertname") for arrived, p in RECEIVER.received if arrived >= stopped
                     for a in p.get("alerts", [])})
    started = time.monotonic()
    in_ns("pdmh-app", *supervisorctl, "start", *CLIENT_PROGRAMS, capture=True, check=False, timeout=300)
    resolved = RECEIVER.wait_for("SiteDown", "resolved", started, 300) if fired is not None else None
    back = False
    for _ in range(120):  # the site itself, before the next checks
        try:
            with urllib.request.urlopen(f"https://10.231.0.4/Plone/@@ok?alert-test={time.monotonic()}",
                                        timeout=10) as response:
                if response.status == 200:
                    back = True
                    break
        except OSError:
            pass
        time.sleep(1)
    firing = ("SiteDown at the webhook %.0f s after every ZEO client was stopped" % fired
              if fired is not None else "no SiteDown at the webhook within 180 s of stopping every ZEO client")
    resolution = ("its resolution %.0f s after they were started again" % resolved
                  if resolved is not None else "no resolution within 300 s of starting them again")
    return [(f"alerts: {firing}; {resolution} (Alertmanager on lb1 -> webhook on 10.231.0.1)",
             fired is not None and fired <= 180 and resolved is not None, {"alerts since the stop": others}),
            ("the site answers again after the alert test", back, "")]
