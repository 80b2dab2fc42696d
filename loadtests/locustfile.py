"""Locust load test of a Plone site behind HAProxy: five traffic shapes, checked bodies.

One ``FastHttpUser`` per traffic shape, each sending its request again as soon as the last
one finished (closed loop, no think time)::

    name        request                                      check (else a Locust failure)
    /           GET /               (Zope root)              200
    /Plone      GET /Plone          (classic page)           200, HTML with the site title
    @json       GET /Plone, Accept: application/json         200, JSON whose @id ends in /Plone
    blob 5MB    GET /Plone/blob-5mb/@@download/file          200, exactly 5,242,880 bytes

The fifth shape, ``logged-in`` (opt-in: weight 0 unless ``--weights`` names it), is an
editor of the site: simulated user number k logs in once as ``editor<k mod 10 + 1>``
(Plone's login form; scripts/create_site.py makes the users) and then sends in turn, each
answer checked (``loadtests/loggedin.py``; every page must carry the log-out link)::

    logged-in login form, login     GET /Plone/login, POST it (once per user)
    logged-in /Plone/view           GET the front page as a Member
    logged-in folder contents       GET /Plone/editing/@@folder_contents   (the listing's page)
    logged-in edit form             GET <its document>/edit                (save button, text, CSRF token)
    logged-in save                  POST that form, text changed; the redirect's page shows the new text

In ``--per-server-stats``' windows the three pages (front page, folder contents, edit form)
also count together as the path class ``logged-in`` (not the login, once per user, nor the
POSTs, which go through HAProxy's write lane to one client).

Its document is ``/Plone/editing/doc-<k mod 40 + 1>``: up to 40 users never save the same
document at once (numbered across Locust's worker processes). Each save stores a version of
the document (CMFEditions): the database grows with the saves.

Options added to Locust's own (``locust -f loadtests/locustfile.py --help``):

``--weights root=1,plone=1,json=1,blob=1``
    Relative number of users per shape (``root``, ``plone``, ``json``, ``blob``,
    ``logged-in``); 0 or unnamed leaves a shape out.
``--editor-password-file PATH`` (default ``var/editor-password``, relative to the
    working directory)
    The editors' password for the ``logged-in`` shape: ``$PLONEDEPLOY_EDITOR_PASSWORD`` if
    set, else this file's contents (scripts/create_site.py writes it, 0600). When neither
    is there, every login is a failure saying so.
``--per-server-stats PATH``
    At the end, write per-server statistics as JSON: responses are grouped by the
    ``X-Served-By`` header that HAProxy adds (``"-"`` when it is missing, e.g. a client
    tested directly). Shape: ``{"elapsed_s": seconds from test start to quit, "servers":
    {server: {request name: ENTRY}}, "server_totals": {server: ENTRY + "response_times"},
    "total": {request name: ENTRY}}`` with ENTRY ``{num_requests, num_failures, avg_ms,
    min_ms, max_ms, p50_ms, p95_ms, p99_ms, total_bytes}``; ``response_times`` is Locust's
    histogram of that server's requests over all paths (``{"<rounded ms>": count}``);
    times in milliseconds, sizes in bytes. Unlike Locust's ``--csv``
    (written when the run time is up), it includes requests that finish while the users
    stop, so it matches HAProxy's counters. With ``--processes`` (or ``--master`` and
    ``--worker``s) every worker sends its part with each stats report and the master
    merges and writes it; when the run time is up the master asks every worker to stop
    its users and send a last report, and waits for all of them (at most ``--stop-timeout``
    + 10 s) before it quits. ``"missing_final_reports"`` counts the workers whose last
    report did not come (0 when the counts are complete).
``--warmup S`` (seconds, default 0)
    Requests that finish in the first S seconds after the test started are left out of
    ``--per-server-stats`` (only counted in ``"warmup_requests": {server: count}``);
    ``elapsed_s`` then counts from the end of the warm-up (``warm_at``, epoch seconds). With ``--warm-mark PATH`` the
    file PATH is written when the warm-up is over, so that the caller can read HAProxy's
    counters at the same moment; it holds the end of the warm-up in epoch seconds, the
    instant the windows below start from (also when the file came late).
``--window S`` (seconds, default 5)
    ``--per-server-stats`` also gets ``"windows": [{"start_s": s, "servers": {server:
    {request name or "all": {"n", "failures", "p50_ms", "p99_ms"}}}}]``: the same requests cut
    into consecutive windows of S seconds after the warm-up (the last one may be shorter),
    the units over which loadtests.ab.abstats resamples.

Use the host ``http://127.0.0.1:8080`` (HAProxy) or a client directly (``:8081``);
traffic must stay on this machine.
"""
import itertools
import json
import logging
import os
import time
import uuid
from urllib.parse import urlencode, urlsplit

