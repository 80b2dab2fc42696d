"""A fixed CPU budget for a process tree: a cgroup v1 ``cpu`` group with a CFS quota.

``CpuGroup(name, cores)`` creates ``/sys/fs/cgroup/cpu/<name>`` with ``cpu.cfs_period_us`` =
:data:`PERIOD_US` and ``cpu.cfs_quota_us`` = ``cores`` x period, so that the processes in it
together get at most ``cores`` cores of CPU time (the kernel's CFS bandwidth control,
Documentation/scheduler/sched-bwc.rst: a group that used its quota within a period is
throttled until the next period). :meth:`CpuGroup.add_tree` moves a process and its
descendants in (all their threads with them: ``cgroup.procs`` takes thread-group ids), and
whatever they fork later is born in the group. :meth:`CpuGroup.remove` (also on leaving the
``with`` block, error or not) moves what is still in it back to the hierarchy's root and
removes the group.

Only root can do this, and only on a machine with the cgroup v1 ``cpu`` controller mounted
writable at :data:`CGROUP_CPU` (cgroup v2 has no such directory): :func:`check_available`
raises :class:`BudgetError` naming the option that asked for it otherwise, before anything
changes. The loadtests use it for the A/B's ``--cpu-budget equal`` (``loadtests.ab.budget``).

Units: cores (CPU seconds per wall second, 0 < cores <= the machine's cores), microseconds
for ``_us``, nanoseconds for ``throttled_time`` (the kernel's ``cpu.stat``).
"""
import errno
import os
import re
import time

import psutil

#: Where the cgroup v1 ``cpu`` controller is mounted (Debian 12 with cgroup v1, these machines).
CGROUP_CPU = "/sys/fs/cgroup/cpu"
#: CFS period (the kernel's default, 100 ms): the quota is granted anew every period.
PERIOD_US = 100_000
#: The kernel refuses a quota below 1 ms (``cpu.cfs_quota_us`` >= 1000).
MIN_QUOTA_US = 1000
#: Every group this module makes starts with this (``plonedeploy-ab-1234-a``).
PREFIX = "plonedeploy-"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class BudgetError(RuntimeError):
    """A CPU budget cannot be set up: not root, no writable cgroup v1 ``cpu`` controller, a
    bad number of cores, or the kernel refused a write. The message names the option."""


def check_available(option, root=CGROUP_CPU):
    """Raise :class:`BudgetError` (its message names ``option``, e.g. ``"--cpu-budget equal"``)
    unless this process is root and ``root`` is a writable cgroup v1 ``cpu`` hierarchy (it has
    ``cpu.cfs_quota_us``); returns None. Changes nothing."""
    if os.geteuid() != 0:
        raise BudgetError(f"{option} needs root: only root may create cgroups in {root}")
    if not os.path.exists(os.path.join(root, "cpu.cfs_quota_us")):
        raise BudgetError(f"{option} needs the cgroup v1 cpu controller at {root} (with cpu.cfs_quota_us); "
                          "this machine has none (cgroup v2 or not mounted)")
    if not os.access(root, os.W_OK):
        raise BudgetError(f"{option}: {root} is not writable (mounted read-only, e.g. in a container)")


def group_name(label, pid=None):
    """Name of a group: ``plonedeploy-<label>-<pid>``; ``pid`` (default this process') keeps
    two runs on one machine apart and tells whose group a left-over one was. ``label``:
    lower-case letters, digits and ``-``; ValueError otherwise."""
    if not _NAME.match(label):
        raise ValueError(f"cgroup label {label!r}: only a-z, 0-9 and '-' (not first)")
    return f"{PREFIX}{label}-{os.getpid() if pid is None else pid}"


def quota_us(cores, option, period_us=PERIOD_US, max_cores=None):
    """``cpu.cfs_quota_us`` for ``cores`` (float) per ``period_us``: an int >= :data:`MIN_QUOTA_US`.
    Raises :class:`BudgetError` naming ``option`` when ``cores`` is not above 0, gives less
    than the kernel's 1 ms per period, or exceeds ``max_cores`` (default the machine's
    cores: a larger quota would not bound anything)."""
    limit = (psutil.cpu_count() or 1) if max_cores is None else max_cores
    quota = int(round(cores * period_us))
    if not 0 < cores <= limit or quota < MIN_QUOTA_US:
        raise BudgetError(f"{option} {cores:g}: cores must be above {MIN_QUOTA_US / period_us:g} "
                          f"(the kernel's 1 ms per {period_us // 1000} ms period) and at most {limit} "
                          "(this machine's cores)")
    return quota


