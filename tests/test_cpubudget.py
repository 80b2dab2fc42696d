"""CPU budgets (loadtests.core.cpubudget, loadtests.ab.budget): the A/B's options and the
groups' names without a stack; as root on a machine with cgroup v1 ``cpu``, a real group that
holds a busy process tree to its quota and is removed afterwards."""
import os
import subprocess
import sys
import time

import psutil
import pytest

from loadtests.ab import abtest, budget
from loadtests.ab.rounds_report import budget_sentence, slot_cpu_cell
from loadtests.core import cpubudget
from loadtests.core.stack import ROOT


def _can_make_groups():
    try:
        cpubudget.check_available("test")
    except cpubudget.BudgetError:
        return False
    return True


requires_cgroup_cpu = pytest.mark.skipif(not _can_make_groups(),
                                         reason="needs root and a writable cgroup v1 cpu controller")


def test_cpu_budget_option_defaults_and_errors(capsys):
    args = abtest.parse_args([])
    assert (args.cpu_budget, args.slot_cpus) == ("off", budget.DEFAULT_SLOT_CPUS)
    assert abtest.parse_args(["--cpu-budget", "equal"]).cpu_budget == "equal"
    assert abtest.parse_args(["--cpu-budget", "off"]).cpu_budget == "off"
    # The deployed clients and the balance modes' runs are not the slots: no budgets there.
    assert abtest.parse_args(["--deployed"]).cpu_budget == "off"
    assert abtest.parse_args(["--balance", "leastconn,roundrobin"]).cpu_budget == "off"
    assert abtest.parse_args(["--slot-cpus", "0.25", "--calibrate", "10"]).slot_cpus == 0.25
    for bad, message in ((["--cpu-budget", "half"], "invalid choice: 'half' (choose from 'equal', 'off')"),
                         (["--deployed", "--cpu-budget", "equal"], "--cpu-budget equal applies to the rounds'"),
                         (["--cpu-budget", "equal", "--slot-cpus", "0"], "--slot-cpus 0: cores must be above 0.01"),
                         (["--cpu-budget", "equal", "--slot-cpus", "0.005"],
                          "--slot-cpus 0.005: cores must be above 0.01"),
                         (["--cpu-budget", "equal", "--slot-cpus", str(os.cpu_count() + 1)], "at most")):
        with pytest.raises(SystemExit):
            abtest.parse_args(bad)
        assert message in capsys.readouterr().err, bad
    # --slot-cpus is not checked at all without budgets (it means nothing then).
    assert abtest.parse_args(["--cpu-budget", "off", "--slot-cpus", "0"]).cpu_budget == "off"


def test_group_names_and_quotas():
    assert cpubudget.group_name("ab-a", 1234) == "plonedeploy-ab-a-1234"
    assert cpubudget.group_name("ab-b").endswith(f"-{os.getpid()}")
    for bad in ("", "AB", "ab/a", "-ab", "../x"):
        with pytest.raises(ValueError):
            cpubudget.group_name(bad)
    with pytest.raises(ValueError, match="use group_name"):
        cpubudget.CpuGroup("cpu-hog", 0.5, "--x")
    assert cpubudget.quota_us(0.5, "--x") == 50_000
    assert cpubudget.quota_us(0.01, "--x") == cpubudget.MIN_QUOTA_US
    with pytest.raises(cpubudget.BudgetError, match="--x 3: .* at most 2"):
        cpubudget.quota_us(3, "--x", max_cores=2)


def test_run_cores_cut_slot_a_only_in_calibration_ab_runs():
    assert budget.run_cores(0.5, "ab", "a") == {"a": 0.5, "b": 0.5}
    assert budget.run_cores(0.5, "ab", "b", calibrate=10) == {"a": 0.5, "b": pytest.approx(0.45)}
    assert budget.run_cores(0.5, "aa", "b", calibrate=10) == {"a": 0.5, "b": 0.5}  # the control stays equal


def test_usage_and_its_report_cells():
    before = {"a": {"nr_periods": 100, "nr_throttled": 10}, "b": {"nr_periods": 50, "nr_throttled": 0}}
    after = {"a": {"nr_periods": 300, "nr_throttled": 190}, "b": {"nr_periods": 50, "nr_throttled": 0}}
    used = budget.usage({"a": 0.45, "b": 0.5}, before, after, {"a": 9.0, "b": 4.0}, 20.0)
    assert used == {"a": {"cores": 0.45, "used_cores": 0.45, "throttled": 0.9},
                    "b": {"cores": 0.5, "used_cores": 0.2, "throttled": None}}
    assert slot_cpu_cell(used["a"]) == "0.45/0.45 (90%)"
    assert slot_cpu_cell(used["b"]) == "0.20/0.50" and slot_cpu_cell(None) == "-"
    assert "quota of 0.5 cores" in budget_sentence({"cpu_budget": "equal", "slot_cpus": 0.5,
                                                     "calibrate_percent": 10})
    assert "10% lower" in budget_sentence({"cpu_budget": "equal", "slot_cpus": 0.5, "calibrate_percent": 10})
    assert budget_sentence({"cpu_budget": "off"}).startswith("No CPU budgets")


