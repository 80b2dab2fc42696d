"""The ``explicittx`` WSGI filter (``transaction-mode = explicit``,
plonedeploy.runtime.explicittx) against a real ZODB, without a stack.

Runs in the built client's own interpreter (``parts/instance/bin/interpreter``: Zope's
ZODB and transaction), on an in-memory ZODB whose storage polls are counted. The app does
what Zope's publisher does per request (``ZPublisher.WSGIPublisher``: ``load_app`` opens a
connection and loads the application, ``transaction_pubevents`` begins and commits, then
the connection is closed), each request in a thread of its own as a server's worker.
"""
import json
import os
import subprocess

import pytest

from conftest import ROOT

INTERPRETER = os.environ.get("PLONEDEPLOY_INTERPRETER") or os.path.join(ROOT, "parts", "instance", "bin", "interpreter")

SCRIPT = r'''
import json, threading, transaction, ZODB
from ZODB.mvccadapter import MVCCAdapterInstance
from plonedeploy.runtime.explicittx import explicit_transactions, filter_factory

polls = []
poll = MVCCAdapterInstance.poll_invalidations
def counted(self):
    polls.append(1)
    return poll(self)
MVCCAdapterInstance.poll_invalidations = counted

db = ZODB.DB(None)
setup = db.open()
setup.root()["app"] = {"title": "site"}
transaction.commit()
setup.close()

def publisher(environ, start_response):
    """Zope's order: open and load before begin, commit, close."""
    connection = db.open()
    title = connection.root()["app"]["title"]
    tm = transaction.manager
    tm.begin()
    if environ.get("write"):
        connection.root()["count"] = connection.root().get("count", 0) + 1
    tm.commit()
    connection.close()
    start_response("200 OK", [])
    return [json.dumps({"explicit": tm.explicit, "title": title}).encode()]

def request(app, **environ):
    """One request in a new thread (a worker's first request); returns (answer, polls)."""
    out = {}
    def run():
        del polls[:]
        out["answer"] = json.loads(b"".join(app(environ, lambda status, headers: None)))
        out["polls"] = len(polls)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out

result = {
    "implicit": request(publisher),
    "explicit": request(explicit_transactions(publisher)),
    "explicit_write": request(filter_factory({})(publisher), write=1),
    "main_thread_explicit": transaction.manager.explicit,
}
check = db.open()
result["count"] = check.root().get("count")
check.close()
try:
    filter_factory({}, mode="on")
except ValueError as exc:
    result["options_error"] = str(exc)
print(json.dumps(result))
'''


@pytest.fixture(scope="module")
def result():
    if not os.path.exists(INTERPRETER):
        pytest.fail("parts/instance/bin/interpreter missing: run 'make build' first")
    out = subprocess.run([INTERPRETER, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False,
                         cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_implicit_mode_polls_the_storage_three_times_per_request(result):
    # Connection.open, the begin synchronizer and Connection.afterCompletion
    assert result["implicit"] == {"answer": {"explicit": False, "title": "site"}, "polls": 3}


def test_the_filter_makes_the_request_thread_explicit_and_polls_once(result):
    assert result["explicit"] == {"answer": {"explicit": True, "title": "site"}, "polls": 1}
    assert result["main_thread_explicit"] is False  # other threads (startup, scripts) stay implicit


def test_a_write_commits_in_explicit_mode(result):
    assert result["explicit_write"]["polls"] == 1 and result["count"] == 1


def test_the_filter_takes_no_options(result):
    assert result["options_error"] == "explicittx takes no options, got: mode"
