"""``python -m loadtests conflicts``: ConflictErrors per class and oid from event logs.

The log lines are those Zope 6.3 / Products.SiteErrorLog 7.0 and ZODB 6.4 wrote on this stack
(from a storagebench run's logs, 26 Nov 2026; a few serials and paths changed), so a change of their format shows here.
"""
import gzip
import json
import subprocess
import sys

from conftest import ROOT
from loadtests.storage import conflicts

COUNTER = "Products.CMFUid.UniqueIdGeneratorTool.UniqueIdGeneratorTool"
RETRIED_COUNTER = (
    "2026-11-26 10:45:42,585 INFO    [Zope.SiteErrorLog:348][pyruvate-1] ConflictError at /Plone/bench-writes: "
    "database conflict error (oid 0x5f, class " + COUNTER + ", serial this txn started with 0x040d45e4ed9d81ee "
    "2026-11-26 10:44:55.691077, serial currently committed 0x040d45e5b51e5dcc 2026-11-26 10:45:42.449676). "
    "Request will be retried.\n")
RETRIED_BUCKET = (
    "2026-11-26 10:47:02,113 INFO    [Zope.SiteErrorLog:348][pyruvate-0] ConflictError at /Plone/other: "
    "database conflict error (oid 0x2859, class BTrees.IOBTree.IOBucket, serial this txn started with "
    "0x040d45e6ac0331dd 2026-11-26 10:46:40.315425, serial currently committed 0x040d45e6b0a1c2d3 "
    "2026-11-26 10:47:01.904912). Request will be retried.\n")
# RelStorage's conflict on an object the transaction only read names no class.
RETRIED_READ = (
    "2026-11-26 10:47:16,397 INFO    [Zope.SiteErrorLog:348][pyruvate-1] VoteReadConflictError at "
    "/Plone/bench-writes: database read conflict error (oid 0x208e, serial this txn started with "
    "0x040d45e6ac0331dd 2026-11-26 10:46:40.315425, serial currently committed 0x040d45e6b0a1c2d3 "
    "2026-11-26 10:47:01.904912). Request will be retried.\n")
# After the last retry SiteErrorLog logs the traceback at ERROR; its last line names the error.
FAILED_COUNTER = [
    "2026-11-26 10:45:47,488 ERROR   [Zope.SiteErrorLog:35][pyruvate-1] ConflictError: "
    "http://127.0.0.1:9701/Plone/bench-writes/POST_application_json_\n",
    "Traceback (innermost last):\n",
    "  Module ZPublisher.WSGIPublisher, line 181, in transaction_pubevents\n",
    "  Module transaction._manager, line 257, in commit\n",
    "ZODB.POSException.ConflictError: database conflict error (oid 0x5f, class " + COUNTER + ", serial this "
    "txn started with 0x040d45e5c5d5a5cc 2026-11-26 10:45:46.367475, serial currently committed "
    "0x040d45e5c9e1f2a3 2026-11-26 10:45:47.101010)\n",
]
OTHER = ("2026-11-26 10:44:46,949 ERROR   [pyruvate:1559][pyruvate-main] Could not handle read event: "
         'Custom { kind: Other, error: "Incomplete request" }\n')
SERVER = [
    "2026-11-26T10:45:42 Unexpected error while trying to resolve conflict on "
    "<ZODB.ConflictResolution.BadClass object at 0x7f5ef2eab4d0>\n",
    "Traceback (most recent call last):\n",
    "TypeError: object.__new__(X): X is not a type object (BadClass)\n",
    "2026-11-26T10:45:44 Unexpected error while trying to resolve conflict on <class 'some.Class'>\n",
]


def test_counts_retried_and_failed_per_class_and_oid():
    found = conflicts.scan_client([OTHER, RETRIED_COUNTER, RETRIED_COUNTER, RETRIED_BUCKET] + FAILED_COUNTER)
    assert found[(COUNTER, "0x5f")]["retried"] == 2
    assert found[(COUNTER, "0x5f")]["failed"] == 1
    assert found[(COUNTER, "0x5f")]["paths"] == {"/Plone/bench-writes": 2}
    assert found[("BTrees.IOBTree.IOBucket", "0x2859")] == {"retried": 1, "failed": 0,
                                                           "paths": {"/Plone/other": 1}}
    assert len(found) == 2


def test_a_conflict_without_a_class_counts_as_class_unknown():
    found = conflicts.scan_client([RETRIED_READ, "x ConflictError at /y: database conflict error. "
                                                 "Request will be retried.\n"])
    assert found[("?", "0x208e")]["retried"] == 1
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
        (COUNTER, 4, 1), ("BTrees.IOBTree.IOBucket", 1, 0)]
    assert (data["retried"], data["failed"], data["server"]) == (5, 1, {"unexpected": 2, "badclass": 1})
    text = conflicts.to_markdown(data)
    assert "5 retried, 1 failed (at least;" in text and "1 of them on a class it could not import" in text
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
