"""Multi-host deployment for real: four network namespaces, sshd in each, site.yml over SSH.

Usage (root; ``make multihost``, ``make multihost MULTIHOST_STORAGE=relstorage``)::

    .venv/bin/python tests/multihost.py [--keep] [--storage zeo|relstorage]

``--storage relstorage`` deploys ``inventories/multihost-relstorage`` instead: PostgreSQL
(the postgresql role) on ``pdmh-db`` (10.231.0.6) in place of the ZEO server, the clients
RelStorage clients of it, and checks the database side (below) instead of ZEO's.

What it does, and undoes at the end (also after a failure, unless ``--keep``):

1. creates a bridge ``pdmh0`` (10.231.0.1/24) in this namespace and four namespaces
   ``pdmh-zeo`` (10.231.0.2), ``pdmh-app`` (10.231.0.3), ``pdmh-lb`` (10.231.0.4),
   ``pdmh-lg`` (10.231.0.5, the load generator), each joined to the bridge by a veth pair
   and running its own sshd (key-only root login);
2. runs ``ansible-playbook -i inventories/multihost -i <generated> site.yml`` over SSH:
   the multihost inventory's group_vars with these addresses and one prefix per host
   under /tmp/pdmh (the namespaces share this machine's file system);
3. verifies: every program RUNNING in its namespace; the four paths through HAProxy at
   10.231.0.4:8080 (blob 5,242,880 bytes); the edge rules (a foreign Host gets 421, a
   100 kB POST goes to the upload client, a 100-byte one to the pool); ZEO listens only on 10.231.0.2 and the app
   host's ZEO connections go from 10.231.0.3 to 10.231.0.2:8100 (namespace network); the
   mixed pool: pyruvate, waitress and gunicorn (client3, ``threads: auto``) each serve, and
   client3's threads and its HAProxy maxconn are the recipe's auto rule for app1;
   the cache tier (varnish on lb1): the second anonymous /Plone over https is a hit,
   varnish listens on 127.0.0.1:6081 and 10.231.0.4:6081 (the app host's purges), a PURGE
   from a namespace that is not a ZEO client (zeo1) gets 405, one from the app host 200;
   nothing listens on the demo ports of this namespace's loopback; the schedule: zeo1's
   cron file (/etc/cron.d/plonedeploy-multihost-zeoserver) has its zeopack, backup,
   snapshotbackup and logrotate jobs, app1's its logrotate job; the A/B test with its
   Locust master here (10.231.0.1, the control host) and its users on lg1's two workers
   (``python -m loadtests ab --deployed --remote-workers 2``, HAProxy's stats through an SSH
   tunnel to lb1's localhost): both servers answer, no failure, every request HAProxy logs
   comes from 10.231.0.5, which is served on the plain port while others get 301;
   alerts: Alertmanager on lb1 sends to a webhook receiver this script runs on the control
   host (10.231.0.1:15580); self-healing (issue 28): lb1's HAProxy checks ``/readyz`` on each
   client's metrics port over the namespace network (all L7OK, each answers 200 to lb1),
   client2's memory watchdog (``memory_limit: 64MB``, 1 recycle per hour in the inventory)
   recycled it once, drained, then its backoff holds it and ZopeClientMemoryNotRecycled
   reaches the receiver; with every ZEO client of app1 stopped, the blackbox exporter's
   probe of https://10.231.0.4/Plone/@@ok fails and "SiteDown" must reach the receiver
   within 180 s; after the clients are started again, its resolution within 300 s;
   ACME: Debian's pebble runs in a sixth namespace ``pdmh-acme`` (10.231.0.8, no sshd; its
   HTTPS certificate from a test CA made here, the balancer's name ``lb1.pdmh.test`` in
   /etc/netns/pdmh-acme/hosts, HTTP-01 on lb1's plain listener 8080); lb1's certbot gets its
   certificate in the first run (checked: chain to pebble's root, the files' modes and
   owners, the challenge through HAProxy's backend acme), then the cron job's renewal
   command, forced, runs under two GET loops over https: 0 failed, a new serial;
   with ``--storage relstorage`` instead of ZEO's checks: PostgreSQL listens on
   10.231.0.6:5432 only, app1's connections go from 10.231.0.3 there, the clients'
   zope.conf has ``<relstorage>`` and no ``<zeoclient>``, the site's objects and its blob
   are rows of the database, a login from lb1 (not a client host) with the right password
   is refused by pg_hba.conf while the same login from app1 works, and the cron jobs (db1:
   pg_dump with retention; app1: zodbpack, logrotate) run once the way cron runs them (the
   dump lands, mode 0600);
4. runs site.yml a second time (expects changed=0);
5. tears down: supervisord of each host (which stops its programs), sshd and pebble by PID,
   the namespaces and the bridge, the cron files and /etc/netns/pdmh-acme.

Prints each PLAY RECAP with its wall time. Exit status 0 when every check passed.
All traffic stays on this machine: the bridge and namespaces exist only during the run.
"""
import argparse
import base64
import hashlib
import importlib.metadata
import http.client
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "recipes", "plonedeploy.recipe", "src"))  # run as a script, not by pytest
sys.path.insert(0, os.path.join(ROOT, "recipes", "plonedeploy.runtime", "src"))  # the recipe imports it
from plonedeploy.stack import rolling, rules  # noqa: E402  (after the path above)

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
STORAGE = "zeo"
#: The hosts of this run (main() sets them for --storage).
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
CLIENT_PROGRAMS = ("client1", "client2", "client3", "uploads")
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


_APT_NAME = re.compile(r"^\s*ansible\.builtin\.apt:\n\s+name: (.+)$", re.MULTILINE)


def _yaml_names(text):
    """``a`` or ``[a, b]`` (one line of the roles' YAML) -> ``["a"]`` or ``["a", "b"]``."""
    text = text.strip().strip("\"'")
    return [n.strip().strip("\"'") for n in text.strip("[]").split(",")] if text.startswith("[") else [text]


