"""Process, CPU and RSS accounting, and waiting for quiet: CPU seconds of processes, of this
process and its children, of a process tree and of the whole machine; RSS of a process tree
(``tree_rss``) and its peak (``RssSampler``); CPU over a call (``cpu_during``) and per request
(``cpu_ms_per_request``); free ports, the descriptor limit, the kernel's
accept-queue drops; ``wait_for_quiet``, ``wait_tree_idle``. Units: seconds for times and CPU,
bytes for sizes.
"""
import random
import resource
import socket
import threading
import time
from collections import namedtuple

import psutil


# ----------------------------------------------------------------------------- CPU, RSS, descriptors

def cpu_seconds(processes):
    """Return ``{name: user+system CPU seconds}`` (reaped children included) for a dict of
    psutil processes; processes that are gone are left out."""
    out = {}
    for name, proc in processes.items():
        try:
            t = proc.cpu_times()
            out[name] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return out


def cpu_ms_per_request(cpu, requests):
    """``{name: CPU milliseconds per request}`` (rounded to the microsecond) of ``cpu``
    (``{name: CPU seconds}``) spent on ``requests`` requests; every value None when no
    request was served."""
    return {name: round(1000 * seconds / requests, 3) if requests else None for name, seconds in cpu.items()}


#: What :func:`cpu_during` counted: ``result`` (what the call returned), ``cpu`` (``{name: CPU
#: seconds}`` of the processes asked for), ``others`` (CPU seconds of every other process that
#: ran at both ends, this one included, kernel threads not), ``kernel`` (CPU seconds of the
#: kernel's threads, children of kthreadd: ksoftirqd's network work among them), ``busy`` (the
#: machine's busy CPU seconds, all cores summed), ``wall`` (seconds).
CpuUse = namedtuple("CpuUse", "result cpu others kernel busy wall")


def cpu_during(processes, call):
    """Run ``call()`` and count the CPU used meanwhile (user + system); returns a
    :data:`CpuUse`. ``processes``: ``{name: psutil.Process}``, counted as :func:`cpu_seconds`
    (reaped children included; one gone before the end is left out). The busy time neither
    they nor ``others`` nor ``kernel`` account for: processes that started or ended during the call (a
    reaped child such as wrk among them) and, where the kernel charges it to no process,
    interrupt time. Exceptions of ``call`` pass through."""
    mine = {p.pid for p in processes.values()}
    # The machine's window encloses the processes' (its snapshots first and last): what the
    # processes used while they were read (tens of ms on a busy machine) is in both, so the
    # machine's busy time is not below their sum but by the ticks of their counters.
    busy_before, started = machine_busy_seconds(), time.monotonic()
    before, everyone = cpu_seconds(processes), _own_cpu_seconds_by_pid()
    result = call()
    after, everyone_after = cpu_seconds(processes), _own_cpu_seconds_by_pid()
    wall, busy = time.monotonic() - started, machine_busy_seconds() - busy_before
    others = kernel = 0.0
    for pid, (seconds, kernel_thread) in everyone_after.items():
        if pid in everyone and pid not in mine:
            if kernel_thread:
                kernel += seconds - everyone[pid][0]
            else:
                others += seconds - everyone[pid][0]
    cpu = {name: after[name] - before[name] for name in before if name in after}
    return CpuUse(result, cpu, others, kernel, busy, wall)


#: The PID of kthreadd, parent of the kernel's threads (Linux).
KTHREADD = 2


def _own_cpu_seconds_by_pid():
    """``{pid: (user + system CPU seconds, whether a kernel thread)}`` of every process running
    now, without its reaped children (:func:`cpu_during`'s others and kernel)."""
    out = {}
    for proc in psutil.process_iter(["cpu_times", "ppid"]):
        times = proc.info["cpu_times"]
        if times is not None:
            out[proc.pid] = (times.user + times.system, KTHREADD in (proc.pid, proc.info["ppid"]))
    return out


