"""Concurrent writes never fail (issue 33), on the real stack through HAProxy.

Ten writers create Documents in one folder at once for a bounded time, as an import job or
several editors would; every POST must be answered 201 (a ConflictError that Zope's retries
did not absorb would be a 500) and every created document must be readable afterwards. The
clients' metrics must have counted the conflicts and retries of the run, and the clients'
event logs give the conflict report of the run (printed; ``python -m loadtests conflicts``).
"""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import admin_session, log_sizes, new_lines
from loadtests.storage import conflicts
from metrics_address import scrape

pytestmark = pytest.mark.integration

WRITERS = 10
#: Seconds of writing: long enough for a few hundred POSTs to collide (four Zope threads
#: behind HAProxy commit into one folder), short enough for the suite.
SECONDS = 20


def _counts(metrics_urls):
    """``(conflicts, retries)`` summed over the clients' metrics (zodb_conflicts_total of
    every class, zope_request_retries_total); fails if a client lacks the retry counter."""
    conflict_sum = retry_sum = 0.0
    for part, url in metrics_urls.items():
        series = scrape(url)
        assert ("zope_request_retries_total", frozenset()) in series, f"{part} exports no retry counter"
        retry_sum += series[("zope_request_retries_total", frozenset())]
        conflict_sum += sum(v for (name, _), v in series.items() if name == "zodb_conflicts_total")
    return conflict_sum, retry_sum


def test_ten_concurrent_writers_get_201_and_every_document_reads(stack):
    url = stack.frontend_url
    session = admin_session()
    folder = f"writes-{int(time.time())}"
    answer = session.post(url + "/Plone", json={"@type": "Folder", "id": folder, "title": "concurrent writes"},
                          timeout=60)
    assert answer.status_code == 201, answer.text[:300]
    metrics_urls = stack.config["metrics"]
    parts = list(stack.config["servers"]) + list(stack.config["upload_servers"])
    conflicts_before, retries_before = _counts(metrics_urls)
    logs = log_sizes(parts)
    results = []  # (document id, status code or exception name)
    lock = threading.Lock()
    deadline = time.monotonic() + SECONDS

    def writer(number):
        own = admin_session()
        count = 0
        while time.monotonic() < deadline:
            count += 1
            doc = f"w{number}-{count}"
            try:
                status = own.post(f"{url}/Plone/{folder}", json={"@type": "Document", "id": doc,
                                                                 "title": f"writer {number} document {count}"},
                                  timeout=120).status_code
            except requests.RequestException as exc:
                status = type(exc).__name__
            with lock:
                results.append((doc, status))

    started = time.monotonic()
    threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    writing = time.monotonic() - started
    conflicts_after, retries_after = _counts(metrics_urls)
    report = conflicts.summarize(conflicts.scan_client(new_lines(logs)))
    print(f"\n{WRITERS} writers, {writing:.1f} s: {len(results)} POSTs, "
          f"{sum(1 for _, s in results if s == 201)} answered 201; metrics: "
          f"{conflicts_after - conflicts_before:.0f} conflicts, {retries_after - retries_before:.0f} retries\n"
          + conflicts.to_markdown(report))
    assert not any(t.is_alive() for t in threads), "a writer still waits for an answer after 180 s"
    failed = [(doc, status) for doc, status in results if status != 201]
    assert not failed, f"{len(failed)} of {len(results)} POSTs not answered 201: {failed[:10]}"
    assert len(results) >= WRITERS, "every writer should have written at least once"
    # Every conflict of a request that ended in 201 was retried: the counters agree.
    assert conflicts_after - conflicts_before <= retries_after - retries_before
    assert report["failed"] == 0, "a ConflictError after the last retry is in the clients' logs"

    def read(doc):
        try:
            return doc, requests.get(f"{url}/Plone/{folder}/{doc}", auth=session.auth, timeout=60,
                                     headers={"Accept": "application/json"}).status_code
        except requests.RequestException as exc:
            return doc, type(exc).__name__

    with ThreadPoolExecutor(4) as pool:
        unread = [(doc, status) for doc, status in pool.map(read, [doc for doc, _ in results]) if status != 200]
    assert not unread, f"{len(unread)} created documents not readable: {unread[:10]}"


def test_the_writers_next_read_is_served_by_the_client_that_wrote(stack):
    """Read your own writes (haproxy.cfg.j2, cookie lb_wrote): a write's answer gives the
    write client's position in the pool, the writer's next read is served by that client and
    its answer deletes the cookie. Each read asks for the document the write just created:
    served by another client before that client saw the write, it would be a 404."""
    url = stack.frontend_url
    session = admin_session()
    writer = list(stack.config["servers"])[0]  # the write lane's client
    stamp = int(time.time())
    for number in range(10):
        doc = f"read-own-write-{stamp}-{number}"
        made = session.post(url + "/Plone", json={"@type": "Document", "id": doc, "title": doc}, timeout=60)
        assert (made.status_code, made.headers.get("X-Served-By")) == (201, writer), made.text[:300]
        assert session.cookies.get("lb_wrote") == "1"
        read = session.get(f"{url}/Plone/{doc}", headers={"Accept": "application/json"}, timeout=60)
        assert (read.status_code, read.headers.get("X-Served-By"), read.json()["title"]) == (200, writer, doc)
        assert "lb_wrote" not in session.cookies, "the read's answer should delete the cookie"
