"""The Ansible deployment the tests share: ``ansible-playbook`` in ansible/, its PLAY RECAP,
and ``deployed``, one converge of site.yml with ansible/inventories/local per pytest session
(with the ids of the releases it built, ``first_releases``: ``{"zeoserver": id, "zeoclient": id}``).

The converge goes into an isolated prefix under pytest's temporary directory (ports 18xxx,
varnish on 16081), with this checkout's eggs as the eggs cache (so bin/buildout downloads
nothing). Varnish's directory is a separate temporary directory that its jail's users can
reach (pytest's is 0700). At the end supervisord is shut down, which stops every deployed
process. The PLAY RECAPs are printed (``pytest -s``) and appended to var/ansible/recaps.txt
with their wall times. conftest.py makes ``deployed`` a fixture of every test module: tests
of any module that read the deployment (tests/test_ansible.py, and those of later roles)
share the one converge (408 s in the CI run of 28 Nov 2026, beside the stack tests on 2 cores).
"""
import json
import os
import re
import shutil
import socket
import tempfile
import time

import psutil
import pytest

from conftest import ROOT, run, setup_budget
from plonedeploy.runtime import access

ANSIBLE = os.path.join(ROOT, "ansible")
BIN = os.path.join(ANSIBLE, ".venv", "bin")
PORTS = (18079, 18080, 18081, 18082, 18083, 18100, 18404, 18443,
         18091, 18092, 18093, 18094, 18190, 18191,  # clients' metrics, Prometheus, node-exporter
         18192, 18193,  # Alertmanager, the blackbox exporter
         16081, 16088)  # varnish, HAProxy's cache_fill listener
PROMETHEUS = "http://127.0.0.1:18190"
FRONTEND = "http://127.0.0.1:18080"
TLS_FRONTEND = "https://127.0.0.1:18443"
VARNISH = "http://127.0.0.1:16081"
BLOB_SIZE = 5 * 1024 * 1024
#: Prometheus' targets in the converge, ``(job, instance)``: tests/test_ansible.py requires
#: them all up; docs/how-to/ansible.md names them and their number (tests/test_doc_figures.py
#: checks it).
PROMETHEUS_TARGETS = frozenset({
    ("prometheus", "127.0.0.1:18190"), ("haproxy", "127.0.0.1:18404"), ("varnish", "127.0.0.1:19131"),
    ("zeoclients", "127.0.0.1:18091"), ("zeoclients", "127.0.0.1:18092"), ("zeoclients", "127.0.0.1:18093"),
    ("zeoclients", "127.0.0.1:18094"),
    ("node", "127.0.0.1:18191"), ("alertmanager", "127.0.0.1:18192"),
    # the blackbox exporter's probe of the public HTTPS URL (on 18193), by the URL
    ("blackbox", "https://127.0.0.1:18443/Plone/@@ok")})


#: The converge's ZEO clients: inventories/local's (the A/B pair, the upload lane) and client3,
#: a second pyruvate page client: a canary deploy compares its canary with page clients of
#: its own WSGI server (the canary role; tests/test_ansible.py's canary test), and local's
#: pair has none. After client2: the write lane's client stays client1.
CLIENTS = [
    {"name": "client1", "port": 18081, "metrics_port": 18091, "wsgi_server": "pyruvate", "threads": 2},
    {"name": "client2", "port": 18082, "metrics_port": 18092, "wsgi_server": "waitress", "threads": 2},
    {"name": "client3", "port": 18083, "metrics_port": 18094, "wsgi_server": "pyruvate", "threads": 2},
    {"name": "uploads", "port": 18079, "metrics_port": 18093, "wsgi_server": "waitress", "threads": 1,
     "lane": "uploads"},
]


def playbook(*args, extra, timeout=900, check=True):
    """Run ansible-playbook in ansible/ with extra vars (a dict, passed as JSON)."""
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    return run([os.path.join(BIN, "ansible-playbook"), *args, "-e", json.dumps(extra)],
               timeout=timeout, check=check, cwd_override=ANSIBLE, env=env)


def render_units(programs, directory, timeout=120):
    """Render the process_manager role's systemd unit (``templates/program.service.j2``) for
    each of ``programs`` with Ansible's template module, with the variables the roles give
    it, into ``directory`` (a path).

    ``programs``: dicts with ``name`` and ``command`` (an argv list), optionally
    ``directory`` (the program's working directory; default ``directory``), ``signal`` (the
    reload signal; default none), ``user`` (default none: root), ``stop`` (default TERM),
    ``write`` (ReadWritePaths), ``caps`` (capabilities) and ``env`` (its environment, a dict;
    what the role takes from ``process_manager_environments``). Returns the units' paths,
    ``<directory>/plonedeploy-<name>.service``, in the order of ``programs``; fails the test
    with the playbook's output (conftest.run) when the playbook fails.
    """
    book = os.path.join(str(directory), "units.yml")
    with open(book, "w", encoding="utf-8") as fp:
        json.dump([{
            "name": "Render the process_manager role's systemd units", "hosts": "localhost", "gather_facts": False,
            "tasks": [{
                "name": "Write a unit",
                "ansible.builtin.template": {
                    "src": os.path.join(ANSIBLE, "roles", "process_manager", "templates", "program.service.j2"),
                    "dest": str(directory) + "/plonedeploy-{{ item.name }}.service", "mode": "0644"},
                "vars": {"process_manager_program_name": "{{ item.name }}",
                         "process_manager_program_command": "{{ item.command }}",
                         "process_manager_program_directory": "{{ item.directory | default('%s') }}" % directory,
                         "process_manager_program_reload_signal": "{{ item.signal | default('') }}",
                         "process_manager_program_user": "{{ item.user | default('') }}",
                         "process_manager_program_stop_signal": "{{ item.stop | default('TERM') }}",
                         "process_manager_program_write_paths": "{{ item.write | default([]) }}",
                         "process_manager_program_capabilities": "{{ item.caps | default([]) }}",
                         "process_manager_program_environment": "{{ item.env | default({}) }}",
                         "process_manager_umask": "027", "process_manager_stop_timeout": 30},
                "loop": programs}]}], fp)
    playbook(book, extra={}, timeout=timeout)
    return [os.path.join(str(directory), f"plonedeploy-{program['name']}.service") for program in programs]


