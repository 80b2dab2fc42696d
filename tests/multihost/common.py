"""What every module of the multihost harness shares: the run's hosts, namespaces and
addresses (the bridge, the internet's and pebble's namespaces, the webhook, the Locust
master's port), its state (``STORAGE`` and ``HOSTS``, set by main() for --storage;
``PEBBLE`` and ``BOOTED``, the processes teardown stops), and the helpers that run commands
(in a namespace too), probe TCP ports from one, and stop a process."""
import json
import os
import subprocess
import sys

#: The checkout (this package is tests/multihost/).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ANSIBLE = os.path.join(ROOT, "ansible")
WORK = "/tmp/pdmh"
BRIDGE = "pdmh0"
#: /etc/cron.d files of the deployment's schedules (zeo1 and app1 each write theirs).
CRON_FILES = {"zeoserver": "plonedeploy-multihost-zeoserver", "zeoclient": "plonedeploy-multihost-zeoclient",
              "postgresql": "plonedeploy-multihost-postgresql", "haproxy": "plonedeploy-multihost-haproxy"}
#: Every host either storage deploys: inventory name -> (namespace, address).
ALL_HOSTS = {
    "zeo1": ("pdmh-zeo", "10.231.0.2"),
    "db1": ("pdmh-db", "10.231.0.6"),
    "app1": ("pdmh-app", "10.231.0.3"),
    "lb1": ("pdmh-lb", "10.231.0.4"),
    "lg1": ("pdmh-lg", "10.231.0.5"),
}
#: The storage's database host and inventory (--storage).
STORAGES = {"zeo": ("zeo1", "inventories/multihost"),
            "relstorage": ("db1", "inventories/multihost-relstorage")}
#: The storage of this run (main() sets it for --storage: read it as ``common.STORAGE``).
STORAGE = "zeo"
#: The hosts of this run (main() sets them for --storage, in place: ``from .common import
#: HOSTS`` sees them).
HOSTS = {name: ALL_HOSTS[name] for name in ("zeo1", "app1", "lb1", "lg1")}
PG_PORT = 5432
#: The namespace standing for the internet: on the bridge, in no inventory group, no sshd.
INTERNET = ("inet1", "pdmh-inet", "10.231.0.7")
#: The ACME CA: Debian's pebble (Let's Encrypt's test CA) in a namespace of its own, on the
#: bridge, in no group, no sshd. It resolves the balancer's name through
#: /etc/netns/pdmh-acme/hosts (ip netns exec binds it over /etc/hosts) and validates HTTP-01 on
#: lb1's plain listener (8080, its "httpPort"); lb1's certbot reaches its directory by address.
ACME = ("acme1", "pdmh-acme", "10.231.0.8")
#: The name lb1 serves and the ACME certificate certifies (in haproxy_server_names too).
ACME_NAME = "lb1.pdmh.test"
ACME_DIRECTORY = f"https://{ACME[2]}:14000/dir"
#: pebble's management interface (its roots: https://<it>/roots/0).
ACME_MANAGEMENT = f"https://{ACME[2]}:15000"
#: pebble and the test CA of its own HTTPS certificate.
ACME_WORK = "/tmp/pdmh/acme"
ACME_HOSTS_DIR = f"/etc/netns/{ACME[1]}"
#: pebble's process (setup() starts it, teardown() stops it).
PEBBLE = []
#: The host keys of the namespaces' sshd (one key, written by setup() from its public half:
#: no key is trusted on first use), named by the inventory (UserKnownHostsFile).
KNOWN_HOSTS = f"{WORK}/known_hosts"
SSH_OPTIONS = ["-o", f"UserKnownHostsFile={KNOWN_HOSTS}", "-o", "StrictHostKeyChecking=yes"]
#: The test webhook receiver of Alertmanager's notifications, on the control host (the
#: bridge's address: lb1's Alertmanager reaches it over the namespace network).
WEBHOOK = ("10.231.0.1", 15580)
#: The ZEO clients on app1 (inventories/multihost/group_vars/zeoclients.yml).
CLIENT_PROGRAMS = ("client1", "client2", "client3", "client4", "uploads")
#: The Locust master's port on the control host (not Locust's 5557, which a local
#: --processes run of the test suite may hold on every address).
MASTER_PORT = 15557


def sh(*cmd, check=True, capture=False, timeout=600):
    """Run a command; return its stdout when ``capture``."""
    result = subprocess.run(cmd, check=check, text=True, timeout=timeout,
                            capture_output=capture)
    return result.stdout if capture else ""


def in_ns(ns, *cmd, **kwargs):
    return sh("ip", "netns", "exec", ns, *cmd, **kwargs)


#: Run in a namespace by probe(): connects to each (address, port) of argv[1] (JSON) and
#: prints what happened: open, firewall (EHOSTUNREACH: the ICMP admin-prohibited of the
#: firewall's reject), refused (ECONNREFUSED: nothing listens) or timeout.
_PROBE = """
import errno, json, socket, sys
out = []
for address, port in json.loads(sys.argv[1]):
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    sock.settimeout(3)
    code = sock.connect_ex((address, port))
    sock.close()
    out.append({0: "open", errno.EHOSTUNREACH: "firewall", errno.ECONNREFUSED: "refused",
                errno.EAGAIN: "timeout", errno.ETIMEDOUT: "timeout"}.get(code, errno.errorcode.get(code, str(code))))
print(json.dumps(out))
"""


def probe(ns, targets):
    """What a TCP connection from namespace ``ns`` to each ``(address, port)`` meets."""
    return json.loads(in_ns(ns, sys.executable, "-c", _PROBE, json.dumps(targets), capture=True))


def boot_unit(name):
    """The boot unit the process_manager role writes for host ``name``'s prefix."""
    return f"/etc/systemd/system/plonedeploy-supervisord-{WORK.strip('/').replace('/', '-')}-{name}.service"


def stop(process):
    """SIGTERM to ``process`` (a Popen), SIGKILL when it has not ended after 10 s."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


#: supervisord started by crash_test() as boot would (the unit's ExecStart, in the foreground).
BOOTED = []
