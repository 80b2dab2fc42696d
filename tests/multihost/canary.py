"""The canary deploy across hosts, its promote path (issue 29): ``site.yml -e
plonedeploy_canary=true`` with a release that behaves like the running one, under GET loops
from lg1 through lb1; then the same run again, which must change nothing."""
import json
import os
import re
import subprocess
import sys
import time

from .common import ROOT, WORK, in_ns
from .resilience import METRICS_PORTS, _from_lb1

#: The canary's phases kept short, as make test's canary test keeps them
#: (tests/test_ansible.py CANARY_TEST): 30 s phases of 2 s windows, 50 requests per class,
#: side and phase; 10 s of settling after the canary's restart (make test's 5 s doubled: the
#: verdict must be promote, and a canary judged cold can look slower than its comparison).
CANARY_RUN = {"plonedeploy_canary": True, "canary_duration": 30, "canary_window": 2, "canary_min_requests": 50,
              "canary_settle": 10,
              # A new release id (the buildout role hashes deploy.cfg, overrides included) from
              # a buildout comment: the same programs and settings as the running release.
              "zeoclient_buildout_overrides": "# make multihost's canary step: a new release id, nothing else\n"}

#: Run in lg1's namespace: conftest.while_loaded's paced GET loops (2 loops of
#: RESTART_LOAD_RATE requests per second) of argv[2] until stdin closes, then one line of
#: JSON: requests, failures, seconds and whether they went on throughout
#: (conftest.assert_loaded_throughout).
_LOOP = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from conftest import RESTART_LOAD_RATE, assert_loaded_throughout, longest_gap, while_loaded
log = []
_, seconds, done, failures = while_loaded(sys.argv[2], sys.stdin.read, threads=2, log=log, rate=RESTART_LOAD_RATE)
try:
    assert_loaded_throughout(log, seconds)
    throughout = True
except AssertionError:
    throughout = False
print(json.dumps({"seconds": seconds, "requests": done, "failed": len(failures), "failures": failures[:10],
                  "longest_gap": longest_gap(log), "throughout": throughout}))
"""


def served_releases():
    """``{client: release id}``: the ``release`` label of each app1 client's
    ``plonedeploy_release_info`` (read from lb1, which app1's firewall lets scrape); None for
    a client without exactly one such series."""
    served = {}
    for name, port in METRICS_PORTS.items():
        _status, text = _from_lb1(f"http://10.231.0.3:{port}/metrics")
        found = re.findall(r'^plonedeploy_release_info\{release="([^"]*)"\} 1\.0$', text or "", re.MULTILINE)
        served[name] = found[0] if len(found) == 1 else None
    return served


def current_release():
    """The release app1's ``current`` link names (the buildout role's releases/<id>)."""
    return os.path.basename(os.path.realpath(f"{WORK}/app1/zeoclient/current"))


def canary_test(playbook, inventory):
    """The promote path, then the same run again. ``playbook(inventory, title, extra,
    check)`` runs site.yml and returns its output (main.playbook; with ``check=False`` also
    when the play fails: a verdict other than promote fails it). Returns ``[(label, passed,
    detail)]``."""
    out = []
    running = current_release()
    loop = subprocess.Popen(
        ["ip", "netns", "exec", "pdmh-lg", sys.executable, "-c", _LOOP, ROOT, "http://10.231.0.4:8080/Plone/@@ok"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    try:
        output = playbook(inventory, "site.yml over SSH, canary deploy of a like release", CANARY_RUN, check=False)
    finally:
        stdout, stderr = loop.communicate(timeout=120)  # closing stdin ends the loops
    seconds = time.monotonic() - started
    load = json.loads(stdout.strip().splitlines()[-1]) if loop.returncode == 0 and stdout.strip() else {}
    flat = re.sub(r"\s+", " ", output)
    verdict = re.search(r"Canary (\w+) on release (\w+): (promote|rollback|not enough data)", flat)
    new = verdict.group(2) if verdict else None
    out.append((f"canary deploy of a like release under lg1's GET loops: {seconds:.0f} s, verdict promote",
                verdict is not None and verdict.group(3) == "promote" and new != running,
                verdict.group(0) if verdict else flat[-1500:]))
    out.append(("after the promote: app1's current names the new release, every client serves it "
                "(plonedeploy_release_info)",
                new is not None and current_release() == new and set(served_releases().values()) == {new},
                {"running before": running, "new": new, "current": current_release(), "served": served_releases()}))
    out.append((f"lg1's GET loops through lb1 during the canary deploy: {load.get('requests')} requests, "
                f"{load.get('failed')} failed, longest gap {load.get('longest_gap', 0):.1f} s",
                load.get("requests", 0) > 0 and load.get("failed") == 0 and load.get("throughout") is True,
                load or (stderr or "")[-1500:]))
    started = time.monotonic()
    again = playbook(inventory, "site.yml over SSH, the same canary deploy again", CANARY_RUN, check=False)
    recap = again[again.rfind("PLAY RECAP"):]
    changed = re.findall(r"changed=(\d+)", recap) + re.findall(r"failed=([1-9]\d*)", recap)
    out.append((f"the same canary deploy again: {time.monotonic() - started:.0f} s, changed=0 on every host, "
                "nothing judged", changed and all(int(c) == 0 for c in changed)
                and f"The clients run release {new} already" in re.sub(r"\s+", " ", again), changed))
    return out