def read_stat(path):
    """``cpu.stat`` of the group directory ``path`` as ``{key: int}``: ``nr_periods`` (periods
    in which the group ran), ``nr_throttled`` (of those, periods in which it used its quota
    and was stopped), ``throttled_time`` (ns it spent stopped)."""
    with open(os.path.join(path, "cpu.stat"), encoding="ascii") as fp:
        return {key: int(value) for key, value in (line.split() for line in fp if line.strip())}


class CpuGroup:
    """One cgroup v1 ``cpu`` group at ``<root>/<name>`` holding at most ``cores`` cores.

    ``shares``: the group's ``cpu.shares`` (weight against its siblings and the root's
    processes when cores are contended; 1024 = one process at nice 0), default the kernel's.
    ``option`` names the command-line option in every error. Use as a context manager (or
    :meth:`create` and :meth:`remove`). Raises :class:`BudgetError` when the group cannot
    be made or written (see :func:`check_available`).
    """

    def __init__(self, name, cores, option, root=CGROUP_CPU, period_us=PERIOD_US, shares=None):
        if not name.startswith(PREFIX) or not _NAME.match(name):
            raise ValueError(f"cgroup name {name!r}: use group_name()")
        self.name, self.option, self.root, self.period_us = name, option, root, period_us
        self.shares = shares
        self.path = os.path.join(root, name)
        self.cores = cores
        self.quota_us = quota_us(cores, option, period_us)
        self.created = False

    def _write(self, filename, value):
        try:
            with open(os.path.join(self.path, filename), "w", encoding="ascii") as fp:
                fp.write(f"{value}\n")
        except OSError as exc:
            raise BudgetError(f"{self.option}: writing {value} to {self.path}/{filename} failed: {exc}") from exc

    def create(self):
        """Make the group and set its period and quota. A group of this name left by an
        earlier run of the same PID is reused."""
        check_available(self.option, self.root)
        try:
            os.mkdir(self.path)
        except FileExistsError:
            pass
        except OSError as exc:
            raise BudgetError(f"{self.option}: cannot create {self.path}: {exc}") from exc
        self.created = True
        # The period first: the kernel checks the quota against the period in force.
        self._write("cpu.cfs_period_us", self.period_us)
        self._write("cpu.cfs_quota_us", self.quota_us)
        if self.shares is not None:
            self._write("cpu.shares", self.shares)
        return self

    def set_cores(self, cores):
        """Change the quota to ``cores`` cores (takes effect from the next period)."""
        self.quota_us = quota_us(cores, self.option, self.period_us)
        self.cores = cores
        self._write("cpu.cfs_quota_us", self.quota_us)

    def add_tree(self, pid):
        """Move process ``pid`` and all its descendants (with all their threads) into the
        group; returns the PIDs moved (list of int). The parent goes first: a child it
        forks after that is born in the group, so none can slip out between the listing
        and the moves. Processes that end meanwhile are skipped. Raises psutil.NoSuchProcess
        when ``pid`` itself does not run."""
        parent = psutil.Process(pid)
        moved = []
        for proc in [parent] + parent.children(recursive=True):
            try:
                self._write("cgroup.procs", proc.pid)
                moved.append(proc.pid)
            except BudgetError as exc:
                # ESRCH: it ended between the listing and the write.
                if not isinstance(exc.__cause__, ProcessLookupError) and proc.is_running():
                    raise
        return moved

    def pids(self):
        """PIDs (thread-group ids) in the group now, sorted."""
        with open(os.path.join(self.path, "cgroup.procs"), encoding="ascii") as fp:
            return sorted(int(line) for line in fp if line.strip())

    def stat(self):
        """The group's ``cpu.stat`` (:func:`read_stat`)."""
        return read_stat(self.path)

    def remove(self, timeout=5.0):
        """Move every process still in the group to the root group and remove the group
        (rmdir). Idempotent. A process that is exiting can hold the group for a moment
        (EBUSY): retried for up to ``timeout`` seconds, then BudgetError."""
        if not os.path.isdir(self.path):
            self.created = False
            return
        deadline = time.monotonic() + timeout
        while True:
            for pid in self.pids():
                try:
                    with open(os.path.join(self.root, "cgroup.procs"), "w", encoding="ascii") as fp:
                        fp.write(f"{pid}\n")
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(self.path)
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise BudgetError(f"{self.option}: cannot remove {self.path}: {exc}") from exc
                time.sleep(0.05)
        self.created = False

    def __enter__(self):
        return self.create()

    def __exit__(self, *exc):
        self.remove()
        return False
