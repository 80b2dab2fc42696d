"""Temporary HAProxys in front of running ZEO clients: one per balance mode, A/B pair or
client count.

The deployed HAProxy's ``balance`` cannot be changed at runtime, so ``loadtests.ab.abtest
--balance MODE,...`` (and the A/B rounds, and ``scaling``) start a variant of it: the
recipe's template (haproxy/haproxy.cfg.j2) rendered with the variables the deployed one
was rendered with (``haproxy_context`` of stack.json, :func:`loadtests.core.stack.render_haproxy`)
and these changed:

- ``balance`` -> the mode;
- ``bind`` and ``stats_bind`` -> two other 127.0.0.1 ports;
- ``run_directory`` (the runtime API socket) -> a temporary directory of its own, so the
  variant never replaces the deployed HAProxy's socket file;
- no HTTPS listener and no cache tier (their listeners are the deployed HAProxy's);
- optionally ``servers`` (the A/B slot pair, scaling's 1..n clients) and any other variable.

Everything else (maxconn = threads, health checks, queue timeout, retries, request
limits, ``X-Served-By``) is what the deployed HAProxy runs. The variant is checked with
``haproxy -c``, started in the foreground (``-db``) in its own session, and stopped by its
PID (SIGTERM, SIGKILL after a timeout).
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import psutil

from loadtests.core import haproxy_stats
from loadtests.core.procs import free_local_port
from loadtests.core.stack import render_haproxy
from plonedeploy.recipe import tls

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
                "shape to a fixed server; see "
                "docs/explanation/ab-method.md#modes-offered-modes-left-out)"
            )
    if len(set(items)) != len(items):
        raise ValueError(f"--balance {text!r} names a mode twice")
    return items


def slug(mode):
    """Directory-safe name of a mode: ``random(2)`` -> ``random-2``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", mode).strip("-")


def port_free(port, host="127.0.0.1"):
    """True if nothing accepts TCP connections on host:port."""
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) != 0


def free_port_pair(attempts=20):
    """A port ``p`` of 127.0.0.1 with nothing on ``p`` and ``p + 1`` now (a TemporaryBalancer's
    frontend and stats ports), from the kernel's ephemeral ports. Raises BalancerError after
    ``attempts`` tries."""
    for _ in range(attempts):
        port = free_local_port()
        if port < 65535 and port_free(port + 1):
            return port
    raise BalancerError(f"no two free consecutive ports on 127.0.0.1 in {attempts} tries")


class TemporaryBalancer:
    """One temporary HAProxy for ``mode``; use as a context manager (stops it by PID).

    ``binary``: the haproxy binary; ``config``: the stack.json dict (or one of the same
    shape) whose ``haproxy_template`` and ``haproxy_context`` it renders (see the module
    docstring); ``directory`` receives ``haproxy.cfg`` (and ``extra.cfg``) and ``haproxy.log``;
    ``frontend_port`` and ``frontend_port + 1`` (stats) must be free; ``haproxy_options``:
    more options of the haproxy command line (``("-dS",)``: no kernel splicing);
    ``extra_config``: text of a second config file, written to ``directory/extra.cfg`` and
    passed as a second ``-f`` after ``haproxy.cfg`` (HAProxy merges sections of the same
    kind, so ``"global\n    nbthread 1\n"`` adds to the template's global section); ``changes``:
    further template variables to replace (``servers=[...]``, ``maxconn=...``). Attributes
    once started: ``pid``, ``process`` (psutil), ``frontend_url``, ``stats_url``,
    ``metrics_url`` (its Prometheus exporter, on the stats port).
    """

    def __init__(self, binary, config, mode, directory, frontend_port, haproxy_options=(), extra_config=None,
                 **changes):
        self.binary, self.config, self.mode, self.directory = binary, config, mode, directory
        self.haproxy_options, self.extra_config, self.changes = tuple(haproxy_options), extra_config, changes
        self.frontend_port, self.stats_port = frontend_port, frontend_port + 1
        self.frontend_url = f"http://127.0.0.1:{self.frontend_port}"
        self.stats_url = f"http://127.0.0.1:{self.stats_port}/stats;csv"
        self.metrics_url = f"http://127.0.0.1:{self.stats_port}/metrics"
        self.config_path = os.path.join(directory, "haproxy.cfg")
        self.extra_path = os.path.join(directory, "extra.cfg") if extra_config is not None else None
        self.log_path = os.path.join(directory, "haproxy.log")
        self.child = self.pid = self.process = None
        self.run_directory = None

    def config_text(self):
        """The config to run: the deployed one's variables with this mode, these ports, its
        own socket directory, no TLS and no cache tier, and ``changes``."""
        if self.run_directory is None:
            # The runtime API socket path must stay under 108 bytes: a short directory.
            self.run_directory = tempfile.mkdtemp(prefix="pd-lb-")
        part = self.config["haproxy_context"]["part"]
        return render_haproxy(self.config, **{
            "part": f"{part} (temporary copy for loadtests: balance {self.mode})",
            "balance": self.mode,
            "bind": self.frontend_url.split("//")[1],
            "stats_bind": f"127.0.0.1:{self.stats_port}",
            "run_directory": self.run_directory,
            **tls.template_context("", "", False, 0),
            "cache_server": "", "cache_fill_bind": "",
            **self.changes})

    def config_files(self):
        """The haproxy options naming the config files: ``["-f", haproxy.cfg]``, then ``["-f",
        extra.cfg]`` with ``extra_config``."""
        return ["-f", self.config_path] + (["-f", self.extra_path] if self.extra_path else [])

    def write_config(self):
        """Write :meth:`config_text` (and ``extra_config``) and check both with ``haproxy -c``;
        raise BalancerError with HAProxy's message."""
        text = self.config_text()
        os.makedirs(self.directory, exist_ok=True)
        with open(self.config_path, "w", encoding="utf-8") as fp:
            fp.write(text)
        if self.extra_path:
            with open(self.extra_path, "w", encoding="utf-8") as fp:
                fp.write(self.extra_config)
        result = subprocess.run([self.binary, "-c", *self.config_files()],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            files = " + ".join(self.config_files()[1::2])
            raise BalancerError(f"haproxy -c rejected {files}:\n{result.stdout}{result.stderr}")

    def start(self, backend, servers, timeout=30.0):
        """Start HAProxy and wait until its stats show every server UP after a health check.

        Raises BalancerError (after stopping it) if a port is taken, HAProxy exits, or the
        servers are not UP within ``timeout`` seconds.
        """
        for port in (self.frontend_port, self.stats_port):
            if not port_free(port):
                raise BalancerError(f"127.0.0.1:{port} is in use: choose other ports with --balancer-port")
        try:
            self.write_config()
        except BalancerError:
            self.stop()  # removes the socket directory config_text made
            raise
        with open(self.log_path, "ab") as log, open(os.devnull, "rb") as devnull:
            self.child = subprocess.Popen(
                [self.binary, "-db", *self.haproxy_options, *self.config_files()],
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
        """SIGTERM the HAProxy (its process group), SIGKILL after ``timeout`` s, and remove
        its socket directory; idempotent."""
        try:
            if self.child is not None and self.child.poll() is None:
                try:
                    os.killpg(self.pid, signal.SIGTERM)
                    self.child.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(self.pid, signal.SIGKILL)
                    self.child.wait(10)
                except ProcessLookupError:
                    self.child.wait(10)
        finally:
            if self.run_directory:
                shutil.rmtree(self.run_directory, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