import gevent
from locust import FastHttpUser, constant, events, task
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner
from locust.stats import RequestStats, StatsEntry

# The shared parts, beside this file: Locust puts this file's folder on sys.path (and the
# loadgenerator role copies weights.py and loggedin.py beside it on the load generator hosts).
from loggedin import (CLASS_REQUESTS, EDIT_FOLDER, FRONT_PAGE, LOGGED_IN, LOGIN_BUTTON, LOGIN_FORM, REQUESTS,
                      SAVE_BUTTON, TEXT_FIELD, assignment, edit_form, edited_text, form_with, not_folder_contents,
                      not_logged_in, not_saved)
from weights import DEFAULT_WEIGHTS, SHAPE_NAMES, parse_weights

BLOB_SIZE = 5 * 1024 * 1024  # bytes; scripts/create_site.py makes the blob this size
SITE_PATH = "/Plone"
BLOB_PATH = "/Plone/blob-5mb/@@download/file"


class ClosedLoopUser(FastHttpUser):
    """Base of the shapes: next request as soon as the last one finished, HAProxy as host."""

    abstract = True
    wait_time = constant(0)
    host = "http://127.0.0.1:8080"

    def checked_get(self, path, name, problem=None, **kwargs):
        """GET ``path``; see :meth:`checked`."""
        return self.checked("GET", path, name, problem, **kwargs)

    def checked(self, method, path, name, problem=None, **kwargs):
        """Send ``method`` ``path`` (redirects followed), recorded in Locust's stats under
        ``name``; a failure there when the (last) status is not 200, or when
        ``problem(response)`` returns a reason (a str) for a 200. ``kwargs`` go to the client
        (headers, data). Returns the response when it passed, else None."""
        with self.client.request(method, path, name=name, catch_response=True, **kwargs) as resp:
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}")
            elif problem is not None and (reason := problem(resp)):
                resp.failure(reason)
            else:
                return resp
        return None


def _not_html(resp):
    return None if b"<html" in (resp.content or b"")[:2000].lower() else "not an HTML page"


def _not_the_site_as_json(resp):
    try:
        data = json.loads(resp.content)
    except ValueError:
        return "body is not JSON"
    if not str(data.get("@id", "")).endswith(SITE_PATH):
        return f"@id is {data.get('@id')!r}, not the site"
    return None


def _not_the_blob(resp):
    size = len(resp.content or b"")
    return None if size == BLOB_SIZE else f"{size} bytes, expected {BLOB_SIZE}"


class ZopeRootUser(ClosedLoopUser):
    """``/``: the Zope root page, the cheapest request (no Plone)."""

    @task
    def root(self):
        self.checked_get("/", "/")


class PloneSiteUser(ClosedLoopUser):
    """``/Plone``: the site's front page rendered by the classic UI."""

    @task
    def plone(self):
        self.checked_get(SITE_PATH, "/Plone", _not_html)


class JsonApiUser(ClosedLoopUser):
    """``@json``: the plone.restapi JSON of /Plone (content negotiation)."""

    @task
    def json_api(self):
        self.checked_get(SITE_PATH, "@json", _not_the_site_as_json, headers={"Accept": "application/json"})


class BlobUser(ClosedLoopUser):
    """``blob 5MB``: download of the 5 MiB File stored as a ZODB blob."""

    @task
    def blob(self):
        self.checked_get(BLOB_PATH, "blob 5MB", _not_the_blob)


def _page(resp):
    return (resp.content or b"").decode("utf-8", "replace")


def _local(url, default):
    """The path (and query) of a form's ``action`` URL: requests stay on the --host."""
    parts = urlsplit(url or default)
    return (parts.path or default) + (f"?{parts.query}" if parts.query else "")


