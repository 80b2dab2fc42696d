"""One short Locust run of the locustfile's shapes against one URL, as a figure row like a wrk
run's (:func:`loadtests.core.wrk.run_wrk`), for the tools whose other paths wrk measures:
wrk checks only status codes, and the logged-in shape needs a login, forms and checked
bodies, which the locustfile has.

:func:`login_problem` checks that the site has the shape's editors (one login through Plone's
login form) before a tool builds or measures anything for it.

Traffic goes only to the URL given (a client directly or HAProxy, on this machine).
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlsplit

import requests

from loadtests.core.stack import EDITOR_PASSWORD_FILE, HERE, editor_password, editor_password_missing
from loadtests.core.stats import histogram_percentile, merge_histograms
from loadtests.loggedin import LOGIN_BUTTON, LOGIN_FORM, assignment, form_with, not_logged_in

#: Seconds between two looks for the locustfile's warm-up mark.
_POLL_S = 0.05


def row_of(per_server):
    """The figures of the locustfile's ``--per-server-stats`` JSON (after its warm-up), all
    servers and request names together: ``{"requests", "rps" (requests/s over its
    ``elapsed_s``), "mib_s" (MiB/s of bodies), "p50_ms", "p95_ms", "p99_ms" (from the merged
    response-time histograms; None without requests), "max_ms" (the slowest, rounded as
    Locust's histogram rounds), "errors" (Locust failures: a wrong status or a body that failed
    its check)}``."""
    totals = per_server.get("server_totals", {}).values()
    histogram = merge_histograms(entry.get("response_times", {}) for entry in totals)
    elapsed = per_server.get("elapsed_s") or 1.0
    count = sum(e["num_requests"] for e in totals)
    p50, p95, p99 = (histogram_percentile(histogram, q) for q in (0.50, 0.95, 0.99))
    return {"requests": count, "rps": round(count / elapsed, 1),
            "mib_s": round(sum(e["total_bytes"] for e in totals) / elapsed / 2**20, 1),
            "p50_ms": p50, "p95_ms": p95, "p99_ms": p99,
            "max_ms": max((ms for ms, n in histogram.items() if n), default=None),
            "errors": sum(e["num_failures"] for e in totals)}


def locust_command(url, weights, users, run_time, warmup, out, warm_mark=None):
    """The argv of one headless Locust process of the locustfile against ``url`` (``--host``):
    ``weights`` (its ``--weights``), ``users`` users all started at once, ``run_time`` whole
    seconds, its statistics after ``warmup`` seconds written to ``out`` (``--per-server-stats``),
    the editors' password file of the logged-in shape; with ``warm_mark`` a file path the
    locustfile creates when the warm-up is over (``--warm-mark``). One copy for the short runs
    here and the canary's load (:class:`BackgroundLocust`)."""
    return [sys.executable, "-m", "locust", "-f", os.path.join(HERE, "locustfile.py"), "--headless",
            "--only-summary", "--host", url, "--weights", weights, "--users", str(users),
            "--spawn-rate", str(users), "--run-time", f"{int(run_time)}s", "--stop-timeout", "10",
            "--warmup", str(warmup), *(["--warm-mark", warm_mark] if warm_mark else []),
            "--per-server-stats", out, "--editor-password-file", EDITOR_PASSWORD_FILE, "--loglevel", "WARNING"]


