"""[stack] service-user: bin/stack started as root runs the ZEO server and the ZEO clients
as an unprivileged user, which owns what they write in var/ and cannot write the build
(docs/operations.md, "Users").

``make build`` as root builds with ``stack:service-user=plonedeploy`` (the Makefile's
SERVICE_USER), so the session's stack (conftest's ``stack`` fixture, started as root) is
the real thing: these tests look at it and start nothing of their own (a few seconds in
all). Without root, or with a build made without the option, they fail and say so rather
than pass on a stack that does not have what they check.
"""
import json
import os
import pwd
import stat
import subprocess

import psutil
import pytest

from conftest import ROOT, STACK_JSON

pytestmark = pytest.mark.integration


def _service(stack):
    """The stack.json's ``service`` of the session's stack; fails (not skips) without one."""
    with open(STACK_JSON, encoding="utf-8") as fp:
        service = json.load(fp).get("service")
    if os.geteuid() != 0:
        pytest.fail("runs as root only: supervisord drops privileges only when started as root")
    if not service:
        pytest.fail("the build has no [stack] service-user: make build as root sets it (SERVICE_USER)")
    return service


def _may_as(user, checks):
    """``[bool]``: for each ``(path, mode)`` of ``checks``, whether ``user`` (a pwd entry) may
    access ``path`` with ``mode`` (os.R_OK, os.W_OK ...), asked in a child running as that
    user (groups and ACLs count as for its programs)."""
    code = ("import os, sys, json; print(json.dumps([os.access(p, m) for p, m in json.loads(sys.argv[1])]))")
    result = subprocess.run(["/usr/bin/python3", "-c", code, json.dumps(checks)], user=user.pw_uid,
                            group=user.pw_gid, extra_groups=os.getgrouplist(user.pw_name, user.pw_gid),
                            capture_output=True, text=True, timeout=60, check=True, cwd="/")
    return json.loads(result.stdout)


def test_zeo_and_clients_run_as_the_service_user(stack):
    """Every process of the ZEO server and of each client (and their children) runs as the
    service user, real, effective and saved uid and gid; supervisord stays root (it switches
    users and owns the control socket)."""
    from urllib.parse import urlsplit

    from plonedeploy.recipe.stack import all_clients, running_pids

    service = _service(stack)
    user = pwd.getpwnam(service["user"])
    with open(STACK_JSON, encoding="utf-8") as fp:
        config = json.load(fp)
    pids = running_pids(config)
    assert set(service["processes"]) == {config["zeoserver"], *all_clients(config)}, service["processes"]
    seen = {}
    for name in service["processes"]:
        parent = psutil.Process(pids[name])
        for proc in [parent] + parent.children(recursive=True):
            seen[(name, proc.pid)] = (tuple(proc.uids()), tuple(proc.gids()))
    assert seen and all(uids == (user.pw_uid,) * 3 and gids == (user.pw_gid,) * 3
                        for uids, gids in seen.values()), seen
    supervisord = psutil.Process(pids[service["processes"][0]]).parent()
    assert supervisord.uids().effective == 0 and "supervisord" in " ".join(supervisord.cmdline())
    # Whatever listens on the ZEO and client ports is the service user's.
    ports = {proc["ready"]["tcp"][1] if "tcp" in proc["ready"] else urlsplit(proc["ready"]["http"]).port
             for proc in config["processes"] if proc["name"] in service["processes"]}
    listeners = {c.laddr.port: c.pid for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port in ports}
    assert set(listeners) == ports, listeners
    assert {psutil.Process(pid).uids().effective for pid in listeners.values()} == {user.pw_uid}


def test_service_user_owns_var_data_and_logs_but_not_the_build(stack):
    """var/'s data, blobs, client homes, caches and the service's logs are the user's; the
    log directory is root's and its group's, sticky; var/ itself, bin/, parts/, the eggs, the
    configs and root's own logs are root's and not writable by the user, who can read and
    run the build. Files the programs made are not readable by others (umask 027)."""
    service = _service(stack)
    user = pwd.getpwnam(service["user"])
    var = os.path.join(ROOT, "var")
    data = os.path.join(var, "filestorage", "Data.fs")
    for path in service["directories"] + [data, os.path.join(var, "log", "zeoserver.log"),
                                          os.path.join(var, "log", "instance.log")]:
        assert os.lstat(path).st_uid == user.pw_uid, path
    log_dir = os.lstat(os.path.join(var, "log"))
    assert (log_dir.st_uid, log_dir.st_gid) == (0, user.pw_gid)
    assert stat.S_IMODE(log_dir.st_mode) == 0o1770
    assert os.lstat(os.path.join(var, "log", "haproxy.stdout.log")).st_uid == 0
    assert stat.S_IMODE(os.stat(os.path.join(var, "log", "zeoserver.log")).st_mode) & 0o007 == 0
    build = [os.path.join(ROOT, name) for name in ("bin", "parts", "eggs", "develop-eggs", "buildout.cfg")] + [
        os.path.join(ROOT, "bin", "instance"), os.path.join(ROOT, "parts", "stack", "supervisord.conf"),
        os.path.join(ROOT, "parts", "instance", "etc", "wsgi.ini"), var, os.path.join(var, "run")]
    writable = [os.path.join(var, "filestorage"), os.path.join(var, "blobstorage"), os.path.join(var, "log"),
                data]
    answers = _may_as(user, [[p, os.W_OK] for p in build + writable] + [[p, os.R_OK] for p in build])
    assert answers == [False] * len(build) + [True] * len(writable) + [True] * len(build), \
        list(zip(build + writable + build, answers))


def test_root_without_service_user_is_warned(tmp_path):
    """bin/stack start as root on a build without service-user says so on stderr, naming
    the option (a stack of no processes: nothing is started)."""
    from plonedeploy.recipe import stack as stack_module

    if os.geteuid() != 0:
        pytest.fail("runs as root only (the warning is root's)")
    config = tmp_path / "stack.json"
    config.write_text(json.dumps({"part": "stack", "processes": [], "service": None}))
    result = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "python"), "-c",
         "import sys; from plonedeploy.recipe.stack import main; sys.exit(main(sys.argv[1], ['start', '--no-wait-up']))",
         str(config)], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "recipes", "plonedeploy.recipe", "src")))
    assert result.returncode == 0, result.stderr
    assert "[stack] service-user" in result.stderr and "run as root" in result.stderr, result.stderr
    assert stack_module.ROOT_WARNING.format(part="stack") in result.stderr
