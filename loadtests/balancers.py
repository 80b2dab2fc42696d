"""Temporary HAProxys, one per balance mode, in front of the stack's running ZEO clients.

The deployed HAProxy's ``balance`` cannot be changed at runtime, so ``loadtests.abtest
--balance MODE,...`` starts, for each mode, a copy of the deployed configuration
(``parts/haproxy/haproxy.cfg``, rendered by plonedeploy.recipe:haproxy) that differs only
in four lines, each of which must appear exactly once:

- ``balance <algorithm>`` in the backend -> the mode;
- ``bind`` of ``frontend plone`` and of ``listen stats`` -> two other 127.0.0.1 ports;
- ``stats socket`` (the runtime API socket in var/run) -> removed, so the copy never
  replaces the deployed HAProxy's socket file; an HTTPS ``bind ... ssl`` line (``tls-bind``)
  and the cache tier's ``frontend cache_fill`` are removed too.

Everything else (servers, maxconn = threads, health checks, queue timeout, retries,
request limits, ``X-Served-By``) is the deployed file byte for byte. The copy is checked
with ``haproxy -c``, started in the foreground (``-db``) in its own session, and stopped
by its PID (SIGTERM, SIGKILL after a timeout).
"""
import os
import re
import signal
import socket
import subprocess
import time

import psutil

from loadtests import haproxy_stats

#: Balance modes the A/B comparison offers, in HAProxy 2.6 syntax.
#: Not offered: ``source`` (every Locust request comes from 127.0.0.1, so one server gets
#: all of them), ``uri``/``url_param``/``hdr()``/``hash`` (the four request shapes hash to
#: fixed servers: the share measures the traffic mix, not the servers), ``rdp-cookie``
#: (TCP/RDP only).
MODES = {
    "leastconn": "fewest active requests (ties: round robin); Apache's bybusyness",
    "roundrobin": "in turn, weight-aware, skips full servers",
    "static-rr": "in turn, fixed weights (like roundrobin with equal weights)",
    "first": "first server until its maxconn is reached, then the next",
    "random": "power of two choices: the less loaded of two random draws (= random(2))",
    "random(2)": "power of two choices, explicit",
    "random(1)": "one random draw (plain random)",
}


class BalancerError(Exception):
    """A temporary HAProxy could not be configured, validated or started; says why."""


def parse_modes(text):
    """Parse ``"leastconn,roundrobin"`` into ``["leastconn", "roundrobin"]`` (order kept).

    Raises ValueError naming ``--balance``, the bad item and the allowed values (also for
    an empty list or a mode named twice).
    """
    allowed = ", ".join(MODES)
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise ValueError(f"--balance is empty: expected one or more of {allowed}, comma-separated")
    for item in items:
        if item not in MODES:
            raise ValueError(
                f"--balance item {item!r} is invalid: expected one or more of {allowed}, "
                "comma-separated (source and uri hashing would send each Locust request "
                "shape to a fixed server; see docs/performance.md)"
            )
    if len(set(items)) != len(items):
        raise ValueError(f"--balance {text!r} names a mode twice")
    return items


