"""The memory watchdog of a ZEO client: recycle the process when its RSS stays above a limit,
drained first, one client at a time and never the last one
(docs/how-to/operate.md#memory-watchdog).

A thread of the client (started by the ``metrics`` filter next to the probes) calls
:meth:`Watchdog.tick` every ``INTERVAL`` seconds. The steps:

- RSS (:func:`rss`, ``/proc/self/statm``) above ``limit`` bytes for ``grace`` seconds
  without a break, the warm-up done: a candidate.
- Backoff: ``max_restarts`` recycles in the last hour (the times in ``state_file``) and it
  does not recycle: it keeps serving, logs once, and says so in
  ``plonedeploy_memory_recycle_blocked{reason="backoff"}`` (the alert). No peer at all:
  the same with ``reason="no_peer"`` (nothing would take its traffic).
- Every peer (``peers``: the other clients' metrics ``host:port``) must answer ``/readyz``
  200. Then it claims: :attr:`Watchdog.recycling` is set, so ``/readyz`` answers 503
  ``recycling: ...``. ``CLAIM_DELAY`` seconds later it asks the peers again: a peer that
  also claims and whose address sorts before this client's wins (this one withdraws), any
  other peer not ready makes it withdraw too.
- Drain: it waits ``check_window`` seconds (HAProxy's ``fall x inter`` + margin: its
  checks have seen the 503 and it sends nothing new), then until no request is in the
  application (:meth:`Health.in_flight`), at most ``drain_timeout`` seconds; at every look
  the peers must still answer 200, else it withdraws.
- Recycle: the time is appended to ``state_file``, the counter incremented, a log line
  written, and ``kill(getpid(), SIGTERM)``: the server shuts down, supervisord starts it
  again (``autorestart``), the warm-up makes it ready.

Everything that touches the world is a parameter (clock, wall clock, RSS reader, peer
asker, kill), so that tests/test_watchdog.py runs it without a stack.
"""
import logging
import os
import resource
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

logger = logging.getLogger("plonedeploy.watchdog")

#: Seconds between two looks at the RSS.
INTERVAL = 5.0
#: Defaults of the recipe options memory-limit-grace and memory-limit-restarts.
GRACE = 60.0
MAX_RESTARTS = 3
#: The backoff counts the recycles of this many seconds.
WINDOW = 3600.0
#: Seconds between the claim and the second look at the peers. A claim that loses is seen
#: by at most two of HAProxy's checks (``inter`` 2 s, then ``fastinter`` 0.5 s after a
#: failed one), fewer than ``fall`` (3): two clients claiming at once never both go DOWN.
CLAIM_DELAY = 0.5
#: Seconds between two looks while draining (the peers are asked at each).
DRAIN_INTERVAL = 1.0
#: Default seconds HAProxy needs to see the 503 (rules.recycle_check_window: fall 3 x inter 2 s + 3 s).
CHECK_WINDOW = 9.0
#: Longest wait for the requests in the application to finish: HAProxy's ``timeout server``.
DRAIN_TIMEOUT = 120.0
#: Seconds a peer has to answer ``/readyz``.
PEER_TIMEOUT = 2.0

IDLE, CLAIMED, DRAINING, RECYCLED = "idle", "claimed", "draining", "recycled"


