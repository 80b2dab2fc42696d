"""Who runs what on the buildout path (docs/how-to/operate.md, "Users"): bin/stack started as root
with ``[service] user`` (make build sets plonedeploy as root) runs the ZEO server and the
ZEO clients as that unprivileged user, HAProxy as ``[service] balancer-user`` (Debian's
haproxy) once it has bound its ports, and varnishd's cache process as Debian's vcache
(``[service] varnish-jail = unix``); a ZEO client's own script (``bin/<client>``, every
command) run by root drops to the service user first, so the blobs it writes are the ZEO
server's user's; without a service user, root is warned.

On the session's stack (fixture ``stack``, tests/conftest.py), with psutil: no process of
ZEO, the Zope clients, HAProxy or varnish's cache process has uid 0 (real, effective or
saved); the service user cannot write the build (``bin/``, ``parts/``, the eggs, the
configs) but can write its data; ``bin/instance run`` started by root runs as the service
user and a blob it commits is that user's. The user checks run as root only (they fail
otherwise: a non-root run has nobody to drop to). The ACL grant and ``become`` are unit
tests in tests/test_options.py and tests/test_runners.py, the refused values in
tests/test_recipe_buildout.py (BAD).
"""
import json
import os
import pwd
import shutil
import subprocess
import tempfile

import psutil
import pytest

from conftest import ROOT, run

#: Run by ``bin/instance run`` as root (the Zope root bound to ``app``): report who the
#: process is, commit a small blob, report its file's owner, remove it again.
BLOB_SCRIPT = """\
import json, os, sys
import transaction
from ZODB.blob import Blob
blob = Blob()
with blob.open("w") as fp:
    fp.write(b"plonedeploy service-user test " * 100)
root = app._p_jar.root()
root["plonedeploy-service-user-test"] = blob
transaction.commit()
path = blob.committed()
facts = {"uids": list(os.getresuid()), "gids": list(os.getresgid()), "blob_owner": os.stat(path).st_uid,
         "blob": path}
del root["plonedeploy-service-user-test"]
transaction.commit()
print("FACTS " + json.dumps(facts))
"""


def _as_root():
    if os.geteuid() != 0:
        pytest.fail("runs as root only: bin/stack drops to the service user only when root starts it")


def _service(stack):
    """The service user's ``pwd`` entry; fails when the build has none (make build as root sets one)."""
    service = stack.config.get("service")
    assert service and service.get("user"), (
        "the session's stack has no service user: make build as root sets [service] user = plonedeploy")
    return pwd.getpwnam(service["user"])


def _tree(pid):
    process = psutil.Process(pid)
    return [process] + process.children(recursive=True)


def _uids(process):
    uids = process.uids()
    return [uids.real, uids.effective, uids.saved]


def test_root_without_service_user_is_warned(tmp_path):
    """bin/stack start as root on a build without service-user says so on stderr, naming
    the option (a stack of no processes: nothing is started)."""
    from plonedeploy.stack import service as stack_module

    _as_root()
    config = tmp_path / "stack.json"
    config.write_text(json.dumps({"part": "stack", "processes": [], "service": None}))
    result = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "python"), "-c",
         "import sys; from plonedeploy.stack.cli import main; sys.exit(main(sys.argv[1], ['start', '--no-wait-up']))",
         str(config)], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(
            os.path.join(ROOT, "recipes", name, "src") for name in ("plonedeploy.recipe", "plonedeploy.runtime"))))
    assert result.returncode == 0, result.stderr
    assert "[stack] service-user" in result.stderr and "run as root" in result.stderr, result.stderr
    assert stack_module.ROOT_WARNING.format(part="stack") in result.stderr


@pytest.mark.integration
def test_no_service_runs_as_root(stack):
    """ZEO, every Zope client (each process of its tree), HAProxy (bin/stack runs it with
    -db: one process, no master, so all of it) and varnishd's cache process run with no
    uid 0 of real, effective and saved: ZEO and the clients as the service user, HAProxy
    as its balancer user in its empty chroot, the cache process as vcache, varnish's exporter
    as varnishlog."""
    _as_root()
    user = _service(stack)
    pids = stack.pids()
    service = stack.config["service"]["processes"]
    assert set(service) >= {stack.config["zeoserver"], *stack.config["servers"],
                            *stack.config.get("upload_servers", [])}
    seen = {}
    for name in service:
        assert name in pids, f"{name} is not running: {pids}"
        for process in _tree(pids[name]):
            seen[f"{name} pid {process.pid}"] = _uids(process)
    for label, uids in seen.items():
        assert uids == [user.pw_uid] * 3, (label, uids, user.pw_name)
    balancer = stack.config["haproxy_context"].get("user")
    assert balancer, "the stack's HAProxy has no user: make build as root sets [service] balancer-user = haproxy"
    haproxy = _tree(pids["haproxy"])
    chroot = stack.config["haproxy_context"].get("chroot")
    assert chroot, "the stack's HAProxy has no chroot: [haproxy] chroot = auto confines it with a user"
    for process in haproxy:
        assert _uids(process) == [pwd.getpwnam(balancer).pw_uid] * 3, (process.pid, process.cmdline())
        assert os.readlink(f"/proc/{process.pid}/root") == chroot, process.pid  # confined, not /
    assert os.listdir(chroot) == []
    cache = stack.config.get("cache")
    if cache:
        assert cache["jail_users"] == ["varnish", "vcache"], cache
        children = psutil.Process(pids[cache["name"]]).children(recursive=True)
        assert children, "varnishd has no cache process"
        for process in children:
            uids = _uids(process)
            assert 0 not in uids and uids[1] == pwd.getpwnam("vcache").pw_uid, (process.pid, process.name(), uids)
        exporter = f"{cache['name']}-exporter"
        if cache.get("metrics_url"):  # reads the jail's shared memory as Debian's varnishlog
            assert cache["exporter_user"] == "varnishlog", cache
            for process in _tree(pids[exporter]):
                assert _uids(process) == [pwd.getpwnam("varnishlog").pw_uid] * 3, (process.pid, process.cmdline())


