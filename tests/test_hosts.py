"""The hosts' safety on the shared local converge (``deployed``, tests/ansible_deploy.py): no
service runs as root, the clients cannot change their build, umask 027, supervisord's boot
unit, the firewall's ruleset (written and checked with ``nft -c``, not loaded on this
machine); and the hardened systemd units of ``process_manager_kind: systemd`` with
``systemd-analyze verify`` and ``security --offline=true``.

The firewall for real (loaded in four network namespaces, probed from a fifth standing for
the internet) and the crash test are ``make multihost``'s (tests/multihost/exposure.py,
resilience.py).
"""
import os
import pwd
import re
import subprocess
import time

import psutil
import pytest

from ansible_deploy import render_units
from conftest import ROOT, run

pytestmark = pytest.mark.ansible

#: The user each program of the local converge runs as (every process of it).
PROGRAM_USERS = {
    "zeoserver": {"plone"}, "client1": {"plone"}, "client2": {"plone"}, "client3": {"plone"}, "uploads": {"plone"},
    "prometheus": {"prometheus"}, "node-exporter": {"prometheus"}, "varnish-exporter": {"varnishlog"},
    "alertmanager": {"prometheus"}, "blackbox-exporter": {"prometheus"},
    # varnishd's unix jail: the manager as varnish, the cache process as vcache
    "varnish": {"varnish", "vcache"},
    # the master (-W) keeps root to bind and reload; its workers are haproxy's
    "haproxy": {"root", "haproxy"},
}


def _supervisord(deployed):
    with open(os.path.join(deployed["prefix"], "var", "run", "supervisord.pid"), encoding="ascii") as fp:
        return psutil.Process(int(fp.read()))


def _program_pids(deployed):
    """{program: pid} once every program of PROGRAM_USERS is RUNNING (supervisord says
    STARTING for a program's first startsecs)."""
    for _ in range(30):
        status = run(deployed["supervisorctl"] + ["status"], timeout=60).stdout
        pids = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+RUNNING\s+pid (\d+)", status, re.MULTILINE)}
        if set(pids) >= set(PROGRAM_USERS):
            break
        time.sleep(1)
    return pids


def _users(process):
    """The effective users of a process and its descendants (those still there)."""
    users = set()
    for each in [process] + process.children(recursive=True):
        try:
            users.add(pwd.getpwuid(each.uids().effective).pw_name)
        except psutil.NoSuchProcess:  # a worker that finished meanwhile (HAProxy after a reload)
            pass
    return users


def test_no_service_runs_as_root(deployed):
    """Every process of every program runs as its user; of HAProxy only the master is root,
    and it has workers that are not."""
    programs = _program_pids(deployed)
    assert set(programs) == set(PROGRAM_USERS), programs
    # by effective uid: varnishd's manager keeps real uid 0 (its jail regains it to start the
    # child) and runs as varnish
    users = {name: _users(psutil.Process(pid)) for name, pid in programs.items()}
    assert users == PROGRAM_USERS, users
    haproxy = psutil.Process(programs["haproxy"])
    workers = haproxy.children()
    assert haproxy.uids().effective == 0 and workers and {w.uids().effective for w in workers} == {
        pwd.getpwnam("haproxy").pw_uid}
    # the workers are chrooted into Debian's empty /var/lib/haproxy
    assert {os.readlink(f"/proc/{w.pid}/root") for w in workers if w.is_running()} == {"/var/lib/haproxy"}


def test_clients_cannot_write_their_build(deployed):
    """The service user writes var/ and the data, not bin/, parts/, the eggs or the configs."""
    prefix = deployed["prefix"]
    writable = {}
    for path in ("zeoclient/current/bin", "zeoclient/current/parts", "zeoclient/current/parts/client1/etc/zope.conf",
                 "zeoclient/current/deploy.cfg", "zeoclient/releases", "zeoserver/current/bin",
                 "zeoserver/current/parts", "zeoclient/var", "zeoserver/var", "var/filestorage/Data.fs",
                 "var/blobstorage"):
        result = subprocess.run(["runuser", "-u", "plone", "--", "test", "-w", os.path.join(prefix, path)],
                                timeout=30, check=False)
        writable[path] = result.returncode == 0
    writable["eggs"] = subprocess.run(["runuser", "-u", "plone", "--", "test", "-w",
                                       deployed["extra"]["zeoclient_eggs_directory"]], timeout=30,
                                      check=False).returncode == 0
    assert {p for p, w in writable.items() if w} == {"zeoclient/var", "zeoserver/var", "var/filestorage/Data.fs",
                                                    "var/blobstorage"}, writable


