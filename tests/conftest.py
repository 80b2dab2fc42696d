"""Shared fixtures: paths of this checkout, and the running stack for integration tests."""
import atexit
import functools
import json
import os
import re
import shutil
import socket
import signal
import subprocess
import tempfile
import time
from urllib.parse import urlsplit

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The one [buildout] header of builds that stand alone, and their runner. loadtests is the
# checkout's (pytest.ini: pythonpath); plonedeploy.* are installed in .venv (Makefile's venv).
from loadtests.core.extrabuild import build, checkout_header

STACK_JSON = os.path.join(ROOT, "parts", "stack", "stack.json")
STACK = os.path.join(ROOT, "bin", "stack")


@functools.cache
def develop_eggs():
    """Path of a develop-eggs directory holding this checkout's two develop eggs
    (plonedeploy.recipe and plonedeploy.runtime, editable: their ``src`` directories), made
    by one bin/buildout the first time a test asks and removed when the session ends.

    The tests' buildout configs name it as ``develop-eggs-directory`` instead of listing
    ``develop =``: buildout re-runs pip's editable install of every develop egg on every
    run, which was ~8 of a test buildout's ~10 s (measured 20 s vs 2.6 s for the same bad
    option under load), and the suite runs about a hundred such buildouts.
    Raises RuntimeError (loadtests.core.extrabuild.build's, with the tails of buildout's output)
    if that buildout fails.
    """
    directory = tempfile.mkdtemp(prefix="plonedeploy-develop-eggs-")
    atexit.register(shutil.rmtree, directory, True)
    build(directory, checkout_header(os.path.join(ROOT, "versions.cfg"), []), label="develop eggs", timeout=300)
    return os.path.join(directory, "develop-eggs")


#: ``{fixture name: seconds}``: fixtures whose setup takes minutes (the stack, a buildout, the
#: Ansible converge), registered by ``setup_budget``. See ``pytest_runtest_protocol``.
SETUP_BUDGET = {}
#: Names of SETUP_BUDGET's fixtures set up now (added at setup, removed after teardown).
_SET_UP = set()


def setup_budget(seconds):
    """Register the fixture below (put it under ``@pytest.fixture``) as one whose setup takes
    long: the test that sets it up gets ``seconds`` more than its timeout (pytest.ini's
    ``timeout``, or its ``@pytest.mark.timeout``); the tests that find it set up do not.
    With ``timeout_method = signal`` a test's timeout covers its fixtures' setup too.
    Give about 6x the setup's time on a quiet machine (a busy one takes 3-6x as long)."""
    def register(function):
        SETUP_BUDGET[function.__name__] = seconds
        return function
    return register


def default_timeout(config):
    """pytest-timeout's default seconds per test: ``--timeout``, else ``PYTEST_TIMEOUT``, else
    pytest.ini's ``timeout`` (0: no timeout)."""
    for value in (config.getoption("timeout"), os.environ.get("PYTEST_TIMEOUT"), config.getini("timeout")):
        if value not in (None, ""):
            return float(value)
    return 0.0


def configured_timeout(item):
    """The seconds pytest-timeout gives ``item``: its ``timeout`` marker, else the default."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        return float(marker.kwargs.get("timeout", marker.args[0] if marker.args else 0) or 0)
    return default_timeout(item.config)


def pending_budget(fixturenames, set_up=None):
    """Seconds of SETUP_BUDGET for those of ``fixturenames`` not set up yet."""
    set_up = _SET_UP if set_up is None else set_up
    return sum(SETUP_BUDGET[name] for name in set(fixturenames) if name in SETUP_BUDGET and name not in set_up)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Before pytest-timeout arms its timer (its own wrapper of this hook runs inside this
    one): a test that will set up fixtures of SETUP_BUDGET gets their budgets on top of its
    timeout, as a ``timeout`` marker of its own. No timeout (0) stays none."""
    extra = pending_budget(getattr(item, "fixturenames", ()))
    timeout = configured_timeout(item)
    if extra and timeout > 0:
        item.add_marker(pytest.mark.timeout(timeout + extra), append=False)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.argname in SETUP_BUDGET:
        _SET_UP.add(fixturedef.argname)  # a failed setup is cached too: the next test fails at once
    return (yield)


