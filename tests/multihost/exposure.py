"""Exposure and service users: every TCP listener of every host, probed from the
internet's namespace, lg1, its intended peers and the control host (the firewall's view);
no process of the deployment runs as root but supervisord and HAProxy's master, and the
clients' user cannot write their build."""
import json
import pwd
import re
import subprocess
import sys

from .common import _PROBE, HOSTS, INTERNET, PG_PORT, WORK, in_ns, probe


def listeners():
    """Every TCP listener of every host but loopback: ``[(host, address, port, process)]``
    (a wildcard listener under the host's address)."""
    found = set()
    for name, (ns, address) in HOSTS.items():
        for line in in_ns(ns, "ss", "-Htlnp", capture=True).splitlines():
            host, _, port = line.split()[3].rpartition(":")
            host = host.strip("[]")
            if host.startswith("127.") or host == "::1" or "%" in host:
                continue
            process = re.search(r'users:\(\("([^"]+)"', line)
            found.add((name, address if host in ("0.0.0.0", "*", "::") else host, int(port),
                       process.group(1) if process else "?"))
    return sorted(found)


#: Who may reach a listener besides the host itself: "public" (anyone), or the namespaces
#: ("control": this one, the admin network) whose connections the firewall lets in.
def allowed_from(host, port):
    if host == "lb1" and port in (8080, 443):
        return "public"
    if port == 22:
        return {"control"}
    if (host, port) in (("zeo1", 8100), ("db1", PG_PORT), ("lb1", 6081)):
        return {"pdmh-app"}  # ZEO, PostgreSQL, varnish's purge listener: the ZEO clients
    if host == "app1" and port in (8079, 8081, 8082, 8083, 8084):
        return {"pdmh-lb"}  # the Zope clients: the balancer
    if port in (8091, 8092, 8093, 8094, 8095, 9100):
        return {"pdmh-lb"}  # the exporters: the monitoring host
    return set()


def exposure_checks():
    """The internet's view (inet1, on the bridge, in no group) of every TCP port any process
    listens on, on every host, and each port's intended peers' view: prints the table.
    Returns ``[(label, passed, detail)]``."""
    rows = listeners()
    targets = [(address, port) for _h, address, port, _p in rows]
    seen = {"internet": probe(INTERNET[1], targets), "lg1": probe("pdmh-lg", targets)}
    for ns in ("pdmh-app", "pdmh-lb"):
        seen[ns] = probe(ns, targets)
    seen["control"] = json.loads(subprocess.run([sys.executable, "-c", _PROBE, json.dumps(targets)], text=True,
                                                capture_output=True, timeout=600, check=True).stdout)
    print(f"{'host':5} {'listener':20} {'process':18} {'internet':9} {'lg1':9} intended peers")
    wrong = []
    for index, (host, address, port, process) in enumerate(rows):
        intended = allowed_from(host, port)
        internet, lg1 = seen["internet"][index], seen["lg1"][index]
        peers = {} if intended == "public" else {
            peer: seen[peer][index] for peer in intended if peer != HOSTS[host][0]}
        print(f"{host:5} {address + ':' + str(port):20} {process:18} {internet:9} {lg1:9} "
              f"{'anyone' if intended == 'public' else peers or '-'}")
        expected_outside = "open" if intended == "public" else None
        if (expected_outside == "open") != (internet == "open") or (
                host != "lg1" and (expected_outside == "open") != (lg1 == "open")):  # lg1 to itself: loopback
            wrong.append((host, f"{address}:{port}", process, "internet", internet, "lg1", lg1))
        if any(result != "open" for result in peers.values()):
            wrong.append((host, f"{address}:{port}", process, "peers", peers))
    public = sorted(f"{address}:{port}" for (_h, address, port, _p), r in zip(rows, seen["internet"]) if r == "open")
    return [(f"inet1 and lg1 reach only the balancer's public listeners ({len(rows)} listeners on "
             f"{len(HOSTS)} hosts probed; open from the internet: {public}); from app1 the storage, from lb1 the "
             "Zope ports, from the monitoring host the exporters, from the control host SSH",
             not wrong and public == ["10.231.0.4:443", "10.231.0.4:8080"], wrong)]


def service_user_checks():
    """On every host no process of the deployment runs as root but supervisord itself and
    HAProxy's master (whose workers are haproxy's); the ZEO clients' user cannot write
    their build. Returns ``[(label, passed, detail)]``."""
    import psutil

    results = []
    for name, (_ns, _address) in HOSTS.items():
        with open(f"{WORK}/{name}/var/run/supervisord.pid", encoding="ascii") as fp:
            supervisord = psutil.Process(int(fp.read()))
        processes = supervisord.children(recursive=True)
        # by effective uid: varnishd's manager keeps real uid 0 (to regain it for its child)
        # but runs as varnish, its unix jail's design
        root = [p for p in processes if p.uids().effective == 0]
        masters = [p for p in root if p.name() == "haproxy" and p.children()
                   and all(c.username() == "haproxy" for c in p.children())]
        users = sorted({f"{p.name()}:{pwd.getpwuid(p.uids().effective).pw_name}" for p in processes})
        results.append((f"{name}: no process runs as root but supervisord and HAProxy's master "
                        f"(workers: haproxy){' ' + str(len(masters)) + ' master' if masters else ''}",
                        bool(processes) and root == masters and (name != "lb1" or bool(masters)),
                        {"root": [" ".join(p.cmdline()[:3]) for p in root if p not in masters], "users": users}))
    writable = {path: subprocess.run(["runuser", "-u", "plone", "--", "test", "-w", f"{WORK}/app1/zeoclient/{path}"],
                                     timeout=30, check=False).returncode == 0
                for path in ("current/bin", "current/parts", "current/parts/client1/etc/zope.conf", "var")}
    results.append(("app1: the clients' user (plone) writes var/, not the release's bin/, parts/ or zope.conf",
                    writable == {"current/bin": False, "current/parts": False,
                                 "current/parts/client1/etc/zope.conf": False, "var": True},
                    writable))
    return results