def rss():
    """This process's resident set size in bytes now: ``/proc/self/statm``'s resident pages
    times the page size; off Linux ``ru_maxrss`` (the peak, which never goes down)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def ask_readyz(address, timeout=PEER_TIMEOUT):
    """``(status, text)`` of ``GET http://address/readyz``; ``(None, reason)`` when it does
    not answer."""
    host, _, port = address.rpartition(":")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address in a URL
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/readyz", timeout=timeout) as response:
            return response.status, response.read(200).decode(errors="replace").strip()
    except urllib.error.HTTPError as error:
        return error.code, error.read(200).decode(errors="replace").strip()
    except (OSError, ValueError) as error:
        return None, f"no answer: {error}"


def mib(size):
    return f"{size / 1048576:.0f} MiB"


def read_recycles(path):
    """The wall-clock times (seconds) of the recycles recorded in ``path``; [] without one."""
    if not path:
        return []
    try:
        with open(path) as state:
            lines = state.read().split()
    except FileNotFoundError:
        return []
    except OSError:
        logger.exception("memory watchdog: cannot read %s", path)
        return []
    times = []
    for line in lines:
        try:
            times.append(float(line))
        except ValueError:
            pass
    return times


class Watchdog:
    """The state of one client's watchdog; see the module docstring.

    ``health``: the client's :class:`~plonedeploy.runtime.probes.Health` (started, requests
    in the application); ``limit``: bytes; ``grace``, ``check_window``, ``drain_timeout``:
    seconds; ``max_restarts``: recycles per hour; ``peers``: metrics ``host:port`` of the
    other clients; ``address``: this client's (the tie-break); ``state_file``: where the
    recycles are recorded (None: in memory only); ``metrics``: an object with
    ``memory_restarts`` (counter), ``memory_blocked`` (gauge with a ``reason`` label) and
    ``memory_limit`` (gauge), or None.
    """

    def __init__(self, health, limit, grace=GRACE, max_restarts=MAX_RESTARTS, peers=(), address="",
                 state_file=None, check_window=CHECK_WINDOW, drain_timeout=DRAIN_TIMEOUT, metrics=None,
                 clock=time.monotonic, wall=time.time, read_rss=rss, ask=ask_readyz,
                 kill=lambda: os.kill(os.getpid(), signal.SIGTERM)):
        if limit < 1:
            raise ValueError(f"memory watchdog: limit = {limit!r} is invalid: expected bytes >= 1")
        if max_restarts < 0:
            raise ValueError(f"memory watchdog: max_restarts = {max_restarts!r} is invalid: expected >= 0")
        self.health, self.limit, self.grace = health, int(limit), float(grace)
        self.max_restarts, self.peers, self.address = int(max_restarts), sorted(peers), address
        self.state_file, self.check_window, self.drain_timeout = state_file, float(check_window), float(drain_timeout)
        self.metrics, self.clock, self.wall = metrics, clock, wall
        self.read_rss, self.ask, self.kill = read_rss, ask, kill
        self.state = IDLE
        self.blocked = None        # "backoff", "no_peer" or None
        self.over_since = None     # monotonic time RSS was first seen above the limit
        self.since = None          # monotonic time of the claim
        self.waiting = None        # why it last waited for a peer (logged once per reason)
        self.recycles = read_recycles(state_file)
        if metrics is not None:
            metrics.memory_limit.set(self.limit)
            # Monotonic across restarts: the process that counted a recycle dies before
            # Prometheus scrapes it, so each process starts from the recorded total.
            metrics.memory_restarts.inc(len(self.recycles))
            for reason in ("backoff", "no_peer"):
                metrics.memory_blocked.labels(reason).set(0)

    @property
    def recycling(self):
        """The ``/readyz`` text while claimed, draining or recycled (None: not recycling):
        kept in ``health.draining``, which makes ``/readyz`` answer 503 with it."""
        return self.health.draining

    @recycling.setter
    def recycling(self, text):
        self.health.draining = text

    # -- helpers -------------------------------------------------------------------------

    def recent(self):
        """Recycles in the last hour."""
        now = self.wall()
        return sum(1 for t in self.recycles if now - t < WINDOW)

    def _block(self, reason, text):
        if self.blocked != reason:
            logger.warning("memory watchdog: not recycling: %s", text)
            if self.metrics is not None:
                self.metrics.memory_blocked.labels(reason).set(1)
        self.blocked = reason

    def _unblock(self):
        if self.blocked is not None and self.metrics is not None:
            self.metrics.memory_blocked.labels(self.blocked).set(0)
        self.blocked = None

    def peers_ready(self, claiming):
        """``(True, "")`` when every peer answers 200; else ``(False, why)``. With
        ``claiming``: a peer that claims too and whose address sorts after this client's
        is ignored (it withdraws: the first address wins)."""
        for peer in self.peers:
            status, text = self.ask(peer)
            if status == 200:
                continue
            if claiming and text.startswith("recycling") and self.address < peer:
                continue
            return False, f"peer {peer} is not ready ({status}: {text})"
        return True, ""

    def withdraw(self, why):
        logger.info("memory watchdog: back in service, not recycling now: %s", why)
        self.state, self.recycling, self.since = IDLE, None, None

    # -- the step ------------------------------------------------------------------------

    def tick(self):
        """One look; returns the state after it."""
        now = self.clock()
        if self.state == IDLE:
            self._idle(now)
        elif self.state == CLAIMED:
            if now - self.since >= CLAIM_DELAY:
                ok, why = self.peers_ready(claiming=True)
                if ok:
                    self.state = DRAINING
                    logger.info("memory watchdog: draining: %s", self.recycling)
                else:
                    self.withdraw(why)
        elif self.state == DRAINING:
            self._drain(now)
        return self.state

    def _idle(self, now):
        if not self.health.started:
            return
        size = self.read_rss()
        if size <= self.limit:
            self.over_since = None
            self._unblock()
            return
        if self.over_since is None:
            self.over_since = now
        over = now - self.over_since
        if over < self.grace:
            return
        text = f"RSS {mib(size)} above memory-limit {mib(self.limit)} for {over:.0f} s"
        recent = self.recent()
        if recent >= self.max_restarts:
            self._block("backoff", f"{text}, and {recent} recycles in the last hour "
                                   f"(memory-limit-restarts {self.max_restarts}); serving on")
            return
        if not self.peers:
            self._block("no_peer", f"{text}, and no peer (memory-limit-peers) to take the traffic; serving on")
            return
        self._unblock()
        ok, why = self.peers_ready(claiming=False)
        if not ok:
            if why != self.waiting:
                logger.info("memory watchdog: %s; waiting: %s", text, why)
            self.waiting = why
            return
        if self.clock() - now > CLAIM_DELAY / 2:
            # A slow peer: another client may have claimed since the first answers; a claim
            # now might not be seen by its second look. Look again at the next tick.
            return
        self.waiting = None
        self.state, self.since = CLAIMED, now
        self.recycling = f"recycling: {text}"
        logger.info("memory watchdog: %s", self.recycling)

    def _drain(self, now):
        # Every look: a peer that stopped being ready (it crashed, or an operator's rolling
        # restart took it, which its /readyz does not show until it stops) puts this client
        # back at once, not only at the end of the drain.
        ok, why = self.peers_ready(claiming=False)  # strict: every peer answers 200 now
        if not ok:
            self.withdraw(why)
            return
        waited = now - self.since
        if waited < CLAIM_DELAY + self.check_window:
            return
        busy = self.health.in_flight()
        if busy and waited < CLAIM_DELAY + self.check_window + self.drain_timeout:
            return
        if busy:
            logger.warning("memory watchdog: %d requests still in the application after %.0f s; recycling anyway",
                           busy, self.drain_timeout)
        self.record()
        logger.warning("memory watchdog: %s; drained after %.0f s; recycling (%d of %d this hour): SIGTERM",
                       self.recycling, waited, self.recent(), self.max_restarts)
        self.state = RECYCLED  # /readyz stays 503 until the process has gone
        self.kill()

    def record(self):
        """Append this recycle to the state file and count it."""
        stamp = self.wall()
        self.recycles.append(stamp)
        if self.state_file:
            try:
                with open(self.state_file, "a") as state:
                    state.write(f"{stamp:.3f}\n")
            except OSError:
                logger.exception("memory watchdog: cannot write %s; the backoff forgets this recycle", self.state_file)
        if self.metrics is not None:
            self.metrics.memory_restarts.inc()

    def next_tick(self, interval=INTERVAL):
        """Seconds until the next look: ``interval``, ``CLAIM_DELAY`` after a claim, and
        ``DRAIN_INTERVAL`` while draining."""
        return {CLAIMED: min(interval, CLAIM_DELAY), DRAINING: min(interval, DRAIN_INTERVAL)}.get(self.state, interval)

    def run(self, stop=None, interval=INTERVAL):
        """Tick every ``interval`` seconds (:meth:`next_tick`) until ``stop`` (a
        threading.Event) is set."""
        stop = stop or threading.Event()
        while not stop.wait(self.next_tick(interval)):
            try:
                self.tick()
            except Exception:  # the watchdog must never take the client down by accident
                logger.exception("memory watchdog: tick failed")


def start(watchdog, interval=INTERVAL):
    """Run ``watchdog`` in a daemon thread of its own; returns the thread."""
    thread = threading.Thread(target=watchdog.run, kwargs={"interval": interval}, name="memory watchdog",
                              daemon=True)
    thread.start()
    return thread