def recap(output):
    """Return the PLAY RECAP counters of localhost, e.g. {'ok': 68, 'changed': 0, ...}."""
    line = re.findall(r"^localhost\s+:\s+(.*)$", output, re.MULTILINE)[-1]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def record(title, result, seconds):
    block = result.stdout[result.stdout.rindex("PLAY RECAP"):].strip()
    text = f"## {title}: {seconds:.0f} s\n{block}\n"
    print("\n" + text)
    os.makedirs(os.path.join(ROOT, "var", "ansible"), exist_ok=True)
    with open(os.path.join(ROOT, "var", "ansible", "recaps.txt"), "a", encoding="utf-8") as fp:
        fp.write(text)


def current_release(prefix, build="zeoclient"):
    """The id of the release ``<prefix>/<build>/current`` links to (the buildout role's
    releases side by side): the name of its directory in ``releases/``."""
    return os.path.basename(os.path.realpath(os.path.join(prefix, build, "current")))


def port_taken(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


#: /etc/cron.d files of the test deployment (names: letters, digits, - and _ only, or cron
#: ignores them); one pair per test process.
CRON_FILES = {"zeoserver": f"plonedeploy-test-{os.getpid()}-zeoserver",
              "zeoclient": f"plonedeploy-test-{os.getpid()}-zeoclient"}


@pytest.fixture(scope="session")
@setup_budget(900)  # site.yml's first converge: ~400 s in CI beside the stack tests; the playbook allows 1,500 s
def deployed():
    taken = [p for p in PORTS if port_taken(p)]
    if taken:
        pytest.fail(f"ports {taken} in use: another Ansible test deployment is running")
    # Not under pytest's base directory: every pytest session (the nested ones of the suite
    # too) chmods /tmp/pytest-of-<user> to 0700, which empties the ACL mask that lets the
    # services' own users (plone, prometheus, ...) reach their prefix.
    base = tempfile.mkdtemp(prefix="plonedeploy-ansible-")
    os.chmod(base, 0o755)
    prefix = os.path.join(base, "srv")
    # varnishd's unix jail (users varnish and vcache) must reach its VCL and working directory.
    varnish_directory = tempfile.mkdtemp(prefix="plonedeploy-varnish-")
    os.chmod(varnish_directory, 0o755)
    # ZEO and the clients run as plone from this checkout's eggs (the two eggs_directory
    # variables below): a checkout under a mode-0700 directory (a mktemp -d clone, root's
    # home) needs plone's search permission on the way, as bin/stack gives its service user.
    # The user is made first by the Makefile's service-user target, as the roles make it
    # (they keep an existing one).
    run(["make", "--no-print-directory", "service-user", "SERVICE_USER=plone"], timeout=60)
    access.grant_search("plone", [os.path.join(ROOT, "eggs")], "the test converge's ZEO and clients run from "
                        "this checkout's eggs")
    extra = {
        "plonedeploy_prefix": prefix,
        "varnish_directory": varnish_directory,
        "zeoserver_eggs_directory": os.path.join(ROOT, "eggs"),
        "zeoclient_eggs_directory": os.path.join(ROOT, "eggs"),
        # The cron jobs of a temporary prefix go into /etc/cron.d files of their own (removed
        # at the end), where test_cron_jobs_run_as_cron_runs_them finds and runs them.
        "zeoserver_cron_file": CRON_FILES["zeoserver"],
        "zeoclient_cron_file": CRON_FILES["zeoclient"],
        "zeoclient_clients": CLIENTS,
    }
    supervisorctl = ["supervisorctl", "-c", os.path.join(prefix, "etc", "supervisord.conf")]
    try:
        started = time.monotonic()
        first = playbook("site.yml", extra=extra, timeout=1500)
        record("site.yml, first run", first, time.monotonic() - started)
        yield {"prefix": prefix, "extra": extra, "first": first, "supervisorctl": supervisorctl,
               "first_releases": {build: current_release(prefix, build) for build in ("zeoserver", "zeoclient")}}
    finally:
        pidfile = os.path.join(prefix, "var", "run", "supervisord.pid")
        if os.path.exists(pidfile):
            pid = int(open(pidfile).read().strip())
            run(supervisorctl + ["shutdown"], timeout=120, check=False)
            try:
                psutil.Process(pid).wait(60)
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(varnish_directory, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
        for name in CRON_FILES.values():
            if os.path.exists(os.path.join("/etc/cron.d", name)):
                os.remove(os.path.join("/etc/cron.d", name))