def test_umask_keeps_files_from_other_users(deployed):
    """supervisord runs with umask 027: the logs it writes and the files ZEO and the clients
    create are not readable by other users of the host."""
    prefix = deployed["prefix"]
    supervisord = _supervisord(deployed)
    cmdline = supervisord.cmdline()
    assert "--umask" in cmdline and cmdline[cmdline.index("--umask") + 1] == "027"
    files = [os.path.join(prefix, "var", "log", name) for name in ("zeoserver.log", "client1.log", "haproxy.log")]
    files += [os.path.join(prefix, "var", "filestorage", "Data.fs"),
              os.path.join(prefix, "zeoserver", "var", "log", "zeoserver.log")]
    modes = {path: oct(os.stat(path).st_mode & 0o777) for path in files}
    assert all(int(mode, 8) & 0o007 == 0 for mode in modes.values()), modes
    assert oct(os.stat(os.path.join(prefix, "var", "blobstorage")).st_mode & 0o777) == "0o700"


def test_boot_unit_starts_this_supervisord(deployed):
    """The prefix's boot unit is enabled (its WantedBy link), passes systemd-analyze verify,
    and its ExecStart is the command line that runs this supervisord (plus --nodaemon)."""
    prefix = deployed["prefix"]
    units = os.path.join(prefix, "etc", "systemd", "system")
    (name,) = [n for n in os.listdir(units) if n.endswith(".service")]
    assert name.startswith("plonedeploy-supervisord-") and name.endswith(prefix.strip("/").split("/")[-1] + ".service")
    link = os.path.join(units, "multi-user.target.wants", name)
    assert os.path.realpath(link) == os.path.join(units, name)
    text = open(os.path.join(units, name), encoding="utf-8").read()
    exec_start = re.search(r"^ExecStart=(.*)$", text, re.MULTILINE).group(1).split()
    command = _supervisord(deployed).cmdline()
    if os.path.basename(command[0]).startswith("python"):  # the script's interpreter, not in ExecStart
        command = command[1:]
    assert exec_start == command + ["--nodaemon"], (exec_start, command)
    assert "UMask=027" in text and "WantedBy=multi-user.target" in text
    result = run(["systemd-analyze", "verify", os.path.join(units, name)], timeout=60, check=False)
    assert result.returncode == 0 and "ignoring" not in result.stderr, result.stdout + result.stderr


def test_firewall_rendered_and_checked_not_loaded(deployed):
    """inventories/local: the ruleset is written into the prefix, nft -c accepts it, and it
    is not loaded into this machine's network."""
    path = os.path.join(deployed["prefix"], "etc", "nftables.conf")
    text = open(path, encoding="utf-8").read()
    assert "policy drop;" in text and "reject with icmpx type admin-prohibited" in text
    assert "ip saddr { 127.0.0.1/32 } tcp dport { 22 } accept" in text
    assert "meta nfproto ipv4 tcp dport { 18080, 18443 } accept" in text  # the site, from anywhere
    run(["nft", "-c", "-f", path], timeout=60)
    assert run(["nft", "list", "table", "inet", "plonedeploy"], timeout=60, check=False).returncode != 0