def pytest_fixture_post_finalizer(fixturedef, request):
    _SET_UP.discard(fixturedef.argname)


#: create_site.py's environment for the logged-in load test's editors and documents (as
#: ``PLONEDEPLOY_EDITORS=on make site`` makes them). Not the stack fixture's, which makes the
#: site as ``make start`` does: test_loggedin adds them (its module fixture ``editors``).
SITE_ENV = dict(os.environ, PLONEDEPLOY_EDITORS="on")


def run(cmd, timeout, check=True, cwd_override=None, **kwargs):
    """Run ``cmd`` in the checkout (or ``cwd_override``); return CompletedProcess (text).

    Fails the test with the command's output when it exits non-zero and ``check`` is true.
    """
    result = subprocess.run(cmd, cwd=cwd_override or ROOT, capture_output=True, text=True,
                            timeout=timeout, check=False, **kwargs)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def boundary(users, requests, duration):
    """Requests Locust and HAProxy may count differently where Locust starts or stops counting
    (the end of the warm-up, the end of the run): one in
    flight per user, plus what was sent between the end of the warm-up and the stats read
    (the Locust master writes the mark late when the machine is busy): 5 % of the requests
    or 1.5 s of the run's rate (``requests / duration``, requests per second), whichever
    is more. Measured: 4-13 of 400-650 at load average 7; 16 of 65 (6 s at 11 requests/s,
    i.e. 1.5 s) at load average 9. A warm-up not cut at all would differ by all of its
    seconds (3-4 s here) at the same rate."""
    return users + max(0.05 * requests, 1.5 * requests / duration)