def test_refuses_without_root_or_cgroup_v1(tmp_path):
    with pytest.raises(cpubudget.BudgetError, match="--cpu-budget equal needs the cgroup v1 cpu controller"):
        cpubudget.check_available("--cpu-budget equal", root=str(tmp_path))
    if os.geteuid() != 0:
        pytest.skip("only root can drop to nobody")
    # A real unprivileged process (nobody), not a patched geteuid. It imports the module as
    # root first, then drops to nobody: a checkout made with mktemp -d (mode 0700, as in CI)
    # is not readable by nobody.
    code = ("import os\nfrom loadtests.core import cpubudget\n"
            "os.setgroups([])\nos.setgid(65534)\nos.setuid(65534)\n"
            "try:\n    cpubudget.check_available('--cpu-budget equal')\n"
            "except cpubudget.BudgetError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.startswith("--cpu-budget equal needs root"), (result.stdout, result.stderr)


#: Spins; after a line on stdin forks a child that spins too (born after the move).
BUSY = "import os, sys\nsys.stdin.readline()\nos.fork()\nwhile True:\n    pass\n"


def _tree_cpu(proc):
    return sum(p.cpu_times().user + p.cpu_times().system for p in [proc] + proc.children())


def _cores_over(proc, seconds):
    before, started = _tree_cpu(proc), time.monotonic()
    time.sleep(seconds)
    return (_tree_cpu(proc) - before) / (time.monotonic() - started)


@requires_cgroup_cpu
def test_group_holds_a_busy_tree_to_its_quota_and_is_removed():
    """0.1 cores for a busy process and the child it forks after the move, measured with
    psutil over 3 s. Tolerance: CFS grants the quota per 100 ms period, so a 3 s window
    can hold one period's quota more than 3 s x 0.1 cores (+0.01 cores/3 s), and psutil's
    two readings fall anywhere in a period: 0.1 x 1.2 + 0.01 bounds it."""
    cores, name = 0.1, cpubudget.group_name("test-busy")
    proc = subprocess.Popen([sys.executable, "-c", BUSY], stdin=subprocess.PIPE, text=True)
    try:
        ps = psutil.Process(proc.pid)
        with cpubudget.CpuGroup(name, cores, "--slot-cpus") as group:
            assert os.path.isdir(group.path)
            assert group.add_tree(proc.pid) == [proc.pid]
            proc.stdin.write("go\n")
            proc.stdin.flush()
            deadline = time.monotonic() + 30
            while not ps.children() and time.monotonic() < deadline:
                time.sleep(0.05)
            (child,) = ps.children()
            assert group.pids() == sorted([proc.pid, child.pid])  # inherited, not moved
            stat_before = group.stat()
            held = _cores_over(ps, 3.0)
            assert held <= cores * 1.2 + 0.01, held
            # The quota, not a busy machine, held it: stopped at its quota in most periods it
            # ran (a tree that wants 2 cores; at load average 4 it still gets 0.2 or more).
            stat = group.stat()
            periods = stat["nr_periods"] - stat_before["nr_periods"]
            assert stat["nr_throttled"] - stat_before["nr_throttled"] >= 0.5 * periods > 0, (stat_before, stat)
            group.set_cores(0.2)
            with open(os.path.join(group.path, "cpu.cfs_quota_us"), encoding="ascii") as fp:
                assert int(fp.read()) == 20_000
        # Left while both still ran: they went back to the root group, the group is gone.
        assert not os.path.exists(os.path.join(cpubudget.CGROUP_CPU, name))
        assert ps.is_running() and child.is_running()
        with open(f"/proc/{child.pid}/cgroup", encoding="ascii") as fp:
            assert ":cpu:/\n" in fp.read()
    finally:
        for p in psutil.Process(proc.pid).children() + [psutil.Process(proc.pid)]:
            p.kill()
        proc.wait(10)


@requires_cgroup_cpu
def test_slot_budgets_are_removed_on_error():
    with pytest.raises(psutil.NoSuchProcess):
        with budget.SlotBudgets(0.5) as budgets:
            paths = [g.path for g in budgets.groups.values()]
            assert all(os.path.isdir(p) for p in paths)
            for path in paths:
                with open(os.path.join(path, "cpu.shares"), encoding="ascii") as fp:
                    assert int(fp.read()) == budget.SLOT_SHARES
            budgets.apply({"a": 2**22 + 1, "b": 2**22 + 1}, "ab", "a")  # no such PID
    assert not any(os.path.exists(p) for p in paths)