def run_locust_shape(url, weights, users, duration, warmup=3.0, timeout=120, on_warm=None):
    """Run the locustfile headless against ``url`` (``--host``) with ``weights`` (its
    ``--weights``), ``users`` users all started at once, for ``warmup`` + ``duration``
    seconds in one Locust process; return :func:`row_of` its statistics after the warm-up
    (which holds the logged-in shape's logins). The editors' password: $PLONEDEPLOY_EDITOR_PASSWORD
    or ``EDITOR_PASSWORD_FILE``. ``on_warm``: called with the Locust process's PID once the
    warm-up is over (the locustfile's ``--warm-mark``), so that a caller can start counting
    the servers' CPU at the moment the counted requests start (the matrix does).

    Raises RuntimeError with the tail of Locust's output when it exits with a status other
    than 0 (passed) or 1 (some requests failed: counted in ``errors``) or writes no
    statistics, or runs ``timeout`` seconds past its run time (it is killed then)."""
    run_time = int(round(warmup + duration))
    with tempfile.TemporaryDirectory(prefix="plonedeploy-locust-") as directory:
        out, mark = os.path.join(directory, "per_server.json"), os.path.join(directory, "warm")
        log = os.path.join(directory, "locust.log")
        cmd = locust_command(url, weights, users, run_time, warmup, out, warm_mark=mark)
        deadline = time.monotonic() + run_time + timeout
        with open(log, "w", encoding="utf-8") as output:
            proc = subprocess.Popen(cmd, cwd=directory, stdout=output, stderr=subprocess.STDOUT)
            warm = on_warm is None
            try:
                while proc.poll() is None:
                    if not warm and os.path.exists(mark):
                        warm = True
                        on_warm(proc.pid)
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"Locust against {url} ran {timeout} s past its {run_time} s")
                    time.sleep(_POLL_S)
            finally:
                if proc.poll() is None:  # the deadline passed, on_warm raised, or we were interrupted
                    proc.kill()
                    proc.wait()
        if not warm and proc.returncode in (0, 1):
            raise RuntimeError(f"Locust against {url} ended before its {warmup} s warm-up: {_tail(log)}")
        return _row_after(url, proc.returncode, out, log)


def _tail(path):
    """The last 2,000 characters of Locust's output in ``path``."""
    with open(path, "rb") as fp:
        return fp.read()[-2000:].decode("utf-8", "replace")


def _row_after(url, status, out, output):
    """:func:`row_of` the statistics a Locust run against ``url`` wrote to ``out``. Raises
    RuntimeError with the tail of its ``output`` file when it exited with a ``status`` other
    than 0 (passed) or 1 (some requests failed: counted in ``errors``) or wrote none."""
    if status not in (0, 1) or not os.path.exists(out):
        raise RuntimeError(f"Locust against {url} exited with status {status}: {_tail(output)}")
    with open(out, encoding="utf-8") as fp:
        return row_of(json.load(fp))


def login_problem(url, index=0, timeout=60):
    """Why simulated editor ``index`` (:func:`loadtests.loggedin.assignment`: ``editor1`` for 0)
    cannot log in at ``url`` (a client or HAProxy: Plone's login form, as the locustfile's
    editors log in), or None when it can. A site made without ``PLONEDEPLOY_EDITORS=on`` has
    no such user: the answer is the login form again, without the log-out link. Needs the
    editors' password (:func:`loadtests.core.stack.editor_password`); one login is one write
    (Plone records the login time)."""
    user_id, _ = assignment(index)
    password = editor_password()
    if not password:
        return editor_password_missing()
    session = requests.Session()
    try:
        page = session.get(url + LOGIN_FORM, timeout=timeout)
        if page.status_code != 200:
            return f"{url}{LOGIN_FORM} answered {page.status_code}"
        form = form_with(page.text, LOGIN_BUTTON)
        if form is None:
            return f"no login form (no button {LOGIN_BUTTON}) at {url}{LOGIN_FORM}"
        fields = form.submission(LOGIN_BUTTON, {"__ac_name": user_id, "__ac_password": password})
        # The form's action is an absolute URL of whoever rendered it: keep to ``url``.
        answer = session.post(url + (urlsplit(form.action).path or LOGIN_FORM), data=fields, timeout=timeout)
    except requests.RequestException as exc:
        return f"{url}: {exc}"
    if answer.status_code != 200:
        return f"the login of {user_id} at {url} answered {answer.status_code}"
    return not_logged_in(answer.text, user_id)


def editors_refused(url):
    """None when the shape's editors can log in at ``url`` (:func:`login_problem`), else the
    sentence a tool prints before it exits 2: why not, and the command that makes them."""
    problem = login_problem(url)
    return problem and (f"the editors cannot log in at {url} ({problem}); the site needs them: "
                        "PLONEDEPLOY_EDITORS=on make site")


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
            return _row_after(self.url, status, os.path.join(self.directory, "per_server.json"),
                              os.path.join(self.directory, "locust.out"))
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
