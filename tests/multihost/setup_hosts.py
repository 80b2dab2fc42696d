"""Setup of the multihost run: the Debian packages the roles install (present before the
run: the namespaces have no route to the mirrors), the pip wheels, the bridge and the
namespaces with their veth pairs and sshd (one host key, known_hosts), the inventory of
this run's addresses and prefixes, and pebble (the ACME CA) in its own namespace."""
import importlib.metadata
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request

from .common import (ACME, ACME_DIRECTORY, ACME_HOSTS_DIR, ACME_NAME, ACME_WORK, ANSIBLE, BRIDGE, CRON_FILES,
                     HOSTS, INTERNET, KNOWN_HOSTS, MASTER_PORT, PEBBLE, ROOT, SSH_OPTIONS, WEBHOOK, WORK, in_ns, sh)


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


def judge_packages():
    """The canary judge's pip packages (the canary role's ``canary_judge_packages``, one line
    of its vars/main.yml). Raises RuntimeError when that line is gone."""
    text = open(os.path.join(ANSIBLE, "roles", "canary", "vars", "main.yml"), encoding="utf-8").read()
    found = re.search(r"^canary_judge_packages: (.+)$", text, re.MULTILINE)
    if not found:
        raise RuntimeError("judge_packages: no canary_judge_packages line in the canary role's vars/main.yml")
    return _yaml_names(found.group(1))


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
    # The canary judge's venv on lb1 (canary.canary_test), at the project's constraints: a
    # folder of its own, so that Locust's unpinned dependencies resolve as before.
    sh(sys.executable, "-m", "pip", "download", "--quiet", "-d", f"{WORK}/judge-wheels",
       "-c", os.path.join(ROOT, "constraints.txt"), *judge_packages())
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
            "canary_pip_environment": {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": f"{WORK}/judge-wheels"},
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
            "-keyout", f"{ACME_WORK}/ca.key", "-out", f"{ACME_WORK}/ca.pem",
            "-subj", "/CN=plonedeploy multihost test CA")
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
        PEBBLE.append(subprocess.Popen(
            ["ip", "netns", "exec", ACME[1], "pebble", "-config", f"{ACME_WORK}/pebble.json"],
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
