"""Teardown of the multihost run (also of an interrupted one's leftovers): pebble, each
host's supervisord (which stops its programs) and sshd, whatever else runs in the
namespaces, the namespaces and the bridge, the cron files, /etc/netns/pdmh-acme and the
boot units the process_manager role wrote."""
import os
import shutil
import subprocess
import time

from .common import (ACME, ACME_HOSTS_DIR, ALL_HOSTS, BOOTED, BRIDGE, CRON_FILES, INTERNET, PEBBLE, WORK,
                     boot_unit, in_ns, sh, stop)


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
