"""The ``metrics`` WSGI filter and ZODB collector against a real ZODB, without a stack.

Runs in the built client's own interpreter (``parts/instance/bin/interpreter``: Zope's
ZODB and the pinned prometheus-client), on an in-memory ZODB (MappingStorage) that
already has ZODB's own ActivityMonitor, as a site might.
"""
import os
import subprocess

import pytest

from conftest import ROOT
from metrics_address import parse, value

INTERPRETER = os.path.join(ROOT, "parts", "instance", "bin", "interpreter")

SCRIPT = r'''
import transaction, ZODB
from ZODB.ActivityMonitor import ActivityMonitor
from prometheus_client import CollectorRegistry, generate_latest
from plonedeploy.runtime.metrics import Metrics, Middleware, ZODBCollector, install_monitor

db = ZODB.DB(None, pool_size=3, cache_size=500)
previous = ActivityMonitor()
db.setActivityMonitor(previous)
registry = CollectorRegistry()
registry.register(ZODBCollector(lambda: db))
monitor = install_monitor(db)
assert install_monitor(db) is monitor            # idempotent
first = db.open()
first.root()["items"] = {str(i): i for i in range(100)}
first.root()["more"] = [1, 2, 3]
transaction.commit()
second = db.open()                               # two connections held now
second.root()["items"]                           # loads the root and the dict
print(generate_latest(registry).decode(), end="")
print("#---")
second.close()
first.close()
print(generate_latest(registry).decode(), end="")
print("#---")
# the previous monitor still gets its calls (ZODB's own counts them per interval)
print("previous_loads", sum(d["loads"] for d in previous.getActivityAnalysis(divisions=1)))

def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/boom":
        raise RuntimeError("boom")
    start_response("404 Not Found" if path == "/missing" else "200 OK", [])
    return [b"x"]

pages = CollectorRegistry()
wrapped = Middleware(app, Metrics(pages))
for method, path in [("GET", "/"), ("GET", "/"), ("GET", "/missing"), ("BREW", "/"), ("POST", "/boom")]:
    try:
        wrapped({"REQUEST_METHOD": method, "PATH_INFO": path}, lambda s, h, e=None: None)
    except RuntimeError:
        pass
print("#---")
print(generate_latest(pages).decode(), end="")

# A real write conflict: two connections with their own transaction managers change the
# same persistent object; the second commit raises ZODB's ConflictError (class, oid).
import sys
from persistent.mapping import PersistentMapping
from ZODB.POSException import ConflictError
from zope.event import notify
from ZPublisher.pubevents import PubBeforeAbort
from plonedeploy.runtime.metrics import subscribe_aborts

setup = db.open()
setup.root()["hot"] = PersistentMapping()
transaction.commit()
setup.close()
managers = [transaction.TransactionManager(), transaction.TransactionManager()]
conns = [db.open(transaction_manager=m) for m in managers]
for n, (conn, manager) in enumerate(zip(conns, managers)):
    conn.root()["hot"]["n"] = n
managers[0].commit()
try:
    managers[1].commit()
except ConflictError:
    conflict = sys.exc_info()
    managers[1].abort()
conflicts = CollectorRegistry()
counted = Metrics(conflicts)
assert subscribe_aborts(counted)
notify(PubBeforeAbort(None, conflict, True))     # retried
notify(PubBeforeAbort(None, conflict, False))    # the last retry conflicted too
try:
    raise KeyError("not a conflict")
except KeyError:
    notify(PubBeforeAbort(None, sys.exc_info(), False))
print("#---")
print(generate_latest(conflicts).decode(), end="")

# The memory watchdog's instruments: a process started after two recorded recycles, above
# its limit with no peer.
import tempfile
from plonedeploy.runtime import probes, watchdog
state = tempfile.NamedTemporaryFile("w", suffix=".recycles", delete=False)
state.write("1800000000.0\n1800000100.0\n")
state.close()
memory = CollectorRegistry()
dog = watchdog.Watchdog(probes.Health(1), 1024, grace=0, state_file=state.name, metrics=Metrics(memory),
                        read_rss=lambda: 4096, clock=lambda: 0.0, wall=lambda: 1800000200.0)
dog.tick()
print("#---")
print(generate_latest(memory).decode(), end="")
'''


@pytest.fixture(scope="module")
def output():
    if not os.path.exists(INTERPRETER):
        pytest.fail("parts/instance/bin/interpreter missing: run 'make build' first")
    result = subprocess.run([INTERPRETER, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                            check=False, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.split("#---\n")


def test_pool_and_cache_while_connections_are_held(output):
    held = parse(output[0])
    assert value(held, "zodb_connections_in_use", database="unnamed") == 2
    assert value(held, "zodb_connections_open", database="unnamed") == 2
    assert value(held, "zodb_pool_size", database="unnamed") == 3
    assert value(held, "zodb_cache_size_target", database="unnamed") == 500
    assert value(held, "zodb_cache_objects", database="unnamed") >= 2
    assert value(held, "zodb_loads_total", database="unnamed") == 0   # counted at close
    assert value(held, "zeo_cache_hits_total", database="unnamed") == 0  # not a ZEO client


def test_loads_counted_at_close_and_previous_monitor_kept(output):
    closed = parse(output[1])
    assert value(closed, "zodb_connections_in_use", database="unnamed") == 0
    assert value(closed, "zodb_connections_open", database="unnamed") == 2  # idle in the pool
    loads = value(closed, "zodb_loads_total", database="unnamed")
    assert loads >= 1
    assert value(closed, "zodb_stores_total", database="unnamed") >= 2     # root and the new dict
    assert output[2].strip() == f"previous_loads {int(loads)}"


def test_requests_by_method_and_status(output):
    pages = parse(output[3])
    assert value(pages, "zope_http_requests_total", method="GET", code="200") == 2
    assert value(pages, "zope_http_requests_total", method="GET", code="404") == 1
    assert value(pages, "zope_http_requests_total", method="other", code="200") == 1  # made-up method
    assert value(pages, "zope_http_requests_total", method="POST", code="500") == 1   # app raised
    assert value(pages, "zope_http_request_duration_seconds_count") == 5
    assert value(pages, "zope_http_request_duration_seconds_bucket", le="+Inf") == 5
    assert value(pages, "zope_http_requests_in_progress") == 0


def test_conflicts_by_class_and_retries_from_zpublisher_events(output):
    """A real ConflictError of ZODB, announced by ZPublisher's PubBeforeAbort event as Zope
    does: counted per class, the retry counted once, a KeyError not at all."""
    counted = parse(output[4])
    assert value(counted, "zodb_conflicts_total", **{"class": "persistent.mapping.PersistentMapping"}) == 2
    assert value(counted, "zope_request_retries_total") == 1
    assert sum(v for (name, _), v in counted.items() if name == "zodb_conflicts_total") == 2


def test_memory_watchdog_instruments(output):
    """plonedeploy_memory_restarts_total starts from the recycles recorded on disk (it never
    goes down across the restarts the watchdog causes); the blocked gauge by reason."""
    memory = parse(output[5])
    assert value(memory, "plonedeploy_memory_restarts_total") == 2
    assert value(memory, "plonedeploy_memory_limit_bytes") == 1024
    assert value(memory, "plonedeploy_memory_recycle_blocked", reason="backoff") == 0
    assert value(memory, "plonedeploy_memory_recycle_blocked", reason="no_peer") == 1
