"""One short Locust run of the locustfile's shapes against one URL, as a figure row like a wrk
run's (:func:`loadtests.core.wrk.run_wrk`), for the tools whose other paths wrk measures:
wrk checks only status codes, and the logged-in shape needs a login, forms and checked
bodies, which the locustfile has.

Traffic goes only to the URL given (a client directly or HAProxy, on this machine).
"""
import json
import os
import subprocess
import sys
import tempfile

from loadtests.core.stack import EDITOR_PASSWORD_FILE, HERE
from loadtests.core.stats import histogram_percentile, merge_histograms


def row_of(per_server):
    """The figures of the locustfile's ``--per-server-stats`` JSON (after its warm-up), all
    servers and request names together: ``{"requests", "rps" (requests/s over its
    ``elapsed_s``), "mib_s" (MiB/s of bodies), "p50_ms", "p99_ms" (from the merged
    response-time histograms; None without requests), "errors" (Locust failures: a wrong
    status or a body that failed its check)}``."""
    totals = per_server.get("server_totals", {}).values()
    histogram = merge_histograms(entry.get("response_times", {}) for entry in totals)
    elapsed = per_server.get("elapsed_s") or 1.0
    requests = sum(e["num_requests"] for e in totals)
    p50, p99 = (histogram_percentile(histogram, q) for q in (0.50, 0.99))
    return {"requests": requests, "rps": round(requests / elapsed, 1),
            "mib_s": round(sum(e["total_bytes"] for e in totals) / elapsed / 2**20, 1),
            "p50_ms": p50, "p99_ms": p99, "errors": sum(e["num_failures"] for e in totals)}


def locust_command(url, weights, users, run_time, warmup, out):
    """The argv of one headless Locust process of the locustfile against ``url`` (``--host``):
    ``weights`` (its ``--weights``), ``users`` users all started at once, ``run_time`` whole
    seconds, its statistics after ``warmup`` seconds written to ``out`` (``--per-server-stats``),
    the editors' password file of the logged-in shape. One copy for the short runs here and the
    canary's load (:class:`BackgroundLocust`)."""
    return [sys.executable, "-m", "locust", "-f", os.path.join(HERE, "locustfile.py"), "--headless",
            "--only-summary", "--host", url, "--weights", weights, "--users", str(users),
            "--spawn-rate", str(users), "--run-time", f"{int(run_time)}s", "--stop-timeout", "10",
            "--warmup", str(warmup), "--per-server-stats", out, "--editor-password-file", EDITOR_PASSWORD_FILE,
            "--loglevel", "WARNING"]


def run_locust_shape(url, weights, users, duration, warmup=3.0, timeout=120):
    """Run the locustfile headless against ``url`` (``--host``) with ``weights`` (its
    ``--weights``), ``users`` users all started at once, for ``warmup`` + ``duration``
    seconds in one Locust process; return :func:`row_of` its statistics after the warm-up
    (which holds the logged-in shape's logins). The editors' password: $PLONEDEPLOY_EDITOR_PASSWORD
    or ``EDITOR_PASSWORD_FILE``. Raises RuntimeError with the tail of Locust's output when it
    exits with a status other than 0 (passed) or 1 (some requests failed: counted in
    ``errors``) or writes no statistics, or runs ``timeout`` seconds past its run time."""
    run_time = int(round(warmup + duration))
    with tempfile.TemporaryDirectory(prefix="plonedeploy-locust-") as directory:
        out = os.path.join(directory, "per_server.json")
        cmd = locust_command(url, weights, users, run_time, warmup, out)
        try:
            done = subprocess.run(cmd, cwd=directory, capture_output=True, text=True, timeout=run_time + timeout)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"Locust against {url} ran {timeout} s past its {run_time} s") from exc
        if done.returncode not in (0, 1) or not os.path.exists(out):
            raise RuntimeError(f"Locust against {url} exited with status {done.returncode}: "
                               f"{(done.stdout + done.stderr)[-2000:]}")
        with open(out, encoding="utf-8") as fp:
            return row_of(json.load(fp))


class BackgroundLocust:
    """The locustfile's shapes against ``url`` in a Locust process of their own while the caller
    does something else (the canary's deploys): :meth:`start`, then :meth:`stop` (SIGTERM:
    Locust's users finish their request, ``--stop-timeout`` 10 s, and the locustfile writes its
    statistics) returns :func:`row_of` them, every request counted (no warm-up). ``max_s``:
    Locust's own ``--run-time``, a bound in case the caller never stops it. ``directory``:
    where its statistics and output go (a temporary one by default, removed by :meth:`stop`)."""

    def __init__(self, url, weights, users, max_s=6 * 3600, directory=None):
        self.url, self.weights, self.users, self.max_s = url, weights, users, max_s
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="plonedeploy-locust-")
        self.directory = directory or self._tmp.name
        self.process = None

    def start(self):
        """Start Locust; returns self. OSError when it cannot be started."""
        out = os.path.join(self.directory, "per_server.json")
        self._output = open(os.path.join(self.directory, "locust.out"), "wb")
        self.process = subprocess.Popen(locust_command(self.url, self.weights, self.users, self.max_s, 0, out),
                                        cwd=self.directory, stdin=subprocess.DEVNULL, stdout=self._output,
                                        stderr=subprocess.STDOUT)
        return self

    def running(self):
        """True while the Locust process runs."""
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout=60):
        """Stop Locust (SIGTERM, then SIGKILL after ``timeout`` s) and return :func:`row_of` its
        statistics. Raises RuntimeError with the tail of its output when it exited with a status
        other than 0 or 1 (1: some requests failed, counted in ``errors``) or wrote none."""
        try:
            if self.process.poll() is None:
                self.process.terminate()
            try:
                status = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                status = self.process.wait()
            self._output.close()
            out = os.path.join(self.directory, "per_server.json")
            if status not in (0, 1) or not os.path.exists(out):
                with open(os.path.join(self.directory, "locust.out"), "rb") as fp:
                    tail = fp.read()[-2000:].decode("utf-8", "replace")
                raise RuntimeError(f"Locust against {self.url} exited with status {status}: {tail}")
            with open(out, encoding="utf-8") as fp:
                return row_of(json.load(fp))
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