#: This process's editors so far; with workers, the master's worker count (below) spreads
#: the numbers over the processes: worker i numbers i, i + n, i + 2n, ...
_editors = itertools.count()
_worker_count = [1]
_password = []  # [(password or None, reason it is missing)] once read
FORM_HEADERS = {"Content-Type": "application/x-www-form-urlencoded"}


def _editor_password(options):
    """``(password, None)`` or ``(None, reason)``: $PLONEDEPLOY_EDITOR_PASSWORD, else the
    file of --editor-password-file; read once per process."""
    if not _password:
        path = getattr(options, "editor_password_file", None) or "var/editor-password"
        found = os.environ.get("PLONEDEPLOY_EDITOR_PASSWORD")
        try:
            if not found:
                with open(path, encoding="utf-8") as fp:
                    found = fp.read().strip()
            _password.append((found, None) if found else (None, f"--editor-password-file {path} is empty"))
        except OSError as exc:
            _password.append((None, f"no editor password: $PLONEDEPLOY_EDITOR_PASSWORD unset and "
                                    f"--editor-password-file {path}: {exc.strerror} (run scripts/create_site.py)"))
    return _password[0]


class LoggedInUser(ClosedLoopUser):
    """``logged-in``: an editor who logs in once, then views, lists, opens the edit form
    of its own document and saves it (see the module docstring and loadtests/loggedin.py)."""

    #: Seconds to wait after a failed login before the next try (else a closed loop of
    #: failing logins).
    LOGIN_RETRY_S = 1.0

    def on_start(self):
        runner = self.environment.runner
        worker = runner.worker_index if isinstance(runner, WorkerRunner) and runner.worker_index >= 0 else 0
        self.user_id, self.document = assignment(worker + _worker_count[0] * next(_editors))
        self.logged_in = False

    def login(self):
        """Plone's login form: GET it, POST its fields with the user's name and password;
        the answer (after the redirect to the site) must be a logged-in page. True if so."""
        password, missing = _editor_password(self.environment.parsed_options)
        form = None
        with self.client.get(LOGIN_FORM, name=REQUESTS["login_form"], catch_response=True) as resp:
            if missing:
                resp.failure(missing)
            elif resp.status_code != 200:
                resp.failure(f"login form: status {resp.status_code}")
            elif (form := form_with(_page(resp), LOGIN_BUTTON)) is None:
                resp.failure(f"no login form (no button {LOGIN_BUTTON}) at {LOGIN_FORM}")
        if form is None:
            return False
        fields = form.submission(LOGIN_BUTTON, {"__ac_name": self.user_id, "__ac_password": password})
        return self.checked("POST", _local(form.action, LOGIN_FORM), REQUESTS["login"],
                            lambda r: not_logged_in(_page(r), self.user_id), data=urlencode(fields),
                            headers=FORM_HEADERS) is not None

    @task
    def edit(self):
        if not self.logged_in:
            self.logged_in = self.login()
            if not self.logged_in:
                gevent.sleep(self.LOGIN_RETRY_S)
                return
        user = self.user_id
        self.checked_get(FRONT_PAGE, REQUESTS["front"], lambda r: not_logged_in(_page(r), user))
        self.checked_get(f"{EDIT_FOLDER}/@@folder_contents", REQUESTS["contents"],
                         lambda r: not_folder_contents(_page(r), user))
        found = []

        def problem(resp):
            form, reason = edit_form(_page(resp), user)
            found.append(form)
            return reason
        if self.checked_get(f"{self.document}/edit", REQUESTS["edit"], problem) is None:
            return
        form, mark = found[0], uuid.uuid4().hex[:12]
        text = edited_text(form.value(TEXT_FIELD), user, mark)
        fields = form.submission(SAVE_BUTTON, {TEXT_FIELD: text})
        def saved(resp):
            reason = not_saved(_page(resp), user, mark)
            # Which client served the page after the save: another than the one that wrote may
            # not have seen the save yet (loggedin.STALE_PAGE).
            return reason and f"{reason} (page served by {resp.headers.get('X-Served-By') or '-'})"
        self.checked("POST", _local(form.action, f"{self.document}/edit"), REQUESTS["save"], saved,
                     data=urlencode(fields), headers=FORM_HEADERS)