def machine_busy_seconds():
    """CPU seconds the whole machine spent not idle since boot (all cores summed)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def children_cpu_seconds():
    """CPU seconds (user + system) of this process' reaped children (wrk, Locust)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def own_cpu_seconds():
    """CPU seconds (user + system) of this process and its reaped children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime + children_cpu_seconds()


def tree_processes(root_pid):
    """``[psutil.Process]`` of ``root_pid`` and its descendants; empty when it is gone."""
    try:
        parent = psutil.Process(root_pid)
        return [parent] + parent.children(recursive=True)
    except psutil.Error:
        return []


def tree_cpu_seconds(root_pid):
    """CPU seconds (user + system, reaped children included) of the process tree of
    ``root_pid``, or the sum over the trees of a list of PIDs."""
    return sum(cpu_seconds({p.pid: p for root in _roots(root_pid) for p in tree_processes(root)}).values())


def tree_rss(root_pid):
    """Summed RSS (bytes) of the process tree of ``root_pid``, or of the trees of a list of
    PIDs; None when none of them runs."""
    processes = [p for root in _roots(root_pid) for p in tree_processes(root)]
    if not processes:
        return None
    total = 0
    for proc in processes:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def _roots(root_pid):
    """``[pid]`` of one PID or a list of PIDs (tree_cpu_seconds, RssSampler)."""
    return [root_pid] if isinstance(root_pid, int) else list(root_pid)


class RssSampler(threading.Thread):
    """Samples the summed RSS (bytes) of the process tree of ``root_pid`` (a PID, or a list
    of PIDs whose trees are summed: a balanced cell's clients and HAProxy) every
    ``interval`` seconds until :meth:`stop`; ``peak`` is the largest sample (bytes)."""

    def __init__(self, root_pid, interval=0.2):
        super().__init__(daemon=True)
        self.roots = _roots(root_pid)
        self.interval, self.peak = interval, 0
        self._stop_event = threading.Event()

    def sample(self):
        """Take one sample now and update ``peak``."""
        self.peak = max(self.peak, tree_rss(self.roots) or 0)

    def run(self):
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def stop(self):
        """Stop sampling, wait for the thread, and take a last sample."""
        self._stop_event.set()
        self.join()
        self.sample()


#: Where :func:`free_local_port` looks: below Linux's ephemeral range (ip_local_port_range,
#: 32768-60999 by default), from which every outgoing connection takes its source port, and
#: apart from the kit's ports (8xxx, 76xx-78xx, 95xx-97xx, 18xxx).
LOCAL_PORTS = range(20000, 30000)


def free_local_port(attempts=100):
    """A TCP port on 127.0.0.1 that nothing is bound to now, drawn at random from
    :data:`LOCAL_PORTS`. Not the kernel's choice of an ephemeral port: a load test's or an
    Ansible run's outgoing connections take their source ports from that range, and one of
    them took such a port between the choice and the caller's bind ("Address already in
    use", test_headline on a busy machine). Another program may still take it first; the
    callers bind within a second. Raises OSError when ``attempts`` ports are all taken."""
    for _ in range(attempts):
        port = random.choice(LOCAL_PORTS)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {LOCAL_PORTS.start}-{LOCAL_PORTS.stop - 1} after {attempts} attempts")


def raise_fd_limit(needed):
    """Raise this process' soft RLIMIT_NOFILE (inherited by wrk and started servers) towards
    ``needed`` descriptors. Returns the (soft, hard) limits after the attempt; the hard limit
    is never exceeded."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def listen_overflows():
    """``TcpExt: ListenOverflows`` of /proc/net/netstat (int): connections the kernel dropped
    because a listening socket's accept queue (its backlog, at most net.core.somaxconn)
    was full. Counts for the whole network namespace since boot; 0 where the file is
    missing."""
    try:
        with open("/proc/net/netstat", encoding="ascii") as fp:
            lines = fp.read().splitlines()
    except OSError:
        return 0
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split()[1:], values.split()[1:])).get("ListenOverflows", 0))
    return 0


# ----------------------------------------------------------------------------- waiting for quiet

def foreign_cores(procs, seconds=2.0):
    """Cores (0.0 .. number of cores) used over ``seconds`` by other processes than ours:
    ``procs`` (``{name: psutil.Process}``), this process and its reaped children."""
    ours_before, busy_before = cpu_seconds(procs), machine_busy_seconds()
    mine_before = own_cpu_seconds()
    started = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - started
    ours = sum(cpu_seconds(procs).get(n, 0) - v for n, v in ours_before.items())
    mine = own_cpu_seconds() - mine_before
    return max(machine_busy_seconds() - busy_before - ours - mine, 0.0) / wall


def wait_for_quiet(procs, max_foreign, timeout):
    """Wait until other processes use at most ``max_foreign`` cores (see
    :func:`foreign_cores`) or ``timeout`` seconds passed; returns the seconds waited.

    Other users' load makes a run slower for reasons unrelated to what is measured; runs
    are alternated anyway, this only avoids the worst minutes.
    """
    started = time.monotonic()
    while timeout > 0:
        load = foreign_cores(procs)
        if load <= max_foreign or time.monotonic() - started >= timeout:
            break
        time.sleep(3)
    return round(time.monotonic() - started, 1)


def wait_tree_idle(root_pid, max_seconds=60.0, window=0.3, idle_cores=0.1):
    """Wait until the process tree of ``root_pid`` (or the trees of a list of PIDs) uses
    less than ``idle_cores`` cores over a ``window`` (seconds), at most ``max_seconds``;
    returns the seconds waited.

    wrk abandons the requests in flight when it stops, but a server without disconnect
    detection (pyruvate, waitress's threads) still serves the requests it queued, up to one
    per connection: without this wait they would run into the next run of that server.
    """
    started = time.monotonic()
    before = tree_cpu_seconds(root_pid)
    while time.monotonic() - started < max_seconds:
        time.sleep(window)
        now = tree_cpu_seconds(root_pid)
        if now - before < idle_cores * window:
            break
        before = now
    return time.monotonic() - started
