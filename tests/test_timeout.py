"""The per-test timeout (pytest-timeout, pytest.ini; docs/how-to/testing.md, "Timeouts").

A hanging test must not eat CI's 90 minutes: an inner pytest, independent of this suite's
conftest and ini but with pytest.ini's ``timeout_method``, runs tests that wait for a
``sleep 1000`` child; each fails after its timeout, the run goes on to its summary and
``--durations`` table, and the children subprocess.run started are killed (its context
manager kills the child on any exception, the timeout's too). A plain Popen's child is not:
the tests stop theirs in ``finally`` (conftest.stop_group). Then the budgets of
conftest.setup_budget: the test that sets up a slow fixture gets them, the others not.
"""
import configparser
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import ROOT, SETUP_BUDGET, configured_timeout, default_timeout, pending_budget, setup_budget

INNER = '''
import subprocess


def hang(pid_file):
    """A command that writes its PID to ``pid_file`` and sleeps 1000 s (sh execs sleep)."""
    return ["sh", "-c", 'echo $$ > "$0"; exec sleep 1000', pid_file]


def test_run_without_timeout():
    subprocess.run(hang(r"{dir}/plain.pid"))


def test_run_captured_as_conftest_run():
    # conftest.run's call: output captured, a timeout longer than the test's
    subprocess.run(hang(r"{dir}/captured.pid"), capture_output=True, text=True, timeout=1000, check=False)


def test_popen_left_running():
    proc = subprocess.Popen(["sleep", "1000"])
    with open(r"{dir}/popen.pid", "w") as fp:
        fp.write(str(proc.pid))
    proc.wait()
'''

#: Seconds each inner test may run.
INNER_TIMEOUT = 2


def _running(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# [] is a serial run (pytest alone), the other as make test runs: tests in xdist workers,
# whose timeouts must fail the test and leave the summary as well.
@pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist", "loadgroup"]], ids=["serial", "xdist"])
def test_hanging_subprocess_fails_its_test_and_is_killed(tmp_path, workers):
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(os.path.join(ROOT, "pytest.ini"))
    method = ini["pytest"]["timeout_method"]
    (tmp_path / "pytest.ini").write_text(f"[pytest]\ntimeout_method = {method}\n")
    (tmp_path / "test_hang.py").write_text(INNER.format(dir=tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
             "-c", str(tmp_path / "pytest.ini"), "--timeout", str(INNER_TIMEOUT), "--durations=5", "-ra",
             *workers, str(tmp_path / "test_hang.py")],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False, env=env)
        seconds = time.monotonic() - started
        output = result.stdout + result.stderr
        print(f"\ninner pytest: {seconds:.1f} s, exit {result.returncode}\n{output[-3000:]}")
        # Far below the children's 1,000 s sleeps: the hang was cut. Not tighter: two xdist workers
        # start (each imports Locust's plugin) beside the suite's stacks; 31.6 s seen on a busy run.
        assert seconds < 90, seconds
        assert result.returncode == 1, output
        assert output.count(f"Timeout (>{float(INNER_TIMEOUT)}s) from pytest-timeout") >= 3, output
        for name in ("test_run_without_timeout", "test_run_captured_as_conftest_run", "test_popen_left_running"):
            assert re.search(rf"^FAILED test_hang\.py::{name} - Failed: Timeout", output, re.MULTILINE), name
        assert re.search(r"^=+ 3 failed in [\d.]+s", output, re.MULTILINE), output  # the summary line
        assert re.search(r"^=+ slowest 5 durations =+$", output, re.MULTILINE), output
        assert re.search(r"^[\d.]+s call +test_hang\.py::test_run_without_timeout$", output, re.MULTILINE), output
        for name in ("plain", "captured"):
            pid = int((tmp_path / f"{name}.pid").read_text())
            assert not _running(pid), f"{name}: sleep {pid} still runs after its test timed out"
        # The check sees a survivor: a Popen nobody stops outlives its test (and the inner pytest).
        popen_pid = int((tmp_path / "popen.pid").read_text())
        assert _running(popen_pid), popen_pid
    finally:
        if (tmp_path / "popen.pid").exists() and _running(int((tmp_path / "popen.pid").read_text())):
            os.kill(int((tmp_path / "popen.pid").read_text()), signal.SIGKILL)


@pytest.fixture(scope="module")
@setup_budget(300)
def _slow_setup():
    """Stands for a fixture such as ``stack``; ``users``: the tests that had it, in order."""
    return {"users": []}


@pytest.mark.parametrize("nth", [1, 2])
def test_setup_budget_goes_to_the_test_that_sets_the_fixture_up(request, _slow_setup, nth):
    first = not _slow_setup["users"]  # this test set the fixture up (-k may have left the other out)
    _slow_setup["users"].append(request.node.nodeid)
    default = default_timeout(request.config)
    if default <= 0:
        pytest.skip("timeouts are off (--timeout 0)")
    expected = default + (300 if first else 0)
    assert configured_timeout(request.node) == expected
    if (request.config.getoption("timeout_method") or request.config.getini("timeout_method")) == "signal":
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)  # the timer pytest-timeout armed
        assert expected - 60 < remaining <= expected, (remaining, expected, _slow_setup["users"])


def test_pending_budget_counts_each_fixture_not_set_up():
    assert SETUP_BUDGET["_slow_setup"] == 300 and SETUP_BUDGET["stack"] > 0
    assert pending_budget(["tmp_path", "stack", "_slow_setup"], set_up=set()) == SETUP_BUDGET["stack"] + 300
    assert pending_budget(["tmp_path", "stack", "_slow_setup"], set_up={"stack"}) == 300
    assert pending_budget(["tmp_path"], set_up=set()) == 0
