"""The A/B's CPU budgets (``--cpu-budget``, ``--slot-cpus``): each slot client in a cgroup v1
``cpu`` group of its own with the same CFS quota (``loadtests.core.cpubudget``).

Without budgets both slot clients, Locust and HAProxy share the machine's 2 cores, which
the run saturates (92-99 % busy): the share then shows how the machine is shared more than
what each server does with its CPU, and a 10 % capacity cut went undetected (issue 32).
With ``--cpu-budget equal`` each slot's client may use at most ``--slot-cpus`` cores; Locust,
the temporary HAProxy and everything else stay outside the groups, in the rest of the
machine. When both slots run at their budget, the share measures what each server does
with the same CPU (docs/explanation/ab-method.md, "Equal CPU budgets").

The calibration (``--calibrate PERCENT``) under budgets gives slot A's group ``PERCENT`` %
less quota than B's instead of freezing it: a slot held at its quota makes up a short
freeze in the rest of the period, so a freeze cuts its capacity by less than its length
(or not at all), while a smaller quota cuts the capacity of a slot at its budget by
exactly that much, as a server needing ``PERCENT`` % more CPU per request would.
"""
from loadtests.ab import abslots
from loadtests.core import cpubudget

MODES = ("equal", "off")
#: Cores per slot. At 0.5 the slots were not held by their budgets on a busy machine (28 Nov
#: 2026, machine 100 % busy, 55 % of it other users' work: each slot used 0.34-0.35 cores,
#: throttled in 13-25 % of the periods): Locust and HAProxy, outside the groups, could not
#: send them more. 0.25 each leaves 1.5 cores to Locust, HAProxy and the rest.
DEFAULT_SLOT_CPUS = 0.25
OPTION = "--cpu-budget equal"
#: cpu.shares of each slot's group. A group competes with the root group's processes as
#: one of weight cpu.shares: at the kernel's 1024 a slot's Zope gets no more than any other
#: busy process on a contended core, and other users' work could keep it below its quota.
#: 4096 lets each slot take its quota first; the quota still caps it.
SLOT_SHARES = 4096


def add_arguments(parser):
    """Add ``--cpu-budget`` and ``--slot-cpus`` to the A/B's parser."""
    parser.add_argument("--cpu-budget", choices=MODES, default="off",
                        help="equal: each slot's client in a cgroup v1 cpu group of its own with the same "
                        "quota (--slot-cpus), Locust and HAProxy outside (needs root and "
                        f"{cpubudget.CGROUP_CPU}); off: no budgets, the slots share the machine with "
                        "Locust and HAProxy. Default: off (equal needs root, holds each slot to "
                        "--slot-cpus, and detects --calibrate 10 with --rounds 8, not 4: "
                        "docs/explanation/ab-method.md); --deployed "
                        "and --balance always run without (they use the deployed clients)")
    parser.add_argument("--slot-cpus", type=float, default=DEFAULT_SLOT_CPUS, metavar="CORES",
                        help="with --cpu-budget equal: CPU quota of each slot's client in cores (CPU "
                        f"seconds per second, CFS period {cpubudget.PERIOD_US // 1000} ms); "
                        f"default {DEFAULT_SLOT_CPUS:g}")


def resolve(args, error):
    """Check the budget options of the parsed ``args`` (``--cpu-budget`` defaults to off:
    equal needs root and shows the sensitivity it is for with 8 rounds, not the default 4,
    docs/explanation/ab-method.md; equal is refused with ``--deployed`` or ``--balance``). ``error``:
    the parser's ``error`` (exits 2 with the message). Checks the options only: whether
    this machine can make groups is :func:`SlotBudgets`' to say, before the run builds
    anything."""
    slot_runs = not (args.deployed or args.balance)
    if args.cpu_budget == "equal" and not slot_runs:
        error("--cpu-budget equal applies to the rounds' slot clients; --deployed and --balance run the "
              "deployed clients, which it does not budget: use --cpu-budget off with them")
    if args.cpu_budget == "equal":
        try:
            cpubudget.quota_us(args.slot_cpus, "--slot-cpus")
        except cpubudget.BudgetError as exc:
            error(str(exc))


def run_cores(cores, kind, slot_a, calibrate=None):
    """``{"a": cores, "b": cores}`` of one run: ``cores`` each, except in a calibration's
    "ab" run, where the slot holding role A (``slot_a``) gets ``100 - calibrate`` % of it."""
    out = {slot: cores for slot in abslots.SLOTS}
    if calibrate is not None and kind == "ab":
        out[slot_a] = cores * (100.0 - calibrate) / 100.0
    return out


def usage(cores, stat_before, stat_after, cpu_s, wall_s):
    """``{slot: {"cores", "used_cores", "throttled"}}`` of one run: the quota (cores), the
    cores the slot's client used (``cpu_s[slot]`` CPU seconds over ``wall_s``, the measured
    part after the warm-up) and the fraction of CFS periods in which it used its whole
    quota and was stopped (``cpu.stat``, the whole Locust run, warm-up included; None when
    it ran in no period). A slot at its budget has ``used_cores`` near ``cores`` and
    ``throttled`` near 1."""
    out = {}
    for slot, quota in cores.items():
        periods = stat_after[slot]["nr_periods"] - stat_before[slot]["nr_periods"]
        throttled = stat_after[slot]["nr_throttled"] - stat_before[slot]["nr_throttled"]
        out[slot] = {"cores": round(quota, 3),
                     "used_cores": round(cpu_s.get(slot, 0.0) / wall_s, 3) if wall_s else None,
                     "throttled": round(throttled / periods, 3) if periods else None}
    return out


class SlotBudgets:
    """The two slots' groups (``plonedeploy-ab-a-<pid>``, ``plonedeploy-ab-b-<pid>``), made
    on entering the ``with`` block and removed on leaving it, error or not.

    ``cores``: each slot's quota; ``calibrate``: the A/B's ``--calibrate`` PERCENT or None.
    Entering raises ``loadtests.core.cpubudget.BudgetError`` (naming ``--cpu-budget equal``)
    when this machine cannot make them; nothing is left behind then.
    """

    def __init__(self, cores, calibrate=None):
        self.cores, self.calibrate = cores, calibrate
        self.groups = {slot: cpubudget.CpuGroup(cpubudget.group_name(f"ab-{slot}"), cores, OPTION,
                                                shares=SLOT_SHARES) for slot in abslots.SLOTS}

    def apply(self, pids, kind, slot_a):
        """Set one run's quotas (:func:`run_cores`) and move each slot's client, ``pids``
        (``{slot: PID}``), with its descendants into its group (a client that a round
        restarted is a new process). Returns ``{slot: cores}``."""
        cores = run_cores(self.cores, kind, slot_a, self.calibrate)
        for slot, group in self.groups.items():
            group.set_cores(cores[slot])
            group.add_tree(pids[slot])
        return cores

    def stat(self):
        """``{slot: cpu.stat}`` now (``loadtests.core.cpubudget.read_stat``)."""
        return {slot: group.stat() for slot, group in self.groups.items()}

    def __enter__(self):
        try:
            for group in self.groups.values():
                group.create()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        failed = None
        for group in self.groups.values():
            try:
                if group.created:
                    group.remove()
            except cpubudget.BudgetError as error:  # still try the other group
                failed = error
        if failed is not None:
            raise failed
        return False