SHAPES = {"root": ZopeRootUser, "plone": PloneSiteUser, "json": JsonApiUser, "blob": BlobUser,
          "logged-in": LoggedInUser}
assert tuple(SHAPES) == SHAPE_NAMES


@events.init_command_line_parser.add_listener
def _add_options(parser):
    parser.add_argument("--weights", default=DEFAULT_WEIGHTS,
                        help="users per traffic shape, e.g. root=1,plone=1,json=1,blob=1")
    parser.add_argument("--per-server-stats", default="",
                        help="write per-server (X-Served-By) stats as JSON to this path")
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="seconds after the start whose requests --per-server-stats leaves out")
    parser.add_argument("--warm-mark", default="",
                        help="write this file when the warm-up is over")
    parser.add_argument("--window", type=float, default=5.0,
                        help="seconds per time window in --per-server-stats")
    parser.add_argument("--editor-password-file", default="var/editor-password",
                        help="the editors' password for the logged-in shape ($PLONEDEPLOY_EDITOR_PASSWORD "
                        "overrides it); written by scripts/create_site.py")


class PerServerStats:
    """Locust's own RequestStats, one per server named in ``X-Served-By``."""

    def __init__(self, warmup_s=0.0, window_s=5.0):
        self.by_server = {}
        self.total = RequestStats()
        self.warmup_s, self.window_s = warmup_s, window_s
        self.warm_at = time.time() + warmup_s  # epoch seconds: end of the warm-up
        self.warmup_requests = {}
        self.windows = {}  # window index -> {server: RequestStats}
        self.missing_final_reports = 0  # workers (master side) whose last report did not come

    def record(self, request_type, name, response_time, response_length, response, exception):
        server = "-"
        headers = getattr(response, "headers", None)
        if headers is not None:
            server = headers.get("X-Served-By") or "-"
        since_warm = time.time() - self.warm_at
        if since_warm < 0:
            self.warmup_requests[server] = self.warmup_requests.get(server, 0) + 1
            return
        window = self.windows.setdefault(int(since_warm // self.window_s), {})
        for stats in (self.by_server.setdefault(server, RequestStats()), self.total,
                      window.setdefault(server, RequestStats())):
            stats.log_request(request_type, name, response_time, response_length or 0)
            if exception is not None:
                stats.log_error(request_type, name, exception)

    @staticmethod
    def _entry(entry):
        return {
            "num_requests": entry.num_requests,
            "num_failures": entry.num_failures,
            "avg_ms": entry.avg_response_time,
            "min_ms": entry.min_response_time or 0,
            "max_ms": entry.max_response_time,
            "p50_ms": entry.get_response_time_percentile(0.50),
            "p95_ms": entry.get_response_time_percentile(0.95),
            "p99_ms": entry.get_response_time_percentile(0.99),
            "total_bytes": entry.total_content_length,
        }

    @classmethod
    def _entries(cls, stats):
        return {name: cls._entry(entry) for (name, _method), entry in sorted(stats.entries.items())}

    @classmethod
    def _server_total(cls, stats):
        # All paths of one server, with Locust's response-time histogram (rounded ms ->
        # count) so that runs can be merged and their percentiles recomputed.
        out = cls._entry(stats.total)
        out["response_times"] = {str(ms): n for ms, n in sorted(stats.total.response_times.items())}
        return out

    @staticmethod
    def _window_entry(entry):
        return {"n": entry.num_requests, "failures": entry.num_failures,
                "p50_ms": entry.get_response_time_percentile(0.50),
                "p99_ms": entry.get_response_time_percentile(0.99)}

    @staticmethod
    def _named_entries(stats):
        """``[(name, StatsEntry)]`` of one window's server: each request name, the logged-in
        shape's pages (``loggedin.CLASS_REQUESTS``) together as its path class (the unit of
        the A/B's verdict), "all"."""
        entries = [(n, e) for (n, _m), e in sorted(stats.entries.items())]
        steps = [e for n, e in entries if n in LOGGED_IN_NAMES]
        if steps:
            merged = StatsEntry(stats, LOGGED_IN, "")
            for entry in steps:
                merged.extend(entry)
            entries.append((LOGGED_IN, merged))
        return entries + [("all", stats.total)]

    def _windows(self):
        return [{"start_s": index * self.window_s,
                 "servers": {server: {name: self._window_entry(e) for name, e in self._named_entries(stats)}
                             for server, stats in sorted(window.items())}}
                for index, window in sorted(self.windows.items())]

    def as_dict(self):
        return {
            "elapsed_s": max(time.time() - self.warm_at, 0.0),
            "warm_at": self.warm_at,
            "warmup_s": self.warmup_s,
            "window_s": self.window_s,
            "warmup_requests": dict(sorted(self.warmup_requests.items())),
            "windows": self._windows(),
            "servers": {server: self._entries(stats) for server, stats in sorted(self.by_server.items())},
            "server_totals": {server: self._server_total(stats)
                              for server, stats in sorted(self.by_server.items())},
            "total": self._entries(self.total),
            "missing_final_reports": self.missing_final_reports,
        }


    def drain(self):
        """This worker's statistics since the last call, serialized for the master (a
        ``report_to_master`` payload), and reset: ``{"warmup": {server: n}, "entries":
        [[window index or None, server, name, method, StatsEntry.serialize()]]}``."""
        entries = [[None, server, e.name, e.method, e.serialize()]
                   for server, stats in self.by_server.items() for e in stats.entries.values()]
        entries += [[index, server, e.name, e.method, e.serialize()]
                    for index, window in self.windows.items() for server, stats in window.items()
                    for e in stats.entries.values()]
        out = {"warmup": self.warmup_requests, "entries": entries}
        self.by_server, self.windows, self.warmup_requests = {}, {}, {}
        self.total = RequestStats()
        return out

    def merge(self, data):
        """Add a worker's :meth:`drain` payload (master side of ``--processes``)."""
        for server, n in data["warmup"].items():
            self.warmup_requests[server] = self.warmup_requests.get(server, 0) + n
        for index, server, name, method, serialized in data["entries"]:
            entry = StatsEntry.unserialize(serialized, RequestStats())
            targets = ([self.by_server.setdefault(server, RequestStats()), self.total] if index is None
                       else [self.windows.setdefault(index, {}).setdefault(server, RequestStats())])
            for stats in targets:
                stats.get(name, method).extend(entry)
                stats.total.extend(entry)


_per_server = PerServerStats()
LOGGED_IN_NAMES = frozenset(CLASS_REQUESTS)


@events.init.add_listener
def _configure(environment, **_kwargs):
    options = environment.parsed_options
    if options is None:
        return
    weights = parse_weights(options.weights)
    for name, cls in SHAPES.items():
        cls.weight = weights.get(name, 0)
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.register_message("plonedeploy_warm_at", _on_warm_at)
        environment.runner.register_message("plonedeploy_workers", _on_workers)
        environment.runner.register_message(STOP_AND_REPORT, _stop_and_report)
    # Locust refuses weight 0; a shape left out is simply not a user class of this run.
    environment.user_classes[:] = [c for c in environment.user_classes if c.weight > 0]


#: With workers: the master's end of the warm-up (epoch seconds), so that every worker
#: cuts at the same moment as the master's --warm-mark (a worker's own test_start comes a
#: few hundred ms later, which shifted hundreds of requests across the boundary).
_master_warm_at = []


def _on_workers(environment, msg, **_kwargs):
    _worker_count[:] = [max(int(msg.data), 1)]


def _on_warm_at(environment, msg, **_kwargs):
    _master_warm_at[:] = [msg.data]
    _per_server.warm_at = msg.data


@events.test_start.add_listener
def _reset(environment, **_kwargs):
    options = environment.parsed_options
    warmup = options.warmup if options else 0.0
    _per_server.__init__(warmup, options.window if options else 5.0)
    if isinstance(environment.runner, WorkerRunner) and _master_warm_at:
        _per_server.warm_at = _master_warm_at[0]
    if isinstance(environment.runner, MasterRunner):
        environment.runner.send_message("plonedeploy_warm_at", _per_server.warm_at)
        # Before the users start (the spawn messages follow): editors numbered apart.
        environment.runner.send_message("plonedeploy_workers", environment.runner.worker_count)
    if options and options.warm_mark and not isinstance(environment.runner, WorkerRunner):
        warm_at = _per_server.warm_at

        def mark():
            # The file says when the warm-up ended by the same clock value that cuts the
            # per-server windows, not when this greenlet woke up: on a busy machine the
            # wake-up can come seconds late, and the caller's HAProxy-log windows would
            # then start later than Locust's.
            gevent.sleep(max(warm_at - time.time(), 0.0))
            with open(options.warm_mark, "w", encoding="utf-8") as fp:
                fp.write(f"{warm_at}\n")
        gevent.spawn(mark)


@events.request.add_listener
def _on_request(request_type, name, response_time, response_length, response=None,
                exception=None, **_kwargs):
    _per_server.record(request_type, name, response_time, response_length, response, exception)


@events.report_to_master.add_listener
def _send_per_server(client_id, data, **_kwargs):
    # With --processes (or master and workers) each worker counts its own requests and
    # hands them over with every stats report; the master merges them (below).
    data["per_server"] = _per_server.drain()


@events.worker_report.add_listener
def _receive_per_server(client_id, data, **_kwargs):
    if "per_server" in data:
        _per_server.merge(data["per_server"])
    if data.get(FINAL_REPORT):
        _awaiting_final.discard(client_id)


# The last report of each worker. Locust's own end of a run (MasterRunner.quit) sends
# "quit" to the workers, sleeps a fixed 0.5 s "for the final stats report" and then kills
# the greenlet that receives messages; a worker sends that report only after its users
# have finished the request they were in (--stop-timeout), which on a busy machine (a
# 5 MiB blob at load average 4-11) takes longer: the report then arrived at a dead
# listener and every request since the worker's previous report (up to
# WORKER_REPORT_INTERVAL, 3 s, plus the stop) was missing from --per-server-stats (and
# from Locust's own stats) while HAProxy had counted it (7 against 24 on one server).
# So before Locust's quit, the master asks every worker to stop its users and report,
# and waits until each one has.
STOP_AND_REPORT = "plonedeploy_stop_and_report"
FINAL_REPORT = "plonedeploy_final"
#: Seconds the master waits for the last reports beyond --stop-timeout (the users' stop).
FINAL_REPORT_GRACE_S = 10.0
_awaiting_final = set()  # master: workers whose last report has not come yet
_written = []  # [True] once --per-server-stats is written (quitting)


def _stop_and_report(environment, msg, **_kwargs):
    """Worker: stop the users (each finishes its request, recorded as usual), then send a
    stats report marked as the last: Locust's own ``report_to_master`` payload (its
    stats, our per-server part, the user count), through its ordinary "stats" message."""
    runner = environment.runner
    runner.stop()
    data = {}
    environment.events.report_to_master.fire(client_id=runner.client_id, data=data)
    data[FINAL_REPORT] = True
    runner.send_message("stats", data)


@events.test_stopping.add_listener
def _collect_final_reports(environment, **_kwargs):
    runner = environment.runner
    # Only the master has workers' reports to wait for; and not when the stats were
    # written already (SIGTERM: Locust fires quitting before it stops the runner).
    if not isinstance(runner, MasterRunner) or _written:
        return
    _awaiting_final.clear()
    _awaiting_final.update(c.id for c in runner.clients.all if c.state != STATE_MISSING)
    runner.send_message(STOP_AND_REPORT)
    deadline = time.monotonic() + (environment.stop_timeout or 0) + FINAL_REPORT_GRACE_S
    # A worker that quit or went missing meanwhile will not report: stop waiting for it.
    while time.monotonic() < deadline and any(
            c in runner.clients and runner.clients[c].state != STATE_MISSING for c in _awaiting_final):
        gevent.sleep(0.05)
    _per_server.missing_final_reports = len(_awaiting_final)
    if _awaiting_final:
        logging.warning("no last stats report from %d worker(s) (%s): --per-server-stats misses their last "
                        "requests", len(_awaiting_final), ", ".join(sorted(_awaiting_final)))


@events.quitting.add_listener
def _write_per_server(environment, **_kwargs):
    path = environment.parsed_options and environment.parsed_options.per_server_stats
    if path and not isinstance(environment.runner, WorkerRunner):  # the master or a lone process writes
        with open(path, "w", encoding="utf-8") as fp:
            json.dump(_per_server.as_dict(), fp, indent=2, sort_keys=True)
        _written[:] = [True]