@pytest.mark.integration
@pytest.mark.parametrize("path", ["bin", "bin/instance", "parts", "parts/instance/etc/zope.conf",
                                  "parts/stack/stack.json", "eggs", "buildout.cfg", "var"])
def test_service_user_cannot_write_the_build(stack, path):
    """The service user may not change what it runs: ``runuser -u <user> -- test -w <path>``
    fails for the build and root's directories (the same test of its data succeeds:
    test_service_user_writes_its_data)."""
    _as_root()
    user = _service(stack)
    target = os.path.join(ROOT, path)
    assert os.path.exists(target), target
    result = subprocess.run(["runuser", "-u", user.pw_name, "--", "test", "-w", target], timeout=30, check=False)
    assert result.returncode == 1, f"{user.pw_name} can write {target}"
    readable = subprocess.run(["runuser", "-u", user.pw_name, "--", "test", "-r", target], timeout=30, check=False)
    assert readable.returncode == 0, f"{user.pw_name} cannot even read {target}"  # runuser itself works


@pytest.mark.integration
def test_service_user_writes_its_data(stack):
    """The other side of test_service_user_cannot_write_the_build: the same check passes
    for what the service user owns (Data.fs, the blob directory, a client's log)."""
    _as_root()
    user = _service(stack)
    service = stack.config["service"]
    for target in [service["file_storage"], service["blob_storage"], os.path.join(ROOT, "var", "log", "instance.log")]:
        result = subprocess.run(["runuser", "-u", user.pw_name, "--", "test", "-w", target], timeout=30, check=False)
        assert result.returncode == 0, f"{user.pw_name} cannot write {target}"
        assert os.stat(target).st_uid == user.pw_uid, target


@pytest.mark.integration
def test_client_script_run_by_root_drops_and_writes_blobs_as_the_service_user(stack):
    """``bin/instance run`` started by root (as make site is) runs Zope as the service
    user, and a blob it commits into the shared blob directory is that user's: the ZEO
    server, run as the same user, could chmod it (a root client's blob it could not: EPERM)."""
    _as_root()
    user = _service(stack)
    # Where the dropped process can read it: the checkout, which bin/stack opened to the
    # user (pytest's tmp_path lies under root's 0700 /tmp/pytest-of-root).
    folder = tempfile.mkdtemp(prefix="service-user-test-", dir=os.path.join(ROOT, "var"))
    os.chmod(folder, 0o755)
    script = os.path.join(folder, "blob.py")
    with open(script, "w", encoding="utf-8") as fp:
        fp.write(BLOB_SCRIPT)
    os.chmod(script, 0o644)
    try:
        result = run([os.path.join(ROOT, "bin", "instance"), "run", script], timeout=300)
    finally:
        shutil.rmtree(folder)
    line = next((text for text in result.stdout.splitlines() if text.startswith("FACTS ")), None)
    assert line, result.stdout[-2000:] + result.stderr[-2000:]
    facts = json.loads(line[len("FACTS "):])
    assert facts["uids"] == [user.pw_uid] * 3 and facts["gids"] == [user.pw_gid] * 3, facts
    assert facts["blob_owner"] == user.pw_uid, facts
    assert facts["blob"].startswith(stack.config["blob_storage"]), facts


def test_make_missing_leaves_a_file_made_meanwhile_but_not_a_link(tmp_path, monkeypatch):
    """access.make_missing: a regular file another process of the part made between the look
    and the create is left alone (the matrix's two processes of one part started at once); a
    link made there is refused (FileExistsError), never followed."""
    from plonedeploy.runtime import access

    made, link = tmp_path / "made.log", tmp_path / "link.log"
    made.write_text("kept")
    link.symlink_to(tmp_path / "elsewhere")
    monkeypatch.setattr(access.os.path, "lexists", lambda path: False)  # the look came before them
    access.make_missing([str(made)], 0o640)
    assert made.read_text() == "kept"
    with pytest.raises(FileExistsError):
        access.make_missing([str(link)], 0o640)
    assert not (tmp_path / "elsewhere").exists()
