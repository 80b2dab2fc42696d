"""Multi-host deployment for real: four network namespaces, sshd in each, site.yml over SSH.

The main sequence (the package's docstring has the whole story): teardown of an
interrupted run's leftovers, setup, the webhook receiver, site.yml, the checks, site.yml
again (changed=0), the canary deploy of a like release and its second run (changed=0),
teardown; and playbook(), which runs site.yml and prints its recap."""
import argparse
import json
import os
import re
import subprocess
import sys
import time

from . import common, resilience
from .canary import canary_test
from .common import ALL_HOSTS, ANSIBLE, HOSTS, STORAGES, WEBHOOK, WORK
from .resilience import WebhookReceiver
from .setup_hosts import setup
from .teardown_hosts import teardown
from .verify import verify


def playbook(inventory, title, extra=None, check=True):
    """site.yml over SSH with the storage's inventory and ``inventory`` (setup()'s), and
    ``extra`` (a dict) as extra variables; prints its recap and wall time, keeps its output
    in WORK/<title>.log. Returns its stdout; when it fails, raises SystemExit, or with
    ``check=False`` returns its stdout and stderr."""
    started = time.monotonic()
    result = subprocess.run(
        [os.path.join(ANSIBLE, ".venv", "bin", "ansible-playbook"),
         "-i", STORAGES[common.STORAGE][1], "-i", inventory, "site.yml"]
        + (["-e", json.dumps(extra)] if extra else []),
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
    if result.returncode != 0 and check:
        raise SystemExit(f"{title} failed: see {log}")
    return out if check else out + result.stderr


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m multihost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave namespaces and processes running")
    parser.add_argument("--storage", choices=sorted(STORAGES), default="zeo",
                        help="zeo: ZEO server on zeo1 (inventories/multihost); relstorage: PostgreSQL on db1 "
                             "(inventories/multihost-relstorage)")
    args = parser.parse_args(argv)
    common.STORAGE = args.storage
    HOSTS.clear()  # in place: every module imported it
    HOSTS.update({name: ALL_HOSTS[name] for name in (STORAGES[common.STORAGE][0], "app1", "lb1", "lg1")})
    if os.geteuid() != 0:
        print("multihost: must run as root (ip netns, sshd)", file=sys.stderr)
        return 2
    teardown()  # leftovers of an interrupted run
    ok = False
    try:
        inventory = setup()
        resilience.RECEIVER = WebhookReceiver(WEBHOOK)
        playbook(inventory, "site.yml over SSH, first run")
        ok = verify()
        second = playbook(inventory, "site.yml over SSH, second run")
        unchanged = all(int(c) == 0 for c in re.findall(r"changed=(\d+)", second[second.rfind("PLAY RECAP"):]))
        print(f"{'PASS' if unchanged else 'FAIL'} second run changed=0 on every host")
        ok = ok and unchanged
        for label, passed, detail in canary_test(playbook, inventory):
            print(f"{'PASS' if passed else 'FAIL'} {label} {detail}")
            ok = ok and bool(passed)
    finally:
        if resilience.RECEIVER is not None:
            resilience.RECEIVER.close()
        if not args.keep:
            teardown()
    print("multihost:", "all checks passed" if ok else "FAILED")
    return 0 if ok else 1