def slug(mode):
    """Directory-safe name of a mode: ``random(2)`` -> ``random-2``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", mode).strip("-")


def _replace_once(text, pattern, replacement, what):
    new, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    if count != 1:
        raise BalancerError(f"expected exactly one {what} in the deployed HAProxy config, found {count}")
    return new


def derive_config(text, mode, frontend_port, stats_port):
    """Return the deployed config ``text`` rewritten for ``mode`` on the given ports.

    Raises BalancerError if one of the four rewritten lines is not found exactly once
    (the template changed: this function must follow it).
    """
    text = _replace_once(text, r"^(\s*)balance\s+\S+\s*$", rf"\g<1>balance {mode}", "'balance' line")
    text = _replace_once(
        text, r"^(frontend\s+plone\s*\n(?:[ \t]+.*\n|\s*\n)*?\s*bind\s+)\S+:\d+",
        rf"\g<1>127.0.0.1:{frontend_port}", "frontend 'bind' line")
    # The cache tier's fill listener (haproxy part option cache) is the deployed HAProxy's;
    # the copy's plain frontend never sends anything to the cache.
    text = re.sub(r"^frontend\s+cache_fill\s*\n(?:[ \t]+.*\n|[ \t]*\n)*",
                  "# frontend cache_fill: left out, the deployed HAProxy owns its listener\n\n",
                  text, flags=re.MULTILINE)
    text = _replace_once(
        text, r"^(listen\s+stats\s*\n(?:[ \t]+.*\n|\s*\n)*?\s*bind\s+)\S+:\d+",
        rf"\g<1>127.0.0.1:{stats_port}", "stats 'bind' line")
    # The HTTPS listener (tls-bind) is the deployed HAProxy's: the copy serves plain HTTP only.
    text = re.sub(r"^(\s*)bind (\S+) ssl .*$", r"\g<1># bind \2 ssl: left out, the deployed HAProxy owns it",
                  text, flags=re.MULTILINE)
    text = _replace_once(
        text, r"^(\s*)stats socket .*$",
        r"\g<1># stats socket: left out, the deployed HAProxy owns it", "'stats socket' line")
    return f"# Temporary copy for loadtests.abtest: balance {mode}.\n{text}"


def queue_waits(log_path, backend):
    """Count the requests of ``backend`` in an HAProxy ``option httplog`` log that queued.

    Returns ``(requests, queued)``: ``queued`` counts the log lines whose ``Tw`` (ms spent
    in HAProxy's queues) is above 0 or whose ``srv_queue``/``backend_queue`` position is
    above 0, i.e. requests that waited for a free ``maxconn`` slot instead of being sent
    at once to the server the balance algorithm chose. (HAProxy hands a queued request in
    the backend queue to whichever server frees a slot first.) Lines of other proxies
    (the stats page) are skipped.
    """
    line_re = re.compile(
        rf" {re.escape(backend)}/\S+ -?\d+/(-?\d+)/-?\d+/-?\d+/-?\d+ \d{{3}} \d+ \S+ \S+ \S+ "
        r"\d+/\d+/\d+/\d+/\+?\d+ (\d+)/(\d+) ")
    requests = queued = 0
    with open(log_path, encoding="utf-8", errors="replace") as fp:
        for line in fp:
            match = line_re.search(line)
            if match:
                requests += 1
                queued += int(match.group(1)) > 0 or int(match.group(2)) > 0 or int(match.group(3)) > 0
    return requests, queued


def port_free(port, host="127.0.0.1"):
    """True if nothing accepts TCP connections on host:port."""
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) != 0


class TemporaryBalancer:
    """One temporary HAProxy for ``mode``; use as a context manager (stops it by PID).

    ``binary`` and ``deployed_config`` are the deployed HAProxy's (stack.json's argv);
    ``directory`` receives ``haproxy.cfg`` and ``haproxy.log``; ``frontend_port`` and
    ``frontend_port + 1`` (stats) must be free. Attributes once started: ``pid``,
    ``process`` (psutil), ``frontend_url``, ``stats_url``.
    """

    def __init__(self, binary, deployed_config, mode, directory, frontend_port):
        self.binary, self.mode, self.directory = binary, mode, directory
        self.deployed_config = deployed_config
        self.frontend_port, self.stats_port = frontend_port, frontend_port + 1
        self.frontend_url = f"http://127.0.0.1:{self.frontend_port}"
        self.stats_url = f"http://127.0.0.1:{self.stats_port}/stats;csv"
        self.config_path = os.path.join(directory, "haproxy.cfg")
        self.log_path = os.path.join(directory, "haproxy.log")
        self.child = self.pid = self.process = None

    def config_text(self):
        """The config to run: the deployed one with this mode and these ports."""
        with open(self.deployed_config, encoding="utf-8") as fp:
            return derive_config(fp.read(), self.mode, self.frontend_port, self.stats_port)

    def write_config(self):
        """Write and ``haproxy -c`` :meth:`config_text`; raise BalancerError with HAProxy's message."""
        text = self.config_text()
        os.makedirs(self.directory, exist_ok=True)
        with open(self.config_path, "w", encoding="utf-8") as fp:
            fp.write(text)
        result = subprocess.run([self.binary, "-c", "-f", self.config_path],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BalancerError(f"haproxy -c rejected {self.config_path}:\n{result.stdout}{result.stderr}")

    def start(self, backend, servers, timeout=30.0):
        """Start HAProxy and wait until its stats show every server UP after a health check.

        Raises BalancerError (after stopping it) if a port is taken, HAProxy exits, or the
        servers are not UP within ``timeout`` seconds.
        """
        for port in (self.frontend_port, self.stats_port):
            if not port_free(port):
                raise BalancerError(f"127.0.0.1:{port} is in use: choose other ports with --balancer-port")
        self.write_config()
        with open(self.log_path, "ab") as log, open(os.devnull, "rb") as devnull:
            self.child = subprocess.Popen(
                [self.binary, "-db", "-f", self.config_path],
                stdin=devnull, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: a Ctrl-C of abtest is handled by abtest
            )
        self.pid = self.child.pid
        self.process = psutil.Process(self.pid)
        deadline = time.monotonic() + timeout
        states = {}
        while time.monotonic() < deadline:
            if self.child.poll() is not None:
                self.stop()
                raise BalancerError(f"temporary HAProxy ({self.mode}) exited with status "
                                    f"{self.child.returncode}; see {self.log_path}")
            try:
                rows = haproxy_stats.servers(haproxy_stats.fetch(self.stats_url, timeout=2.0), backend)
                # UP right after start is HAProxy's assumption; wait for a passed check.
                states = {n: (r["status"], r.get("check_status", "")) for n, r in rows.items()}
                if set(states) == set(servers) and all(
                        s == "UP" and c.startswith("L7OK") for s, c in states.values()):
                    return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise BalancerError(f"temporary HAProxy ({self.mode}): servers not UP after {timeout} s: "
                            f"{states or 'stats not answering'}")

    def stop(self, timeout=10.0):
        """SIGTERM the HAProxy (its process group), SIGKILL after ``timeout`` s; idempotent."""
        if self.child is None or self.child.poll() is not None:
            return
        try:
            os.killpg(self.pid, signal.SIGTERM)
            self.child.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.child.wait(10)
        except ProcessLookupError:
            self.child.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