def while_loaded(url, action, threads=4, send=None, expect=200, log=None, rate=None):
    """Run ``action()`` while ``threads`` closed loops send requests to ``url`` (e.g. GETs
    of HAProxy's ``/Plone/@@ok``), each loop with a keep-alive session and a 30 s timeout.

    ``send(session, url, number)``: the request of one loop turn, returning its
    ``requests.Response`` (default: a GET of ``url``); ``number`` counts the requests of all
    loops from 0, unique (e.g. the id of a document to POST). A request fails when its
    status is not ``expect`` or it raises a requests exception. ``log``: a list to which
    every request appends ``(number, started, finished, ok)`` (``time.monotonic()`` seconds)
    as it ends, readable while ``action`` runs. ``rate``: requests per second per loop at
    most (default None: as fast as the answers come). Unpaced loops take both cores of a
    2-core machine, which then runs the ``action`` (a playbook, a build) at a third of its
    speed; a paced loop still sends a request every 1/``rate`` s through every restart step.

    Returns ``(action's result, its seconds, requests done, failures)``; a failure is the
    status or the requests exception's repr.
    """
    import itertools
    import threading
    import time

    import requests

    failures, done, stop, numbers = [], [0], threading.Event(), itertools.count()
    if send is None:
        def send(session, url, number):
            return session.get(url, timeout=30)

    def load():
        session = requests.Session()
        due = time.monotonic()
        while not stop.is_set():
            if rate:
                due += 1.0 / rate
                if stop.wait(max(0.0, due - time.monotonic())):
                    break
            number, started = next(numbers), time.monotonic()
            try:
                status = send(session, url, number).status_code
                if status != expect:
                    failures.append(status)
            except requests.RequestException as exc:
                status = repr(exc)
                failures.append(status)
            done[0] += 1
            if log is not None:
                log.append((number, started, time.monotonic(), status == expect))

    workers = [threading.Thread(target=load) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        started = time.monotonic()
        result = action()
        seconds = time.monotonic() - started
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
    return result, seconds, done[0], failures


#: Requests per second per loop (while_loaded's ``rate``) of the load under which the rolling
#: restarts are tested: enough that every drain and restart step sees requests (a loop sends
#: one every 0.1 s), little enough to leave the CPU to the restarting clients. 25-50/s per
#: loop (2-8 loops) kept a 2-core CI machine saturated for the length of each restart test.
RESTART_LOAD_RATE = 10


def _successful_ends(log):
    return sorted(finished for _, _, finished, ok in log if ok)


def _longest_gap_of(ends):
    return max((b - a for a, b in zip(ends, ends[1:])), default=float("inf"))


def longest_gap(log):
    """The longest time (s) between the ends of two successive successful requests of
    ``log`` (while_loaded's): how long nothing got through; inf with fewer than two."""
    return _longest_gap_of(_successful_ends(log))


def assert_loaded_throughout(log, seconds, gap=30.0):
    """Fail unless the load of a while_loaded run (its ``log``) went on for the whole
    ``seconds`` of its action: successful requests finished over at least 90 % of them, never
    ``gap`` seconds apart. Not a rate: a rate says more about the machine (20 requests/s held
    on a quiet one, 9/s at load average 9) than about the load."""
    ends = _successful_ends(log)
    assert len(ends) >= 2 and ends[-1] - ends[0] > 0.9 * seconds, (len(ends), seconds)
    longest = _longest_gap_of(ends)
    assert longest < gap, (longest, seconds)


def give_to_service_user(stack, directory):
    """Hand ``directory`` (where a test wrote its copy of one of the stack's ZEO clients:
    wsgi.ini, zope.conf, logs) to the stack's service user when root runs the tests: the
    copy's script drops to that user (plonedeploy.runtime.access.become), which must read
    those files and write its logs there, while pytest makes ``tmp_path`` 0700 under a
    0700 /tmp/pytest-of-root. The user gets search permission on the way and owns the
    directory's tree. Does nothing when not root or without a service user. Returns the
    user's name, or "" when it did nothing."""
    import pwd

    from loadtests.core.stack import service_user
    from plonedeploy.runtime import access

    user = service_user(stack.config)
    if not user or os.geteuid() != 0:
        return ""
    entry = pwd.getpwnam(user)
    access.own(entry.pw_uid, entry.pw_gid, directories=[str(directory)])  # first: grant_search checks it reads it
    access.grant_search(user, [str(directory)], "a test's copy of a ZEO client runs as it", lambda line: None)
    return user


def stop_group(proc, timeout=60):
    """Stop ``proc`` (a Popen started with ``start_new_session=True``) and its process group:
    SIGTERM, then SIGKILL after ``timeout`` seconds. Returns True if SIGKILL was needed."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    try:
        proc.wait(timeout)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        return True


def admin_auth():
    """``("admin", password)`` of this checkout's Zope admin (var/admin-password, written
    0600 by scripts/create_site.py; never printed). OSError when the site was never made."""
    with open(os.path.join(ROOT, "var", "admin-password"), encoding="utf-8") as fp:
        return "admin", fp.read().strip()


def admin_session():
    """A ``requests.Session`` authenticated as this checkout's Zope admin (``admin_auth``),
    asking for JSON (plone.restapi). OSError when the site was never made."""
    import requests

    session = requests.Session()
    session.auth = admin_auth()
    session.headers["Accept"] = "application/json"
    return session


def port_taken(port, host="127.0.0.1"):
    """True if something accepts TCP connections on host:port."""
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) == 0


def log_sizes(names):
    """``{path: size in bytes now}`` of ``var/log/<name>.log`` for each of ``names`` (an
    event log is named after its client part; HAProxy's is ``haproxy.stdout``) that exists."""
    paths = [os.path.join(ROOT, "var", "log", f"{name}.log") for name in names]
    return {path: os.path.getsize(path) for path in paths if os.path.exists(path)}


def appended(path, offset):
    """The text appended to the log ``path`` since it had ``offset`` bytes (str)."""
    with open(path, encoding="utf-8", errors="replace") as fp:
        fp.seek(offset)
        return fp.read()


def new_lines(sizes):
    """The lines appended to each log of ``sizes`` (:func:`log_sizes`) since it was measured."""
    for path, offset in sizes.items():
        yield from appended(path, offset).splitlines(keepends=True)


#: HAProxy's log line (option httplog) of a 5xx answer: the status after the timers Tq/Tw/Tc/Tr/Ta.
_HAPROXY_5XX = re.compile(r" -?\d+/-?\d+/-?\d+/-?\d+/\+?-?\d+ 5\d\d ")
#: Zope's event log: every entry starts with its date, "2026-11-28 17:15:51,123 ERROR [...".
_EVENT_ENTRY = re.compile(r"^(?=\d{4}-\d\d-\d\d )", re.M)
_EVENT_ERROR = re.compile(r"\S+ \S+ (ERROR|CRITICAL) ")


def errors_since(sizes, limit=8000):
    """The errors logged since ``sizes`` (:func:`log_sizes` of HAProxy's log and event logs):
    HAProxy's lines of a 5xx answer, and each event log's ERROR and CRITICAL entries with
    their tracebacks. One str, its last ``limit`` characters, for a failing assertion's
    message: a CI run keeps no logs, so a 500 is explained only if the message says why."""
    found = []
    for path, offset in sizes.items():
        text, name = appended(path, offset), os.path.basename(path)
        if name == "haproxy.stdout.log":
            found += [f"{name}: {line}" for line in text.splitlines() if _HAPROXY_5XX.search(line)]
        else:
            found += [f"{name}: {entry}" for entry in _EVENT_ENTRY.split(text) if _EVENT_ERROR.match(entry)]
    return "\n".join(found)[-limit:] or "no 5xx in HAProxy's log, no error in the event logs"


class Stack:
    """The stack described by this checkout's ``parts/stack/stack.json`` (``make build``).

    Ports come from the build (buildout.cfg's [ports], or a local.cfg that overrides them),
    so a second checkout built on other ports runs the same tests without a clash.
    """

    def __init__(self, path=STACK_JSON):
        self.config = json.load(open(path))
        self.frontend_url = self.config["frontend_url"]
        self.stats_url = self.config["stats_url"]
        self.backend = self.config["backend"]
        self.kinds = self.config["server_kinds"]          # {client part: wsgi server}
        self.client_urls = {}                              # {client part: base URL}
        self.ports = {}                                    # {process or "stats": port}
        for proc in self.config["processes"]:
            ready = proc["ready"]
            if "tcp" in ready:
                self.ports[proc["name"]] = ready["tcp"][1]
            elif proc["name"] in self.kinds:
                self.client_urls[proc["name"]] = ready["http"].rstrip("/")
                self.ports[proc["name"]] = urlsplit(ready["http"]).port
        self.ports["haproxy"] = urlsplit(self.frontend_url).port
        if self.config.get("cache"):
            self.ports["varnish"] = urlsplit(self.config["cache"]["url"]).port
        self.ports["stats"] = urlsplit(self.stats_url).port

    @property
    def bases(self):
        """``{label: base URL}``: each client directly, then HAProxy."""
        bases = {f"{name} ({self.kinds[name]})": self.client_urls[name] for name in self.config["servers"]}
        bases["haproxy"] = self.frontend_url
        return bases

    def pids(self):
        """``{process name: PID}`` of the processes that run now (the stack's supervisord says)."""
        from plonedeploy.stack.supervisor import running_pids

        return running_pids(self.config)

    def states(self):
        """``{server: HAProxy status}`` of the backend (plus "BACKEND")."""
        from loadtests.core import haproxy_stats
        rows = haproxy_stats.fetch(self.stats_url)
        return {r["svname"]: r["status"] for r in rows if r["pxname"] == self.backend}

    def server_states(self):
        """``{client: HAProxy status}`` of every ZEO client HAProxy balances, the page pool's
        and the upload lane's (plonedeploy.stack.balancer.server_states); raises OSError
        when the stats page does not answer."""
        from plonedeploy.stack.balancer import server_states

        return server_states(self.config, timeout=5)

    def all_up(self):
        """True when HAProxy has every ZEO client UP (:meth:`server_states`)."""
        return set(self.server_states().values()) == {"UP"}


def wait_for(condition, timeout, what, interval=0.2, detail=None):
    """Poll ``condition()`` every ``interval`` seconds; return the seconds it took (a float);
    fail the test (AssertionError naming ``what``, and ``detail()``'s answer when given: the
    state that kept the condition false) after ``timeout`` seconds."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started >= timeout:
            raise AssertionError(f"{what}: not within {timeout} s" + (f"; {detail()}" if detail else ""))
        time.sleep(interval)
    return time.monotonic() - started


@pytest.fixture(scope="session")
@setup_budget(600)  # bin/stack start + the site + wait-up: ~45 s quiet (README); its calls allow 300+600+180 s
def stack():
    """Start the built stack once for all integration tests, create the site, stop it by PID.

    Refuses to run when one of the stack's ports is taken (another stack runs).
    """
    if not os.path.exists(STACK) or not os.path.exists(STACK_JSON):
        pytest.fail("bin/stack missing: run 'make build' first")
    described = Stack()
    taken = {name: port for name, port in described.ports.items() if port_taken(port)}
    if taken:
        pytest.fail(f"ports in use: {taken}; stop the running stack ('make stop') first")
    try:
        run([STACK, "start", "--no-wait-up"], timeout=300)
        first = run([os.path.join(ROOT, "bin", "instance"), "run", "scripts/create_site.py"], timeout=600)
        assert "site ready" in first.stdout
        run([STACK, "wait-up", "--timeout", "120"], timeout=180)
        yield described
    finally:
        run([STACK, "stop"], timeout=120, check=False)


#: Modules whose tests use neither the stack's ports (8xxx) nor the stack: with pytest-xdist
#: they run in the "deploy" group, beside the "stack" group (see ``xdist_group``).
DEPLOY_MODULES = {"test_ansible.py", "test_relstorage.py", "test_recipe_buildout.py", "test_client_imports.py"}


def xdist_group(item):
    """The pytest-xdist group of ``item`` (``make test`` runs ``pytest -n 2 --dist loadgroup``:
    each group runs on one worker, in collection order, beside the other group):

    - ``"deploy"``: the Ansible converge (ports 18xxx, 16081; ``deployed``), the RelStorage
      build (ports 9650-9663) and the recipe's buildouts (render only) -- the tests of
      DEPLOY_MODULES and any test that reads ``deployed``;
    - ``"stack"``: everything else, above all every test of the buildout stack (``stack``,
      ports 8xxx) and of the servers' build (``servers_build``: ZEO clients of that stack),
      so that one stack and one servers' build serve them all, as in a serial run.

    One group per worker keeps each session fixture set up once (xdist's workers are
    sessions of their own) and puts the two longest chains of the suite side by side.
    """
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & {"stack", "servers_build"}:
        return "stack"
    if "deployed" in fixtures or item.path.name in DEPLOY_MODULES:
        return "deploy"
    return "stack"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """Run tests marked ``stack_last`` (they stop the stack) after every other test, and give
    every test its xdist group (``xdist_group``; without ``-n`` the marker does nothing).

    ``tryfirst``: pytest-xdist's worker reads the ``xdist_group`` markers in its own
    ``pytest_collection_modifyitems`` (it appends ``@<group>`` to each node id); run after it,
    the markers came too late and ``--dist loadgroup`` spread the groups over both workers,
    where two stacks collided on one set of ports."""
    items.sort(key=lambda item: item.get_closest_marker("stack_last") is not None)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))


#: The markers docs/how-to/testing.md counts tests by (pytest.ini's, but the xdist groups').
SUITE_MARKERS = ("buildout", "ansible", "integration", "stack_last")
#: The items of this session's collection (``pytest_collection_finish``): under pytest-xdist
#: every worker collects the whole selection, so a test can count the suite from here.
COLLECTED = []
#: The collected tests that ``-k``, ``-m`` or ``--deselect`` left out of COLLECTED
#: (``pytest_deselected``).
DESELECTED = []


def marker_counts(items):
    """``{"total": n, "none": n, "<marker>": n, ...}``: tests per SUITE_MARKERS marker (a test
    with two is counted under each) and without any of them ("none")."""
    counts = {"total": len(items), "none": 0, **dict.fromkeys(SUITE_MARKERS, 0)}
    for item in items:
        names = {mark.name for mark in item.iter_markers()} & set(SUITE_MARKERS)
        for name in names or {"none"}:
            counts[name] += 1
    return counts


def pytest_deselected(items):
    DESELECTED.extend(items)


def pytest_collection_finish(session):
    """Keep the collected items (``COLLECTED``); with PLONEDEPLOY_MARKER_COUNTS set, also write
    ``marker_counts`` of them as JSON to that path (tests/test_doc_figures.py's collection of
    the whole suite when its own session holds only a part)."""
    COLLECTED[:] = session.items
    path = os.environ.get("PLONEDEPLOY_MARKER_COUNTS")
    if path:
        with open(path, "w", encoding="utf-8") as fp:
            json.dump(marker_counts(session.items), fp)


def pytest_xdist_node_collection_finished(node, ids):
    """Under ``--dist loadgroup``, stop before any test runs unless every node id a worker
    collected carries its group (``...@stack``/``...@deploy``, appended by xdist's worker).

    Without the suffix xdist spreads one group over both workers, two ``stack`` fixtures start
    on one set of ports and some 90 tests error ("ports in use"): what pytest 9.2.0 did
    silently (pytest-xdist issue #1386: it ignores the node id xdist rewrites; pytest is pinned
    to 9.1.1 in requirements.txt for that reason).
    """
    if node.config.getoption("dist") != "loadgroup":
        return
    ungrouped = [nodeid for nodeid in ids if not nodeid.endswith(("@stack", "@deploy"))]  # xdist_group's
    if ungrouped:
        pytest.exit(f"--dist loadgroup did not group {len(ungrouped)} of {len(ids)} tests on {node.gateway.id} "
                    f"(first: {ungrouped[0]}); see pytest-xdist #1386 and requirements.txt's pytest pin",
                    returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture(scope="session")
@setup_budget(600)  # one bin/buildout of every server, the first one downloads eggs: serverbuild.build allows 600 s
def servers_build(tmp_path_factory):
    """A buildout (loadtests/matrix/serverbuild.py) with one ZEO client part ``c_<server>`` per server.

    Built once per session for tests/test_recipe_buildout.py and tests/test_servers.py.
    Its clients are ZEO clients of this build's zeoserver (blob directory shared), on the
    ports after this build's ``client2`` (8083-8091 in buildout.cfg, 9383-9391 in a
    worktree on 93xx); without a build, or with a build of relstorage.cfg (no ZEO server to
    be a client of), of 127.0.0.1:18100 on 18083-18091 (render only).
    Returns ``(directory, {server: port}, buildout's output)``; the first run downloads the
    servers' eggs into eggs/ (and compiles bjoern against libev). A failed build fails every
    test that uses it, with the tail of buildout's output.
    """
    from loadtests.matrix import serverbuild
    from loadtests.core.stack import service_user

    described = Stack() if os.path.exists(STACK_JSON) else None
    if described and "zeoserver" in described.ports:
        zeo_address = f"127.0.0.1:{described.ports['zeoserver']}"
        base_port = max(described.ports[name] for name in described.kinds) + 1
    else:
        zeo_address, base_port = "127.0.0.1:18100", 18083
    directory = tmp_path_factory.mktemp("servers")
    # As root, the clients drop to the stack's service user, as its own do,
    # which must read their build: pytest makes the directory 0700 (its parents, which the
    # user only passes through, get search permission from the clients' scripts).
    os.chmod(directory, 0o755)
    user = service_user(described.config) if described else ""
    try:
        serverbuild.build(directory, base_port, zeo_address, os.path.join(ROOT, "var", "blobstorage"),
                          service_user=user)
    except RuntimeError as exc:
        pytest.fail(f"servers_build: {exc}")
    return directory, serverbuild.ports(base_port), (directory / "buildout.log").read_text()


# The Ansible converge every test module can read (one per session; tests/ansible_deploy.py).
from ansible_deploy import deployed  # noqa: E402,F401 (a fixture: pytest finds it by name here)