def role_packages():
    """Every Debian package the roles' ``ansible.builtin.apt`` tasks install, read from
    ansible/roles/*/tasks/*.yml; a ``{{ variable }}`` is looked up in the roles' defaults.
    Raises RuntimeError for a name it cannot resolve (a new way of naming packages)."""
    defaults, names = {}, set()
    roles = os.path.join(ANSIBLE, "roles")
    for role in os.listdir(roles):
        path = os.path.join(roles, role, "defaults", "main.yml")
        if os.path.exists(path):
            defaults.update(re.findall(r"^(\w+): (.+)$", open(path, encoding="utf-8").read(), re.MULTILINE))
        tasks = os.path.join(roles, role, "tasks")
        for name in sorted(os.listdir(tasks)) if os.path.isdir(tasks) else ():
            for value in _APT_NAME.findall(open(os.path.join(tasks, name), encoding="utf-8").read()):
                names.update(_yaml_names(value))
    resolved = set()
    for name in names:
        variable = re.fullmatch(r"\{\{\s*(\w+)\s*\}\}", name)
        if variable and variable.group(1) not in defaults:
            raise RuntimeError(f"role_packages: {name} is not in any role's defaults/main.yml")
        resolved.update(_yaml_names(defaults[variable.group(1)]) if variable else [name])
    return sorted(resolved)


