"""The canary role's parts that run without a deployment: its filters (which client is the
canary, whom it is compared with; the canary's request count from HAProxy's stats) and the
judge's files it copies to the balancer, run from a copy of exactly those files.

The deploy itself, on the shared converge: tests/test_ansible.py
(``test_canary_withslower_pages_is_rolled_back_under_load``); its bad variables: that
module's REFUSALS."""
import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime

import pytest

from canary_logs import GAP_S, PHASE_S, RATES, T0, deploy_log, slower_pages
from conftest import ROOT

ANSIBLE = os.path.join(ROOT, "ansible")
#: The Ansible venv's Python: the filters import ansible.errors, and PyYAML is there (.venv has neither).
ANSIBLE_PYTHON = os.path.join(ANSIBLE, ".venv", "bin", "python")


def _in_ansible(code, *args):
    """Run ``code`` in the Ansible venv's Python with the canary filters as ``f`` (their
    dict) and ``args`` as ``sys.argv[1:]``; returns what it printed, parsed as JSON."""
    plugin = os.path.join(ANSIBLE, "filter_plugins", "plonedeploy_canary.py")
    prelude = ("import json, sys, importlib.util\n"
               f"spec = importlib.util.spec_from_file_location('c', {plugin!r})\n"
               "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
               "f = m.FilterModule().filters()\n")
    out = subprocess.run([ANSIBLE_PYTHON, "-c", prelude + code, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _role_vars():
    return _in_ansible("import yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
                       os.path.join(ANSIBLE, "roles", "canary", "vars", "main.yml"))


def _choose(pool, name):
    """``plonedeploy_canary_choice(pool, name, "pyruvate")``, or ``{"error": message}``."""
    return _in_ansible("from ansible.errors import AnsibleFilterError\n"
                       "try:\n"
                       "    print(json.dumps(f['plonedeploy_canary_choice'](json.loads(sys.argv[1]), sys.argv[2], "
                       "'pyruvate')))\n"
                       "except AnsibleFilterError as exc:\n"
                       "    print(json.dumps({'error': str(exc)}))\n", json.dumps(pool), name)


POOL = {
    "web1": [{"name": "client1", "port": 1, "wsgi_server": "pyruvate"},
             {"name": "client2", "port": 2, "wsgi_server": "waitress"},
             {"name": "uploads", "port": 3, "wsgi_server": "waitress", "lane": "uploads"}],
    # no wsgi_server: the zeoclient role's default
    "web2": [{"name": "client3", "port": 1}, {"name": "client4", "port": 2, "wsgi_server": "waitress"}],
}


def test_the_first_page_client_with_a_peer_of_its_server_is_the_canary():
    choice = _choose(POOL, "")
    assert choice["canary"] == {"host": "web1", "name": "client1", "server": "pyruvate"}
    assert choice["compare"] == [{"host": "web2", "name": "client3", "server": "pyruvate"}]
    # a named one: compared with every other page client of its server, never the upload lane
    choice = _choose(POOL, "client4")
    assert choice["canary"]["host"] == "web2"
    assert [c["name"] for c in choice["compare"]] == ["client2"]


@pytest.mark.parametrize("pool, name, message", [
    (POOL, "uploads", "canary_client = 'uploads' is not a page client (lane pages) of the pool; expected one of "
                      "['client1', 'client2', 'client3', 'client4']"),
    (POOL, "client9", "canary_client = 'client9' is not a page client"),
    ({"web1": POOL["web1"]}, "client2", "canary_client = 'client2' has another page client of its WSGI server"),
    ({"web1": POOL["web1"]}, "", "no page client has another page client of its WSGI server to be compared with"),
    ({"web1": POOL["web1"][:1], "web2": POOL["web1"][:1]}, "client1", "names a client on several hosts"),
    ({}, "", "no page client has"),
])
def test_a_canary_without_a_comparison_of_its_server_is_refused(pool, name, message):
    assert message in _choose(pool, name)["error"]


STATS = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin\n"
         "zeoclients,client1,0,0,0,2,2,4711,100\n"
         "zeoclients,client3,0,0,1,2,2,17,100\n"
         "uploads,client1,0,0,0,1,8,3,9\n"
         "zeoclients,BACKEND,0,0,1,4,20,4728,200\n")


def test_served_is_the_servers_stot_in_the_page_backend():
    got = _in_ansible("from ansible.errors import AnsibleFilterError\n"
                      "served = f['plonedeploy_canary_served']\n"
                      "out = [served(sys.argv[1], 'client1'), served(sys.argv[1], 'client3'),\n"
                      "       served(sys.argv[1], 'client1', 'uploads')]\n"
                      "try:\n"
                      "    served(sys.argv[1], 'client2')\n"
                      "except AnsibleFilterError as exc:\n"
                      "    out.append(str(exc))\n"
                      "print(json.dumps(out))\n", STATS)
    assert got == [4711, 17, 3, "HAProxy's stats have no server 'client2' in backend 'zeoclients'"]


def test_the_judge_runs_from_a_copy_of_its_listed_files(tmp_path):
    """The role copies canary_judge_files (plonedeploy.runtime's under plonedeploy/) to the
    balancer and runs ``python -m loadtests canary-judge`` there: from a copy of exactly those
    files, a log whose canary is 50 ms slower on pages is rolled back (exit 1), the report
    written, and every module of the kit it imported is the copy's."""
    role = _role_vars()
    copy = tmp_path / "judge"
    for name in role["canary_judge_files"]:
        target = copy / re.sub(role["canary_judge_source_root"], "", name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(ROOT, name), target)
    log = deploy_log(tmp_path / "haproxy.log", slower_pages, rates={"page": RATES["page"]})
    argv = ["canary-judge", "--log", str(log), "--canary", "instance", "--compare", "client2,client3",
            "--aa-from", str(T0), "--aa-until", datetime.fromtimestamp(T0 + PHASE_S).isoformat(),
            "--ab-from", str(T0 + PHASE_S + GAP_S), "--ab-until", str(T0 + 2 * PHASE_S + GAP_S),
            "--classes", "page,json,blob", "--out", str(tmp_path / "reports")]
    # The copy first on sys.path, as python -m loadtests in its directory; then the modules of
    # the kit the judge imported must all be the copy's (this venv has the kit installed too).
    script = ("import runpy, sys\n"
              f"sys.path.insert(0, {str(copy)!r})\n"
              f"sys.argv = ['loadtests'] + {argv!r}\n"
              "try:\n"
              "    runpy.run_module('loadtests', run_name='__main__', alter_sys=True)\n"
              "except SystemExit as exc:\n"
              "    code = exc.code\n"
              "kit = [m.__file__ for n, m in list(sys.modules.items())\n"
              "       if n.split('.')[0] in ('loadtests', 'plonedeploy') and getattr(m, '__file__', None)]\n"
              "print('outside the copy:', [f for f in kit if not f.startswith(sys.path[0])])\n"
              "sys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path), capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, MPLBACKEND="Agg"))
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "- page Tr p50 of the canary is " in result.stdout
    assert result.stdout.rstrip().endswith("outside the copy: []"), result.stdout[-1000:]
    (folder,) = (tmp_path / "reports").iterdir()
    assert {p.name for p in folder.iterdir()} == {"report.md", "report.json", "canary.png"}


def test_judge_packages_are_pinned_by_the_constraints():
    """The venv on the balancer installs the judge's packages with the project's
    constraints.txt: each of them must be pinned there, or pip would pick any version."""
    with open(os.path.join(ROOT, "constraints.txt"), encoding="utf-8") as fp:
        pinned = {line.split("==")[0].strip().lower() for line in fp if "==" in line}
    assert set(_role_vars()["canary_judge_packages"]) <= pinned
