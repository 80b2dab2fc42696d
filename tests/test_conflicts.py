"""``python -m loadtests conflicts``: ConflictErrors per class and oid from event logs.

The log lines are those Zope 6.3 / Products.SiteErrorLog 7.0 and ZODB 6.4 wrote on this stack
(copied from a storagebench run's logs, 27 Nov 2026), so a change of their format shows here.
"""
import gzip
import json
import subprocess
import sys

from conftest import ROOT
from loadtests import conflicts

COUNTER = "Products.CMFUid.UniqueIdGeneratorTool.UniqueIdGeneratorTool"
RETRIED_COUNTER = (
    "2026-11-27 10:41:02,311 INFO    [Products.SiteErrorLog:348][Dummy-2] ConflictError at "
    "/Plone/bench-writes: database conflict error (oid 0x5f, class " + COUNTER + ", serial this txn "
    "started with 0x03f2a1b2c3d4e5f6 2026-11-27 10:41:01.904912, serial currently committed "
    "0x03f2a1b2c4112233 2026-11-27 10:41:02.101010). Request will be retried.\n")
RETRIED_BUCKET = (
    "2026-11-27 10:41:03,001 INFO    [Products.SiteErrorLog:348][Dummy-1] ConflictError at "
    "/Plone/other: database conflict error (oid 0x1234, class BTrees.OOBTree.OOBucket, serial this "
    "txn started with 0x03f2a1b2c3d4e5f6 2026-11-27 10:41:01.904912, serial currently committed "
    "0x03f2a1b2c4112233 2026-11-27 10:41:02.101010). Request will be retried.\n")
# After the last retry SiteErrorLog logs the traceback at ERROR; its last line names the error.
FAILED_COUNTER = [
    "2026-11-27 10:41:09,777 ERROR   [Zope.SiteErrorLog:238][Dummy-2] 1764240069.70.1 "
    "http://127.0.0.1:9701/Plone/bench-writes\n",
    "Traceback (innermost last):\n",
    '  Module ZPublisher.WSGIPublisher, line 181, in transaction_pubevents\n',
    '  Module transaction._manager, line 257, in commit\n',
    "ZODB.POSException.ConflictError: database conflict error (oid 0x5f, class " + COUNTER
    + ", serial this txn started with 0x03f2 2026-11-27, serial currently committed 0x03f3 2026-11-27)\n",
]
OTHER = "2026-11-27 10:40:00,000 INFO    [Zope:42][MainThread] Ready to handle requests\n"
SERVER = [
    "2026-11-27T10:41:02 ERROR ZODB.ConflictResolution Unexpected error while trying to resolve "
    "conflict on <ZODB.ConflictResolution.BadClass object at 0x7f1e2c3b4d50>\n",
    "TypeError: object.__new__(X): X is not a type object (BadClass)\n",
    "2026-11-27T10:41:05 ERROR ZODB.ConflictResolution Unexpected error while trying to resolve "
    "conflict on <class 'some.Class'>\n",
]


def test_counts_retried_and_failed_per_class_and_oid():
    found = conflicts.scan_client([OTHER, RETRIED_COUNTER, RETRIED_COUNTER, RETRIED_BUCKET] + FAILED_COUNTER)
    assert found[(COUNTER, "0x5f")]["retried"] == 2
    assert found[(COUNTER, "0x5f")]["failed"] == 1
    assert found[(COUNTER, "0x5f")]["paths"] == {"/Plone/bench-writes": 2}
    assert found[("BTrees.OOBTree.OOBucket", "0x1234")] == {"retried": 1, "failed": 0,
                                                           "paths": {"/Plone/other": 1}}
    assert len(found) == 2


def test_a_conflict_without_oid_or_class_counts_as_unknown():
    found = conflicts.scan_client(["INFO [Products.SiteErrorLog] ReadConflictError at /x: database read "
                                   "conflict error. Request will be retried.\n"])
    assert found[("?", "?")]["retried"] == 1


def test_server_log_counts_badclass():
    assert conflicts.scan_server(SERVER) == {"unexpected": 2, "badclass": 1}


def test_report_orders_the_hottest_first_and_reads_gzip(tmp_path):
    plain = tmp_path / "instance.log"
    plain.write_text(RETRIED_BUCKET + RETRIED_COUNTER + "".join(FAILED_COUNTER))
    rotated = tmp_path / "client2.log.1.gz"
    with gzip.open(rotated, "wt") as fp:
        fp.write(RETRIED_COUNTER * 3)
    server = tmp_path / "zeoserver.log"
    server.write_text("".join(SERVER))
    data = conflicts.read([str(plain), str(rotated)], [str(server)])
    assert [(r["class"], r["retried"], r["failed"]) for r in data["objects"]] == [
        (COUNTER, 4, 1), ("BTrees.OOBTree.OOBucket", 1, 0)]
    assert (data["retried"], data["failed"], data["server"]) == (5, 1, {"unexpected": 2, "badclass": 1})
    text = conflicts.to_markdown(data)
    assert "5 retried, 1 failed" in text and "1 of them on a class it could not import" in text
    assert f"| {COUNTER} | 0x5f | 4 | 1 | /Plone/bench-writes |" in text


def test_command_prints_markdown_or_json_and_exits_2_on_a_missing_log(tmp_path):
    log = tmp_path / "instance.log"
    log.write_text(RETRIED_COUNTER)
    command = [sys.executable, "-m", "loadtests", "conflicts"]
    shown = subprocess.run(command + [str(log)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "1 retried, 0 failed" in shown.stdout, shown.stderr
    as_json = subprocess.run(command + ["--json", str(log)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert json.loads(as_json.stdout)["objects"][0]["oid"] == "0x5f"
    missing = subprocess.run(command + [str(tmp_path / "nope.log")], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
