"""bin/upgrade-site (plonedeploy.runtime.upgrade): the site's pending upgrade steps, run once.

Unit tests of its command line and of the lock's rules, and one test on the real stack: the
test add-on of ``tests/upgrade_addon`` (a real distribution, installed by pip into a
temporary directory and put on the clients' path with ``PYTHONPATH``) is installed at
release 1, then release 2 -- profile version 2, an upgrade step 1 -> 2 that counts its runs
-- is "deployed" and two ``bin/upgrade-site`` start together.

Run as root on a build with a service user (``make build`` as root), ``bin/instance run`` and
``bin/upgrade-site`` drop to that user (plonedeploy.runtime.access.become, in the client's
``bin/interpreter``): the step records the uid it ran as, and the test asserts it is the
service user's. The releases and the step's log are therefore kept in a directory of the
test's own that the service user can read (``addon_root``), not in ``tmp_path``.

The add-on stays installed in the stack's site after the test (profile version 2, its
registry record): without its code on the clients' path nothing reads either, and the next
run of the test installs release 1 afresh.
"""
import os
import pathlib
import pwd
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT, admin_session, run
from plonedeploy.runtime import upgrade

ADDON = os.path.join(ROOT, "tests", "upgrade_addon")
UPGRADE_SITE = os.path.join(ROOT, "bin", "upgrade-site")
RECORD = "plonedeploy_upgradetest.upgrade_runs"
STEP_LINE = "ran: plonedeploy_upgradetest:default 1 -> 2: Count this upgrade's runs"


# -- unit tests (no stack) -------------------------------------------------------------------