def setup():
    # The namespaces share this machine's file system but have no route to Debian's
    # mirrors: what the roles' apt tasks install must be here already (they then find it
    # present), and sshd and cron for the run itself.
    packages = role_packages() + ["openssh-server", "cron", "logrotate", "rsync", "pebble"]
    missing = [p for p in packages if sh("dpkg-query", "-W", "-f=${Status}", p.split("=")[0], check=False,
                                         capture=True).strip() != "install ok installed"]
    if missing:
        sh("apt-get", "install", "-y", "-q", "--no-install-recommends", *missing)
    os.makedirs(WORK, exist_ok=True)
    os.makedirs("/run/sshd", exist_ok=True)
    for name in HOSTS:  # every run deploys from scratch
        shutil.rmtree(os.path.join(WORK, name), ignore_errors=True)
    key = os.path.join(WORK, "id_ed25519")
    if not os.path.exists(key):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(WORK, "host_key"))
    shutil.copy(key + ".pub", os.path.join(WORK, "authorized_keys"))
    # The namespaces have no route to PyPI: pip and buildout's develop step install the
    # pinned bootstrap wheels from a local folder instead.
    wheels = os.path.join(WORK, "wheels")
    # The buildout venv's pins (the buildout role's buildout_venv_packages; a test of
    # test_ansible.py compares them), then Locust for the load generator with its own
    # dependencies: one resolution for both would pull packaging and platformdirs apart.
    sh(sys.executable, "-m", "pip", "download", "--quiet", "-d", wheels,
       "-r", os.path.join(ROOT, "requirements-buildout.txt"))
    sh(sys.executable, "-m", "pip", "download", "--quiet", "-d", wheels,
       "locust==" + importlib.metadata.version("locust"))
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", "10.231.0.1/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    # pebble's namespace resolves the balancer's name by its own hosts file (before the
    # namespace's first ip netns exec, which binds it over /etc/hosts).
    os.makedirs(ACME_HOSTS_DIR, exist_ok=True)
    with open("/etc/hosts", encoding="utf-8") as fp, open(f"{ACME_HOSTS_DIR}/hosts", "w", encoding="utf-8") as out:
        out.write(fp.read() + f"\n{HOSTS['lb1'][1]} {ACME_NAME}\n")
    for name, (ns, address) in [*HOSTS.items(), (INTERNET[0], INTERNET[1:]), (ACME[0], ACME[1:])]:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", f"{ns}-br", "type", "veth", "peer", "name", f"{ns}-eth")
        sh("ip", "link", "set", f"{ns}-br", "master", BRIDGE)
        sh("ip", "link", "set", f"{ns}-br", "up")
        sh("ip", "link", "set", f"{ns}-eth", "netns", ns)
        in_ns(ns, "ip", "link", "set", "lo", "up")
        in_ns(ns, "ip", "addr", "add", f"{address}/24", "dev", f"{ns}-eth")
        in_ns(ns, "ip", "link", "set", f"{ns}-eth", "up")
        if name in (INTERNET[0], ACME[0]):
            continue  # no sshd: nothing is deployed there
        config = os.path.join(WORK, f"sshd-{name}.conf")
        with open(config, "w") as fp:
            fp.write(
                f"ListenAddress {address}\nHostKey {WORK}/host_key\nPidFile {WORK}/sshd-{name}.pid\n"
                f"AuthorizedKeysFile {WORK}/authorized_keys\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nStrictModes no\nUsePAM no\nSubsystem sftp internal-sftp\n"
            )
        in_ns(ns, "/usr/sbin/sshd", "-f", config)
    # Every namespace's sshd has the one host key made above: its public half, under each
    # address, is the known_hosts file: no host key is accepted unchecked.
    with open(os.path.join(WORK, "host_key.pub"), encoding="ascii") as fp:
        key_type, key_data = fp.read().split()[:2]
    with open(KNOWN_HOSTS, "w", encoding="ascii") as fp:
        fp.writelines(f"{address} {key_type} {key_data}\n" for _ns, address in HOSTS.values())
    inventory = {"all": {"hosts": {}}}
    for name, (_ns, address) in HOSTS.items():
        inventory["all"]["hosts"][name] = {
            "ansible_host": address,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": key,
            "ansible_ssh_common_args": " ".join(SSH_OPTIONS),
            "ansible_python_interpreter": "/usr/bin/python3",
            "plonedeploy_prefix": f"{WORK}/{name}",
            "zeoserver_eggs_directory": os.path.join(ROOT, "eggs"),
            "zeoclient_eggs_directory": os.path.join(ROOT, "eggs"),
            # The schedule (pack, backups, logrotate) goes into /etc/cron.d files of this
            # run's own (removed by teardown); setup() installs cron and logrotate on this
            # machine first: the namespaces share its file system but have no route to
            # Debian's mirrors.
            "zeoserver_cron_file": CRON_FILES["zeoserver"],
            "zeoclient_cron_file": CRON_FILES["zeoclient"],
            "postgresql_cron_file": CRON_FILES["postgresql"],
            # database_cron_jobs_run() runs the dump three times and expects the newest two
            "postgresql_backup_keep": 2,
            "buildout_environment": {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": f"{WORK}/wheels"},
            "loadgenerator_pip_environment": {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": f"{WORK}/wheels"},
            "loadgenerator_master_host": "10.231.0.1",
            # The control host is the admin network: its checks read X-Served-By and
            # X-Cache, which HAProxy removes for visitors.
            "haproxy_manage_networks": ["127.0.0.1/32", "10.231.0.1/32"],
            "loadgenerator_master_port": MASTER_PORT,
            "loadgenerator_workers": 2,
            # The firewall: SSH from the control host only; each namespace has its own
            # ruleset, and its file goes under the host's prefix (/etc is shared here).
            "firewall_admin_networks": ["10.231.0.1/32"],
            "firewall_ruleset_file": f"{WORK}/{name}/etc/nftables.conf",
            # Alertmanager (monitoring role, on lb1) notifies this script's receiver; the
            # probe meets the haproxy role's self-signed certificate (not verified, its
            # expiry still measured).
            "monitoring_alert_webhook_urls": [f"http://{WEBHOOK[0]}:{WEBHOOK[1]}/alerts"],
            "monitoring_probe_tls_verify": False,
        }
    # ACME on lb1: certbot gets its certificate from pebble for the name pebble resolves to it.
    inventory["all"]["hosts"]["lb1"].update({
        "haproxy_server_names": [HOSTS["lb1"][1], ACME_NAME],
        "haproxy_acme_directory": ACME_DIRECTORY,
        "haproxy_acme_ca_bundle": f"{ACME_WORK}/ca.pem",
        "haproxy_acme_cron_file": CRON_FILES["haproxy"],
    })
    start_pebble()
    path = os.path.join(WORK, "hosts.json")
    with open(path, "w") as fp:
        json.dump(inventory, fp, indent=2)
    return path


def start_pebble():
    """Debian's pebble in its namespace: its HTTPS certificate (for its address) from a test
    CA made here, which lb1's certbot trusts (haproxy_acme_ca_bundle); HTTP-01 on port 8080
    (lb1's plain listener); no random sleeps, no rejected nonces, no reused authorizations (a
    renewal is validated again, through HAProxy)."""
    shutil.rmtree(ACME_WORK, ignore_errors=True)
    os.makedirs(ACME_WORK)
    os.chmod(ACME_WORK, 0o755)  # lb1's certbot (the ACME user) reads ca.pem

    def openssl(*args):
        sh("openssl", *args, capture=True)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-keyout", f"{ACME_WORK}/ca.key", "-out", f"{ACME_WORK}/ca.pem", "-subj", "/CN=plonedeploy multihost test CA")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=pebble",
            "-keyout", f"{ACME_WORK}/pebble.key", "-out", f"{ACME_WORK}/pebble.csr")
    with open(f"{ACME_WORK}/san.ext", "w", encoding="ascii") as fp:
        fp.write(f"subjectAltName=IP:{ACME[2]}\n")
    openssl("x509", "-req", "-days", "2", "-in", f"{ACME_WORK}/pebble.csr", "-CA", f"{ACME_WORK}/ca.pem",
            "-CAkey", f"{ACME_WORK}/ca.key", "-CAcreateserial", "-extfile", f"{ACME_WORK}/san.ext",
            "-out", f"{ACME_WORK}/pebble.pem")
    os.chmod(f"{ACME_WORK}/ca.pem", 0o644)
    config = {"pebble": {"listenAddress": f"{ACME[2]}:14000", "managementListenAddress": f"{ACME[2]}:15000",
                         "certificate": f"{ACME_WORK}/pebble.pem", "privateKey": f"{ACME_WORK}/pebble.key",
                         "httpPort": 8080, "tlsPort": 5001, "ocspResponderURL": "",
                         "externalAccountBindingRequired": False}}
    with open(f"{ACME_WORK}/pebble.json", "w", encoding="utf-8") as fp:
        json.dump(config, fp)
    env = dict(os.environ, PEBBLE_VA_NOSLEEP="1", PEBBLE_WFE_NONCEREJECT="0", PEBBLE_AUTHZREUSE="0")
    with open(f"{ACME_WORK}/pebble.log", "w", encoding="utf-8") as log:
        PEBBLE.append(subprocess.Popen(["ip", "netns", "exec", ACME[1], "pebble", "-config", f"{ACME_WORK}/pebble.json"],
                                       env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    context = ssl.create_default_context(cafile=f"{ACME_WORK}/ca.pem")
    for _ in range(60):
        try:
            with urllib.request.urlopen(ACME_DIRECTORY, timeout=5, context=context) as response:
                json.load(response)
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"pebble did not answer at {ACME_DIRECTORY}: see {ACME_WORK}/pebble.log")


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


def teardown():
    for process in PEBBLE:
        stop(process)
    PEBBLE.clear()
    # either storage's hosts, the internet's and pebble's namespaces
    for name, (ns, _address) in [*ALL_HOSTS.items(), (INTERNET[0], INTERNET[1:]), (ACME[0], ACME[1:])]:
        config = f"{WORK}/{name}/etc/supervisord.conf"
        if os.path.exists(config):
            in_ns(ns, "supervisorctl", "-c", config, "shutdown", check=False, capture=True)
        pidfile = f"{WORK}/{name}/var/run/supervisord.pid"
        for _ in range(60):
            if not os.path.exists(pidfile):
                break
            time.sleep(1)
        sshd_pid = f"{WORK}/sshd-{name}.pid"
        if os.path.exists(sshd_pid):
            sh("kill", open(sshd_pid).read().strip(), check=False)
        # Whatever still runs in the namespace (by PID, as ip reports them) would keep it alive.
        for pid in sh("ip", "netns", "pids", ns, check=False, capture=True).split():
            sh("kill", "-9", pid, check=False)
        sh("ip", "netns", "del", ns, check=False, capture=True)
        sh("ip", "link", "del", f"{ns}-br", check=False, capture=True)
    sh("ip", "link", "del", BRIDGE, check=False, capture=True)
    for process in BOOTED:  # crash_test()'s supervisords, stopped above by supervisorctl or kill
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    for name in CRON_FILES.values():
        if os.path.exists(os.path.join("/etc/cron.d", name)):
            os.remove(os.path.join("/etc/cron.d", name))
    shutil.rmtree(ACME_HOSTS_DIR, ignore_errors=True)
    if os.path.isdir("/etc/netns") and not os.listdir("/etc/netns"):
        os.rmdir("/etc/netns")
    for name in ALL_HOSTS:
        unit = boot_unit(name)
        for path in (os.path.join(os.path.dirname(unit), "multi-user.target.wants", os.path.basename(unit)), unit):
            if os.path.lexists(path):
                os.remove(path)


def playbook(inventory, title):
    started = time.monotonic()
    result = subprocess.run(
        [os.path.join(ANSIBLE, ".venv", "bin", "ansible-playbook"),
         "-i", STORAGES[STORAGE][1], "-i", inventory, "site.yml"],
        cwd=ANSIBLE, text=True, capture_output=True, timeout=1800,
        env=dict(os.environ, ANSIBLE_NOCOLOR="1"),
    )
    seconds = time.monotonic() - started
    out = result.stdout
    log = os.path.join(WORK, re.sub(r"\W+", "-", title) + ".log")
    with open(log, "w") as fp:
        fp.write(out + result.stderr)
    print(f"## {title}: {seconds:.0f} s, exit {result.returncode} (full output: {log})")
    print(out[out.rfind("PLAY RECAP"):].strip() if "PLAY RECAP" in out else out[-5000:] + result.stderr[-3000:])
    if result.returncode != 0:
        raise SystemExit(f"{title} failed: see {log}")
    return out


def verify():
    ok = True

    def check(label, condition, detail=""):
        nonlocal ok
        ok = ok and bool(condition)
        print(f"{'PASS' if condition else 'FAIL'} {label} {detail}")

    for name, (ns, _address) in HOSTS.items():
        # supervisord says STARTING for a program's first startsecs (prometheus: 5 s and more)
        for _ in range(30):
            status = in_ns(ns, "supervisorctl", "-c", f"{WORK}/{name}/etc/supervisord.conf", "status",
                           check=False, capture=True)
            programs = dict(re.findall(r"^(\S+)\s+(\S+)", status, re.MULTILINE))
            if programs and "STARTING" not in programs.values():
                break
            time.sleep(1)
        check(f"{name}: programs RUNNING", programs and all(s == "RUNNING" for s in programs.values()),
              json.dumps(programs))
    # The site over https (port 443, the self-signed certificate the haproxy role made);
    # the plain port answers 301 there (haproxy_tls_redirect, on by default).
    base = "https://10.231.0.4"
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=insecure))
    urllib.request.install_opener(opener)
    plain = http.client.HTTPConnection("10.231.0.4", 8080, timeout=30)
    plain.request("GET", "/Plone?x=1", headers={"Host": "10.231.0.4:8080"})
    answer = plain.getresponse()
    check("plain HTTP answers 301 to https", answer.status == 301
          and answer.getheader("Location") == "https://10.231.0.4/Plone?x=1",
          f"{answer.status} {answer.getheader('Location')}")
    plain.close()
    for path, extra in (("/", {}), ("/Plone", {}), ("/Plone", {"Accept": "application/json"})):
        request = urllib.request.Request(base + path, headers=extra)
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read()
            check(f"GET {path} {extra or ''} through HAProxy on lb1", response.status == 200,
                  f"{response.status} {len(body)} bytes, X-Served-By {response.headers.get('X-Served-By')}")
    digests = set()
    for _ in range(4):
        with urllib.request.urlopen(base + "/Plone/blob-5mb/@@download/file", timeout=60) as response:
            body = response.read()
            digests.add(hashlib.sha256(body).hexdigest())
            check("blob 5MB through HAProxy", len(body) == 5 * 1024 * 1024,
                  f"{len(body)} bytes from {response.headers.get('X-Served-By')}")
    check("blob identical from both clients", len(digests) == 1)
    # The edge rules, deployed by the same template as the buildout stack's.
    for host, status in (("evil.example", 421), ("10.231.0.4", 200)):
        request = urllib.request.Request(base + "/Plone/@@ok", headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                got = response.status
        except urllib.error.HTTPError as exc:
            got = exc.code
        check(f"Host {host} -> {status}", got == status, f"got {got}")
    for size, lane in ((100, {"client1", "client2", "client3"}), (100_000, {"uploads"})):
        request = urllib.request.Request(base + "/Plone/@@ok", data=b"x" * size, method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            served = response.headers.get("X-Served-By")
        check(f"POST of {size} bytes served by {' or '.join(sorted(lane))}", served in lane, f"by {served}")
    if STORAGE == "zeo":
        listening = in_ns("pdmh-zeo", "ss", "-Htln", capture=True)
        check("ZEO listens on 10.231.0.2:8100 only", "10.231.0.2:8100" in listening
              and "0.0.0.0:8100" not in listening and "127.0.0.1:8100" not in listening, listening.split())
        conns = in_ns("pdmh-app", "ss", "-Htn", "state", "established", "dst", "10.231.0.2:8100", capture=True)
        check("app1's ZEO connections: 10.231.0.3 -> 10.231.0.2:8100 over the namespace network",
              "10.231.0.3:" in conns and "10.231.0.2:8100" in conns, conns.split())
    else:
        for label, passed, detail in database_checks():
            check(label, passed, detail)
    clients = in_ns("pdmh-app", "ss", "-Htln", capture=True)
    check("clients listen on 10.231.0.3:8081, :8082, :8083 and :8079 (uploads), not on 0.0.0.0",
          all(f"10.231.0.3:{port}" in clients for port in (8081, 8082, 8083, 8079)) and "0.0.0.0:80" not in clients)
    # The mixed pool: three servers, client3's threads by the recipe's auto rule, and
    # HAProxy's maxconn for it the same number.
    ini = open(f"{WORK}/app1/zeoclient/parts/client3/etc/wsgi.ini", encoding="utf-8").read()
    threads = int(re.search(r"^threads = (\d+)$", ini, re.MULTILINE).group(1))
    cores = int(in_ns("pdmh-app", "nproc", capture=True))
    expected = rules.auto_threads("gunicorn", cores, 4)[0]
    haproxy_cfg = open(f"{WORK}/lb1/haproxy/haproxy.cfg", encoding="utf-8").read()
    maxconn = re.search(r"^\s*server client3 \S+ .*\bmaxconn (\d+)", haproxy_cfg, re.MULTILINE)
    check(f"client3: gunicorn with threads auto = {expected} ({cores} cores, 4 clients), HAProxy maxconn the same",
          "egg:plonedeploy.runtime#gunicorn" in ini and threads == expected and maxconn
          and int(maxconn.group(1)) == expected, f"wsgi.ini threads {threads}, maxconn {maxconn and maxconn.group(1)}")
    served = set()
    # GETs with Plone's login cookie: varnish passes them (never cached) and HAProxy sends them
    # to the page pool. Not POSTs: those go to the write lane, one page client at a time.
    for _ in range(30):
        request = urllib.request.Request(base + "/Plone/@@ok", headers={"Cookie": "__ac=multihost"})
        with urllib.request.urlopen(request, timeout=30) as response:
            served.add(response.headers.get("X-Served-By"))
    check("the pool serves from pyruvate, waitress and gunicorn (client1-3)",
          served == {"client1", "client2", "client3"}, sorted(map(str, served)))
    # The cache tier: varnish on lb1 between HAProxy's TLS listener and the pool.
    answers = []
    for _ in range(2):
        with urllib.request.urlopen(base + "/Plone", timeout=60) as response:
            answers.append((response.status, response.headers.get("X-Cache"), response.read()))
    check("second anonymous GET /Plone over https is a cache hit", answers[1][:2] == (200, "HIT"),
          f"{[a[:2] for a in answers]}")
    check("the cached page has https links", b'href="https://10.231.0.4/Plone' in answers[1][2])
    varnish = in_ns("pdmh-lb", "ss", "-Htlnp", capture=True)
    check("varnish listens on 127.0.0.1:6081 and 10.231.0.4:6081 (purges from the app host)",
          "127.0.0.1:6081" in varnish and "10.231.0.4:6081" in varnish and "0.0.0.0:6081" not in varnish,
          [line.split()[3] for line in varnish.splitlines() if "varnishd" in line])
    # The unix jail: the manager runs as varnish, the cache process (named cache-main, hence
    # matched by its arguments) as vcache.
    users = sh("ps", "-eo", "user=,args=", capture=True, check=False)
    users = {line.split()[0] for line in users.splitlines()
             if "varnishd" in line and f"{WORK}/lb1/varnish/" in line}
    check("varnishd runs in its unix jail (users varnish and vcache)", users == {"varnish", "vcache"},
          sorted(users))
    # The storage's host is no ZEO client: lb1's firewall refuses its connection to varnish's
    # purge listener (before varnish's ACL would answer 405); the app host's PURGE works.
    storage_ns = HOSTS[STORAGES[STORAGE][0]][0]
    got = probe(storage_ns, [("10.231.0.4", 6081)])[0]
    check(f"PURGE from {storage_ns}: refused by lb1's firewall (ICMP admin-prohibited), varnish never sees it",
          got == "firewall", f"got {got}")
    got = in_ns("pdmh-app", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PURGE",
                "http://10.231.0.4:6081/Plone?purge-probe", capture=True, check=False)
    check("PURGE from pdmh-app -> 200", got == "200", f"got {got}")
    request = urllib.request.Request(base + "/Plone", method="PURGE")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            got = response.status
    except urllib.error.HTTPError as exc:
        got = exc.code
    check("PURGE through HAProxy -> 405", got == 405, f"got {got}")
    for label, passed, detail in acme_test():
        check(label, passed, detail)
    # Another checkout's buildout stack may use the demo ports of this namespace meanwhile:
    # only listeners of processes of this deployment (under WORK) count.
    local = sh("ss", "-Htlnp", capture=True)
    leaked = []
    for line in local.splitlines():
        if not re.search(r":(8100|8079|8081|8082|8080|8443|6081|6088)\s", line):
            continue
        for pid in re.findall(r"pid=(\d+)", line):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fp:
                    args = fp.read().replace(b"\0", b" ").decode(errors="replace")
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if WORK in args or cwd.startswith(WORK):
                leaked.append(line.split()[3])
    check("nothing of the deployment on this namespace's demo ports", not leaked, leaked)
    # The schedule: each job of the zeoserver's and the clients' cron file names its host's
    # prefix and runs a script the build made there.
    schedules = {
        "zeo": (("zeoserver", "zeo1", ("bin/zeopack", "bin/backup", "bin/snapshotbackup", "logrotate")),
                ("zeoclient", "app1", ("logrotate",))),
        "relstorage": (("postgresql", "db1", ("postgresql/pg-backup",)),
                       ("zeoclient", "app1", ("bin/zodbpack", "logrotate"))),
    }
    for role, host, wanted in schedules[STORAGE]:
        path = os.path.join("/etc/cron.d", CRON_FILES[role])
        text = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        jobs = [line for line in text.splitlines() if line and not line.startswith("#") and "=" not in line.split()[0]]
        missing = [w for w in wanted if not any(w in job and f"{WORK}/{host}/" in job for job in jobs)]
        check(f"{host}: cron schedule in {path} ({len(jobs)} jobs)", jobs and not missing, f"missing {missing}")
    if STORAGE == "relstorage":
        for label, passed, detail in database_cron_jobs_run():
            check(label, passed, detail)
    for label, passed, detail in ab_with_remote_workers():
        check(label, passed, detail)
    for label, passed, detail in service_user_checks() + exposure_checks():
        check(label, passed, detail)
    for label, passed, detail in selfheal_checks():
        check(label, passed, detail)
    for label, passed, detail in alert_test():
        check(label, passed, detail)
    for name in (STORAGES[STORAGE][0], "app1"):
        for label, passed, detail in crash_test(name):
            check(label, passed, detail)
    return ok


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
    if host == "app1" and port in (8079, 8081, 8082, 8083):
        return {"pdmh-lb"}  # the Zope clients: the balancer
    if port in (8091, 8092, 8093, 8094, 9100):
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
                for path in ("bin", "parts", "parts/client1/etc/zope.conf", "var")}
    results.append(("app1: the clients' user (plone) writes var/, not bin/, parts/ or zope.conf",
                    writable == {"bin": False, "parts": False, "parts/client1/etc/zope.conf": False, "var": True},
                    writable))
    return results


def served_certificate(context=None):
    """The certificate lb1's HTTPS listener serves for ACME_NAME (SNI): ``(DER, serial as hex)``;
    with ``context`` verified by it (chain and name)."""
    if context is None:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((HOSTS["lb1"][1], 443), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=ACME_NAME) as tls:
            der = tls.getpeercert(binary_form=True)
    serial = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-serial"], input=der,
                            capture_output=True, timeout=30, check=True).stdout.decode().strip()
    return der, serial.partition("=")[2].lower()