#: The hardened units of process_manager_kind: systemd, rendered by the process_manager role's
#: template as the roles give it: name, command, user, writable paths, capabilities.
UNITS = [
    {"name": "zeoserver", "command": [os.path.join(ROOT, "bin", "zeoserver"), "fg"], "user": "plone",
     "write": ["/srv/plonedeploy/var/filestorage", "/srv/plonedeploy/zeoserver/var"]},
    {"name": "client1", "command": [os.path.join(ROOT, "bin", "instance"), "console"], "user": "plone",
     "write": ["/srv/plonedeploy/zeoclient/var", "/srv/plonedeploy/var/blobstorage"]},
    {"name": "haproxy", "command": ["/usr/sbin/haproxy", "-W", "-db", "-f", "/srv/plonedeploy/haproxy/haproxy.cfg"],
     "signal": "USR2", "user": "", "write": ["/srv/plonedeploy/var/run"],
     "caps": ["CAP_NET_BIND_SERVICE", "CAP_SETUID", "CAP_SETGID", "CAP_SYS_CHROOT"]},
    {"name": "varnish", "command": ["/usr/sbin/varnishd", "-F", "-j", "unix", "-n", "/srv/plonedeploy/varnish/work"],
     "user": "", "write": ["/srv/plonedeploy/varnish"],
     "caps": ["CAP_NET_BIND_SERVICE", "CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_FOWNER", "CAP_DAC_OVERRIDE",
              "CAP_KILL", "CAP_SYS_RESOURCE"]},
    {"name": "prometheus", "command": ["/usr/bin/prometheus"], "user": "prometheus", "signal": "HUP",
     "write": ["/srv/plonedeploy/var/prometheus"]},
    {"name": "node-exporter", "command": ["/usr/bin/prometheus-node-exporter"], "user": "prometheus"},
    {"name": "alertmanager", "command": ["/usr/bin/prometheus-alertmanager", "--cluster.listen-address="],
     "user": "prometheus", "signal": "HUP", "write": ["/srv/plonedeploy/var/alertmanager"]},
    {"name": "blackbox-exporter", "command": ["/usr/bin/prometheus-blackbox-exporter"], "user": "prometheus",
     "signal": "HUP"},
    {"name": "postgresql", "command": ["/usr/lib/postgresql/15/bin/postgres", "-D", "/srv/plonedeploy/postgresql/data"],
     "user": "postgres", "stop": "INT", "write": ["/srv/plonedeploy/postgresql/data"]},
    {"name": "locust-worker-1", "command": [os.path.join(ROOT, ".venv", "bin", "locust"), "--worker"],
     "user": "locust"},
]


def test_hardened_systemd_units(tmp_path):
    """process_manager_kind: systemd: each unit passes systemd-analyze verify, has the
    hardening of docs/how-to/ansible.md, and systemd-analyze security --offline=true rates it; the
    ratings are the table of docs/how-to/ansible.md."""
    paths = render_units(UNITS, tmp_path)
    for unit, path in zip(UNITS, paths):
        text = open(path, encoding="utf-8").read()
        for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "ProtectHome=yes",
                     "UMask=027", f"CapabilityBoundingSet={' '.join(unit.get('caps', []))}\n"):
            assert line in text, (unit["name"], line)
        assert [f"ReadWritePaths={p}" for p in unit.get("write", [])] == re.findall(r"^ReadWritePaths=.*$", text,
                                                                                   re.MULTILINE)
    verify = run(["systemd-analyze", "verify", *paths], timeout=120, check=False)
    assert verify.returncode == 0 and "ignoring" not in verify.stderr, verify.stdout + verify.stderr
    security = run(["systemd-analyze", "security", "--offline=true", *paths], timeout=120, check=False)
    exposure = {name: (float(value), rating) for name, value, rating in re.findall(
        r"Overall exposure level for plonedeploy-(\S+)\.service: ([0-9.]+) (\w+)", security.stdout)}
    print("\nsystemd-analyze security --offline=true:", exposure)
    # docs/how-to/ansible.md's table: the programs with a user of their own 1.7, the root masters
    # with their capabilities (HAProxy 2.4, varnish 2.9); systemd rates all "OK"
    assert set(exposure) == {unit["name"] for unit in UNITS}, security.stdout[-2000:]
    assert {rating for _value, rating in exposure.values()} == {"OK"}, exposure
    assert all(value <= 1.7 for name, (value, _r) in exposure.items() if name not in ("haproxy", "varnish")), exposure
    assert exposure["haproxy"][0] <= 2.4 and exposure["varnish"][0] <= 2.9, exposure