def test_help_names_exit_statuses_and_lock_timeout(capsys):
    with pytest.raises(SystemExit) as exit_info:
        upgrade.main(client="/nonexistent", argv=["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for status in ("0  steps ran", "1  a step failed", "2  bad arguments", "3  another run holds the lock",
                   "4  no Plone site"):
        assert status in text
    assert f"(default {upgrade.DEFAULT_LOCK_TIMEOUT} s)" in text and "--dry-run" in text
    assert "as root on a build with a\nservice user, it runs as that user" in text


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "soon"])
def test_bad_lock_timeout_exits_2_before_zope_starts(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        upgrade.main(client="/nonexistent", argv=["--lock-timeout", value])
    assert exit_info.value.code == upgrade.EXIT_USAGE
    assert "positive whole number of seconds" in capsys.readouterr().err


def test_missing_client_part_says_to_build(tmp_path, capsys):
    assert upgrade.main(client=str(tmp_path), argv=[]) == upgrade.EXIT_USAGE
    assert "bin/buildout" in capsys.readouterr().err


def test_lock_is_free_held_or_stale_by_its_heartbeat():
    timeout = 3600
    assert upgrade.lock_holder(None, 1000.0, timeout) is None
    assert upgrade.lock_holder({}, 1000.0, timeout) is None
    lock = {}
    assert upgrade.take(lock, "t1", "host-a pid 1", 1000.0) is None
    assert upgrade.lock_holder(lock, 1000.0 + timeout, timeout) == "host-a pid 1"
    # One second past the timeout after the last heartbeat: stale, another run may take it.
    assert upgrade.lock_holder(lock, 1001.0 + timeout, timeout) is None
    assert upgrade.take(lock, "t2", "host-b pid 2", 1001.0 + timeout) == ("host-a pid 1", timeout + 1.0)
    assert lock["token"] == "t2" and lock["heartbeat"] == lock["since"] == 1001.0 + timeout
    # Released (token cleared): free at once.
    lock.update(token=None, holder=None)
    assert upgrade.lock_holder(lock, 1002.0 + timeout, timeout) is None


def test_flat_keeps_the_order_of_nested_steps():
    a, b, c = ({"id": name} for name in "abc")
    assert upgrade.flat([a, [b, c]]) == [a, b, c]
    step = {"ssource": "1", "sdest": "2", "title": "T"}
    assert upgrade.step_line("ran", "p:default", step) == "ran: p:default 1 -> 2: T"


# -- on the real stack ------------------------------------------------------------------------

@pytest.fixture
def addon_root():
    """A directory (0755, removed afterwards) for the add-on's releases and the step's log,
    which the stack's service user can reach: not ``tmp_path``, under ``/tmp/pytest-of-root``
    (0700), which every pytest session that makes a ``tmp_path`` chmods back to 0700 --
    also another checkout's, at any time -- and so takes away the search permission (the
    ACL's mask) that the client's script granted the service user on it."""
    directory = tempfile.mkdtemp(prefix="plonedeploy-upgradetest-")
    try:
        os.chmod(directory, 0o755)
        yield pathlib.Path(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def runs_as(stack):
    """The uid ``bin/upgrade-site`` runs the steps as: the stack's service user's when root
    runs the tests on a build with one (its client script drops to it), else ours."""
    from loadtests.core.stack import service_user

    user = service_user(stack.config)
    return pwd.getpwnam(user).pw_uid if user and os.geteuid() == 0 else os.geteuid()


def install_release(number, root):
    """Install release ``number`` of the test add-on with pip (no index, no dependencies: it
    has none) into ``root/release<number>``, from a copy of its source (pip builds in
    the source tree); returns that directory, for ``PYTHONPATH``."""
    source = root / f"source{number}"
    shutil.copytree(os.path.join(ADDON, f"release{number}"), source)
    target = root / f"release{number}"
    pip = os.path.join(ROOT, ".venv-buildout", "bin", "pip")
    run([pip, "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation", "--target", str(target),
         str(source)], timeout=120, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    return str(target)


def upgrade_runs(stack):
    """The record the upgrade step counts its commits in, read through the first ZEO client
    with plone.restapi's ``@registry`` (the clients do not have the add-on's code: the record
    is plone.registry's own)."""
    url = f"{stack.client_urls[stack.config['servers'][0]]}/Plone/@registry/{RECORD}"
    response = admin_session().get(url, timeout=30)
    response.raise_for_status()
    return response.json()


@pytest.mark.integration
def test_upgrade_step_runs_once_when_two_runs_start_together(stack, addon_root):
    release1, release2 = install_release(1, addon_root), install_release(2, addon_root)
    installed = run([os.path.join(ROOT, "bin", "instance"), "run", "tests/upgrade_addon/install.py"], timeout=300,
                    env={**os.environ, "PYTHONPATH": release1})
    assert "installed plonedeploy_upgradetest:default at version 1" in installed.stdout
    assert upgrade_runs(stack) == 0

    # The deploy: release 2 on the path. The step takes 3 s, so that a run that starts while
    # the other holds the lock meets it held rather than finding the work done.
    # The step appends to its log as the user it runs as: the file is made here, that user's.
    uid = runs_as(stack)
    log = addon_root / "step.log"
    log.touch()
    os.chown(log, uid, pwd.getpwuid(uid).pw_gid)
    env = {**os.environ, "PYTHONPATH": release2, "PLONEDEPLOY_UPGRADETEST_LOG": str(log),
           "PLONEDEPLOY_UPGRADETEST_SECONDS": "3"}
    started = time.monotonic()
    procs = [subprocess.Popen([UPGRADE_SITE], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    seconds = time.monotonic() - started
    report = [(proc.returncode, out, err[-2000:]) for proc, (out, err) in zip(procs, outputs)]
    ran = [i for i, (out, _) in enumerate(outputs) if STEP_LINE in out.splitlines()]
    assert len(ran) == 1, report
    winner, other = report[ran[0]], report[1 - ran[0]]
    assert winner[0] == upgrade.EXIT_OK, report
    # The other run met the lock held (exit 3, "refused") or came after the first and found
    # nothing pending (exit 0); either way it ran no step.
    refused = other[0] == upgrade.EXIT_LOCKED and "refused: another bin/upgrade-site holds the lock" in other[2]
    came_after = other[0] == upgrade.EXIT_OK and other[1].splitlines() == ["nothing pending"]
    assert refused or came_after, report
    # Executed once (the file, outside any transaction) and committed once (the record).
    assert log.read_text().count("ran pid") == 1, report
    # ... as the service user, as bin/instance runs its commands (root: never as root).
    assert f"uid {uid}" in log.read_text(), (uid, log.read_text())
    assert upgrade_runs(stack) == 1
    print(f"two runs together: {seconds:.1f} s, the other {'refused' if refused else 'found nothing pending'}",
          file=sys.stderr)

    third = run([UPGRADE_SITE], timeout=300, env=env)
    assert third.stdout.splitlines() == ["nothing pending"]
    assert log.read_text().count("ran pid") == 1
    assert upgrade_runs(stack) == 1