def _certbot_seconds(log_directory, marker):
    """Wall time of the first certbot run whose part of the debug log (certbot appends each
    run to letsencrypt.log, starting with "certbot version:") contains ``marker``: its last
    line's time minus its first's; None when no run has it."""
    path = os.path.join(log_directory, "letsencrypt.log")
    text = open(path, encoding="utf-8", errors="replace").read() if os.path.exists(path) else ""
    for run in re.split(r"\n(?=\S+ \S+:DEBUG:certbot\._internal\.main:certbot version:)", text):
        stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}):", run, re.MULTILINE)
        if marker in run and len(stamps) >= 2:
            first, last = (time.mktime(time.strptime(t, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000
                           for t, ms in (stamps[0], stamps[-1]))
            return round(last - first, 1)
    return None


def acme_test():
    """The ACME certificate on lb1 (issue 27, item 6): issued by pebble for ACME_NAME in the
    first site.yml run (the challenge answered through HAProxy's plain listener), its files
    0600 haproxy; then the renewal timer's command, run as cron runs it (forced: pebble's
    certificates last 5 years), while GET loops over https count every request: 0 failed,
    and the served serial changes. Returns ``[(label, passed, detail)]``."""
    results = []
    context = ssl.create_default_context(cafile=f"{ACME_WORK}/ca.pem")
    with urllib.request.urlopen(f"{ACME_MANAGEMENT}/roots/0", timeout=10, context=context) as response:
        root = response.read().decode("ascii")
    verified = ssl.create_default_context(cadata=root)  # pebble's root: chain and name checked
    try:
        _der, serial = served_certificate(verified)
        error = ""
    except (OSError, ssl.SSLError) as exc:
        serial, error = None, repr(exc)
    state = f"{WORK}/lb1/haproxy/acme"
    issued = _certbot_seconds(f"{state}/logs", "Requesting a certificate for")
    results.append((f"lb1 serves pebble's certificate for {ACME_NAME} (chain to pebble's root, the name), "
                    f"issued in the first site.yml run (certbot certonly {issued} s)", serial is not None,
                    f"serial {serial} {error}"))
    files = {}
    for path in (f"{WORK}/lb1/haproxy/tls/acme.pem", f"{WORK}/lb1/haproxy/tls/acme.pem.key", state):
        info = os.stat(path)
        files[path.rsplit("/", 1)[1]] = (oct(info.st_mode & 0o777), pwd.getpwuid(info.st_uid).pw_name)
    results.append(("HAProxy's copy of certificate and key 0600 haproxy; certbot's directory 0700 acme",
                    files == {"acme.pem": ("0o600", "haproxy"), "acme.pem.key": ("0o600", "haproxy"),
                              "acme": ("0o700", "acme")}, files))
    with open(f"{WORK}/lb1/var/log/haproxy.log", encoding="utf-8", errors="replace") as fp:
        challenges = re.findall(rf"^{re.escape(ACME[2])}:\d+ \[[^]]+\] plone acme/acme \S+ (\d+) .*"
                                r'"GET /\.well-known/acme-challenge/', fp.read(), re.MULTILINE)
    results.append(("pebble's HTTP-01 requests reached certbot through HAProxy's plain listener (backend acme)",
                    "200" in challenges, f"statuses {challenges}"))
    # Between renewals: the challenge path is certbot's (503 while it does not run), the rest
    # of the plain listener still redirects.
    statuses = [in_ns(ACME[1], "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                      f"http://{ACME_NAME}:8080{path}", capture=True, check=False)
                for path in ("/.well-known/acme-challenge/nothing", "/Plone")]
    results.append(("from pebble's namespace: the challenge path 503 (no certbot running), /Plone 301",
                    statuses == ["503", "301"], statuses))
    # The timer's command, from the cron file, run as cron runs it in lb1's namespace.
    path = os.path.join("/etc/cron.d", CRON_FILES["haproxy"])
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    jobs = [line.split(None, 6)[6].strip() for line in text.splitlines()
            if line.strip() and not line.startswith("#") and "=" not in line.split()[0]]
    results.append((f"lb1: the renewal's cron job in {path}", jobs == [f"{WORK}/lb1/haproxy/acme-renew"], jobs))
    if not jobs or serial is None:
        return results
    counts, failures, stop = {}, [], threading.Event()
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE

    def loop():
        # A new TLS connection per request (each meets whichever workers listen then), at
        # most ~10 requests/s per loop: the control host is not exempt from the per-address limit.
        while not stop.is_set():
            try:
                with socket.create_connection((HOSTS["lb1"][1], 443), timeout=30) as raw:
                    with insecure.wrap_socket(raw, server_hostname=ACME_NAME) as tls:
                        der = tls.getpeercert(binary_form=True)
                        tls.sendall(f"GET /Plone/@@ok HTTP/1.1\r\nHost: {ACME_NAME}\r\nConnection: close\r\n\r\n"
                                    .encode())
                        answer = b""
                        while chunk := tls.recv(65536):
                            answer += chunk
                status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/1.1 ") else b"?"
                if status != b"200":
                    failures.append(status.decode(errors="replace"))
                else:
                    key = hashlib.sha256(der).hexdigest()[:12]
                    counts[key] = counts.get(key, 0) + 1
            except OSError as exc:
                failures.append(repr(exc))
            time.sleep(0.1)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(5)
    cron_env = {"SHELL": "/bin/sh", "PATH": "/usr/bin:/bin", "HOME": "/root", "LOGNAME": "root"}
    started = time.monotonic()
    renew = subprocess.run(["ip", "netns", "exec", "pdmh-lb", "env", "-i", *(f"{k}={v}" for k, v in cron_env.items()),
                            "/bin/sh", "-c", jobs[0] + " --force-renewal --no-random-sleep-on-renew"],
                           cwd="/", capture_output=True, text=True, timeout=600, check=False)
    renewed = round(time.monotonic() - started, 1)
    time.sleep(5)
    stop.set()
    for thread in threads:
        thread.join(60)
    try:
        _der, after = served_certificate(verified)
    except (OSError, ssl.SSLError) as exc:
        after = repr(exc)
    requests = sum(counts.values())
    results.append((f"renewal (the cron job's command, forced) {renewed} s, exit {renew.returncode}: "
                    f"serial {serial} -> {after}, verified by pebble's root",
                    renew.returncode == 0 and "deployed" in renew.stdout and after not in (serial, None)
                    and re.fullmatch(r"[0-9a-f]+", after or "") is not None,
                    (renew.stdout + renew.stderr)[-1500:]))
    results.append((f"HAProxy reloaded under 2 GET loops over https: {requests} requests, {len(failures)} failed, "
                    f"served with {len(counts)} certificates", not failures and len(counts) == 2 and requests > 0,
                    {"by certificate": counts, "failures": failures[:10]}))
    return results


#: supervisord started by crash_test() as boot would (the unit's ExecStart, in the foreground).
BOOTED = []


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
METRICS_PORTS = {"client1": 8091, "client2": 8092, "client3": 8094, "uploads": 8093}


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
        return open(f"{WORK}/app1/zeoclient/parts/{name}/etc/wsgi.ini", encoding="utf-8").read()

    def setting(text, key):
        found = re.search(rf"^{key} = (.*)$", text, re.MULTILINE)
        return found.group(1).strip() if found else None

    peers = setting(ini("client1"), "memory_limit_peers")
    out.append(("watchdog: client1's peers are client2's and client3's metrics addresses (not uploads')",
                sorted((peers or "").split()) == ["10.231.0.3:8092", "10.231.0.3:8094"], peers))
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
                sorted({a.get("labels", {}).get("alertname") for _, p in RECEIVER.received for a in p.get("alerts", [])})))
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


PSQL = "/usr/lib/postgresql/15/bin/psql"


def _superuser_sql(query):
    """``query`` in db1's site database as the superuser (root -> postgres by peer on the
    Unix socket, pg_ident.conf); its output (-At: values only)."""
    return in_ns("pdmh-db", PSQL, "-X", "-At", "-h", f"{WORK}/db1/postgresql/run", "-p", str(PG_PORT),
                 "-U", "postgres", "-d", "plone", "-c", query, capture=True, check=False).strip()


def database_checks():
    """PostgreSQL on db1 and the RelStorage clients on app1 (--storage relstorage).
    Returns ``[(label, passed, detail)]``; no detail ever holds the password."""
    results = []
    listening = in_ns("pdmh-db", "ss", "-Htln", capture=True)
    others = [a for a in re.findall(r"(\S+:%d)\s" % PG_PORT, listening) if a != f"10.231.0.6:{PG_PORT}"]
    results.append((f"PostgreSQL listens on 10.231.0.6:{PG_PORT} only (not 0.0.0.0, *, 127.0.0.1)",
                    f"10.231.0.6:{PG_PORT}" in listening and not others, others))
    conns = in_ns("pdmh-app", "ss", "-Htn", "state", "established", "dst", f"10.231.0.6:{PG_PORT}", capture=True)
    results.append((f"app1's database connections: 10.231.0.3 -> 10.231.0.6:{PG_PORT} over the namespace network",
                    "10.231.0.3:" in conns, f"{len(conns.splitlines())} connections"))
    password_file = f"{WORK}/db1/postgresql/password"
    passfile = f"{WORK}/app1/zeoclient/var/pgpass"
    password = open(password_file, encoding="ascii").read().strip()
    modes = {path: oct(os.stat(path).st_mode & 0o777) for path in (password_file, passfile)}
    results.append(("the password file on db1 and the passfile on app1 are 0600, 32 characters",
                    set(modes.values()) == {"0o600"} and len(password) == 32
                    and open(passfile, encoding="ascii").read().strip().endswith(":" + password), modes))
    zope_conf = open(f"{WORK}/app1/zeoclient/parts/client1/etc/zope.conf", encoding="utf-8").read()
    results.append(("client1's zope.conf: <relstorage> on db1 with the passfile, no password, no <zeoclient>",
                    "<relstorage>" in zope_conf and f"host=10.231.0.6 port={PG_PORT} dbname=plone" in zope_conf
                    and f"passfile={passfile}" in zope_conf and "<zeoclient>" not in zope_conf
                    and password not in zope_conf, ""))
    # The built parts (zope.conf, the tools' configs), the logs, and the playbook's output.
    leaked = []
    for directory in (f"{WORK}/app1/zeoclient/parts", f"{WORK}/app1/var/log", f"{WORK}/db1/var/log",
                      f"{WORK}/app1/zeoclient/var/log"):
        for base, _dirs, files in os.walk(directory):
            for name in files:
                with open(os.path.join(base, name), "rb") as fp:
                    if password.encode() in fp.read():
                        leaked.append(os.path.join(base, name))
    for name in os.listdir(WORK):
        if name.endswith(".log") and password in open(os.path.join(WORK, name), encoding="utf-8").read():
            leaked.append(name)
    results.append(("the password is in no part, log or playbook output", not leaked, leaked))
    # The site lives in PostgreSQL: Zope's objects and the 5 MiB blob are rows of db1.
    objects, blob_bytes = _superuser_sql("SELECT count(*) FROM object_state"), _superuser_sql(
        "SELECT coalesce(sum(length(lo_get(chunk))), 0) FROM blob_chunk")
    results.append(("the site's objects and its blob are rows of db1's database (object_state, blob_chunk)",
                    objects.isdigit() and int(objects) > 100 and blob_bytes.isdigit()
                    and int(blob_bytes) >= 5 * 1024 * 1024, f"{objects} objects, {blob_bytes} blob bytes"))
    # The right password from a host that is not a ZEO client is refused by address; the
    # same login from app1 works (so it is the address, not the password).
    login = [PSQL, "-X", "-At", "-c", "SELECT 1",
             f"host=10.231.0.6 port={PG_PORT} dbname=plone user=plone passfile={passfile} connect_timeout=10"]
    refused = subprocess.run(["ip", "netns", "exec", "pdmh-lb", *login], capture_output=True, text=True,
                             timeout=60, check=False)
    allowed = subprocess.run(["ip", "netns", "exec", "pdmh-app", *login], capture_output=True, text=True,
                             timeout=60, check=False)
    # lb1 is no ZEO client: db1's firewall refuses its connection before pg_hba.conf would
    # (no route to host: ICMP admin-prohibited); the same login from app1 works.
    results.append(("a login from lb1 (10.231.0.4, no ZEO client) is refused by db1's firewall; from app1 it works",
                    refused.returncode != 0 and "No route to host" in refused.stderr
                    and allowed.returncode == 0 and allowed.stdout.strip() == "1",
                    f"lb1: exit {refused.returncode} {refused.stderr.strip()[-200:]}; app1: exit {allowed.returncode}"))
    return results


def database_cron_jobs_run():
    """db1's pg_dump job and app1's zodbpack job, read from their /etc/cron.d files and run
    the way cron runs them (``/bin/sh -c``, cron's environment, in the host's namespace):
    three dumps with postgresql_backup_keep 2 leave the newest two, each mode 0600 and
    readable by pg_restore. Returns ``[(label, passed, detail)]``."""
    results = []
    jobs = {}
    for role in ("postgresql", "zeoclient"):
        with open(os.path.join("/etc/cron.d", CRON_FILES[role]), encoding="utf-8") as fp:
            for line in fp:
                if line.strip() and not line.startswith("#") and "=" not in line.split()[0]:
                    command = line.split(None, 6)[6].strip()
                    jobs[command.split()[0].rsplit("/", 1)[-1]] = command
    cron_env = {"SHELL": "/bin/sh", "PATH": "/usr/bin:/bin", "HOME": "/root", "LOGNAME": "root"}
    backups = f"{WORK}/db1/backups/postgresql"
    outputs = []
    for ns, job, times in (("pdmh-db", "pg-backup", 3), ("pdmh-app", "zodbpack", 1)):
        for _ in range(times):
            time.sleep(1.1)  # the dumps are named by the second
            started = time.monotonic()
            result = subprocess.run(["ip", "netns", "exec", ns, "env", "-i", *(f"{k}={v}" for k, v in cron_env.items()),
                                     "/bin/sh", "-c", jobs.get(job, "false")], cwd="/", capture_output=True,
                                    text=True, timeout=600, check=False)
            outputs.append((job, result.returncode, round(time.monotonic() - started, 1), result.stderr[-500:]))
    results.append(("the cron jobs pg-backup (3 times) and zodbpack run as cron runs them, exit 0",
                    sorted(jobs) == ["logrotate", "pg-backup", "zodbpack"] and all(o[1] == 0 for o in outputs),
                    [o[:3] if o[1] == 0 else o for o in outputs]))
    dumps = sorted(os.listdir(backups)) if os.path.isdir(backups) else []
    modes = {name: oct(os.stat(os.path.join(backups, name)).st_mode & 0o777) for name in dumps}
    listed = [subprocess.run(["/usr/lib/postgresql/15/bin/pg_restore", "--list", os.path.join(backups, name)],
                             capture_output=True, text=True, timeout=60, check=False) for name in dumps]
    results.append(("the dumps land in db1's backup directory, mode 0600, the newest 2 kept, pg_restore reads them",
                    len(dumps) == 2 and all(n.startswith("plone-") and n.endswith(".dump") for n in dumps)
                    and set(modes.values()) == {"0o600"}
                    and all(r.returncode == 0 and "TABLE DATA public object_state" in r.stdout for r in listed),
                    {name: (modes[name], os.path.getsize(os.path.join(backups, name))) for name in dumps}))
    return results


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
                    len(servers) == 3 and all(n > 0 and f == 0 for n, f in servers.values()), servers))
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave namespaces and processes running")
    parser.add_argument("--storage", choices=sorted(STORAGES), default="zeo",
                        help="zeo: ZEO server on zeo1 (inventories/multihost); relstorage: PostgreSQL on db1 "
                             "(inventories/multihost-relstorage)")
    args = parser.parse_args(argv)
    global STORAGE, HOSTS
    STORAGE = args.storage
    HOSTS = {name: ALL_HOSTS[name] for name in (STORAGES[STORAGE][0], "app1", "lb1", "lg1")}
    if os.geteuid() != 0:
        print("multihost: must run as root (ip netns, sshd)", file=sys.stderr)
        return 2
    teardown()  # leftovers of an interrupted run
    ok = False
    global RECEIVER
    try:
        inventory = setup()
        RECEIVER = WebhookReceiver(WEBHOOK)
        playbook(inventory, "site.yml over SSH, first run")
        ok = verify()
        second = playbook(inventory, "site.yml over SSH, second run")
        unchanged = all(int(c) == 0 for c in re.findall(r"changed=(\d+)", second[second.rfind("PLAY RECAP"):]))
        print(f"{'PASS' if unchanged else 'FAIL'} second run changed=0 on every host")
        ok = ok and unchanged
    finally:
        if RECEIVER is not None:
            RECEIVER.close()
        if not args.keep:
            teardown()
    print("multihost:", "all checks passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
