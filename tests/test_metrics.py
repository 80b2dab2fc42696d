"""Prometheus metrics on the real stack: HAProxy's exporter and each ZEO client's own.

Uses the session fixture ``stack`` (conftest.py): the built stack, started once. Each test
scrapes the real endpoints named in ``parts/stack/stack.json`` (``metrics``,
``haproxy_metrics_url``) and checks named series; docs/how-to/operate.md, "Metrics".
"""
import os
import re
import ssl
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from conftest import ROOT
from metrics_address import scrape, value

pytestmark = pytest.mark.integration


def get(url, expect=200):
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def pool_size(part):
    """``pool-size`` the recipe wrote into the client's zope.conf (= its threads)."""
    text = open(os.path.join(ROOT, "parts", part, "etc", "zope.conf")).read()
    return int(re.search(r"^\s*pool-size (\d+)", text, re.MULTILINE).group(1))


def test_haproxy_exporter_reports_every_server_up(stack):
    series = scrape(stack.config["haproxy_metrics_url"])
    for server in stack.config["servers"]:
        assert value(series, "haproxy_server_status", proxy=stack.backend, server=server, state="UP") == 1
    # The series the alert rules use (roles/monitoring/templates/alerts.yml.j2).
    assert value(series, "haproxy_backend_current_queue", proxy=stack.backend) >= 0
    assert value(series, "haproxy_backend_http_responses_total", proxy=stack.backend, code="5xx") >= 0


def test_varnish_exporter_counts_hits(stack):
    """Debian's prometheus-varnish-exporter beside the stack's varnish: a cached page counts
    as a hit in ``varnish_main_cache_hit``."""
    cache = stack.config.get("cache") or {}
    assert cache.get("metrics_url"), "no varnish metrics: buildout.cfg sets [varnish] metrics-address"
    before = value(scrape(cache["metrics_url"]), "varnish_main_cache_hit")
    url = stack.config["tls_url"] + "/Plone?metrics-probe"
    context = ssl._create_unverified_context()  # the demo's self-signed certificate
    for _ in range(3):
        with urllib.request.urlopen(url, timeout=30, context=context) as response:
            assert response.status == 200
    # Varnish's threads add their counts to the shared counters in batches: poll.
    deadline = time.monotonic() + 10
    while value(scrape(cache["metrics_url"]), "varnish_main_cache_hit") < before + 2:
        assert time.monotonic() < deadline, "varnish_main_cache_hit did not count the hits within 10 s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def clients(stack):
    metrics = stack.config["metrics"]
    assert set(metrics) == set(stack.config["servers"]) | set(stack.config["upload_servers"]), metrics
    return metrics


def test_each_client_counts_its_requests_by_status(stack, clients):
    """N pages and one 404 sent straight to each page client show up in its own counters."""
    requests = 5
    for part in stack.config["servers"]:
        url = clients[part]
        base = stack.client_urls[part]
        before = scrape(url)
        for _ in range(requests):
            assert get(base + "/Plone")[0] == 200
        assert get(base + "/Plone/no-such-page-for-metrics")[0] == 404
        after = scrape(url)

        def delta(name, **labels):
            return value(after, name, **labels) - before.get((name, frozenset(labels.items())), 0.0)

        # HAProxy's health checks (GET /Plone/@@ok) add 200s of their own meanwhile: at least.
        assert delta("zope_http_requests_total", method="GET", code="200") >= requests, part
        assert delta("zope_http_requests_total", method="GET", code="404") == 1, part
        assert delta("zope_http_request_duration_seconds_count") >= requests + 1, part
        assert delta("zope_http_request_duration_seconds_sum") > 0, part
        # Rendering /Plone loads objects: the ZODB side of the same process moved too.
        assert value(after, "zodb_cache_objects", database="main") > 0, part
        assert value(after, "zodb_loads_total", database="main") >= value(before, "zodb_loads_total",
                                                                          database="main"), part


def test_each_client_reports_its_zodb_pool(stack, clients):
    for part, url in clients.items():
        series = scrape(url)
        size = pool_size(part)
        assert value(series, "zodb_pool_size", database="main") == size, part
        # The scrape is answered by the exporter's thread, not a Zope thread: no request
        # holds a connection for it, and never more than the pool.
        assert 0 <= value(series, "zodb_connections_in_use", database="main") <= size, part
        assert value(series, "zodb_connections_open", database="main") >= 1, part
        assert value(series, "process_resident_memory_bytes") > 50 * 2 ** 20, part
        # The exporter turns off prometheus-client's "<counter>_created" series.
        assert not any(name.endswith("_created") for name, _ in series), part


def test_each_client_answers_scrapes_while_every_thread_is_busy(stack, clients):
    """Per client: 4 loops per Zope thread GET /Plone straight at it (no HAProxy queue in
    front), so every thread is busy all the time; meanwhile 10 scrapes of its exporter each
    answer within 2 s, and at least one sees every ZODB connection of the pool in use (the
    load really took every thread). The exporter's own thread and socket do not wait for a
    Zope thread (docs/how-to/operate.md, "Metrics"; measured 7-66 ms with both workers busy)."""
    import threading

    for part, url in clients.items():
        size = pool_size(part)
        base = next(proc["ready"]["http"].rstrip("/") for proc in stack.config["processes"] if proc["name"] == part)
        stop, loaded = threading.Event(), []

        def load():
            while not stop.is_set():
                try:
                    loaded.append(get(base + "/Plone")[0])
                except OSError as exc:  # a failure is counted, not lost with the thread
                    loaded.append(repr(exc))

        loops = [threading.Thread(target=load) for _ in range(4 * size)]
        for loop in loops:
            loop.start()
        try:
            time.sleep(1.0)
            seen = []  # (seconds, connections in use, requests in progress)
            for _ in range(10):
                started = time.monotonic()
                series = scrape(url)
                seen.append((time.monotonic() - started, value(series, "zodb_connections_in_use", database="main"),
                             value(series, "zope_http_requests_in_progress")))
                time.sleep(0.1)
        finally:
            stop.set()
            for loop in loops:
                loop.join(60)
        print(f"\n{part} ({size} threads) under load: scrapes (s, in use, in progress) {seen}")
        assert loaded and set(loaded) == {200}, (part, sorted(set(map(str, loaded))))
        assert max(seconds for seconds, _, _ in seen) < 2.0, (part, seen)
        assert any(in_use == size for _, in_use, _ in seen), (part, size, seen)


def test_metrics_are_not_reachable_through_the_frontend(stack, clients):
    """The exporters listen on their own ports; HAProxy's frontend forwards only to the
    clients' http-address, so /metrics there is Plone's (404), not an exporter's."""
    status, body = get(stack.frontend_url + "/metrics")
    assert status == 404
    assert b"zope_http_requests_total" not in body and b"haproxy_" not in body
    haproxy_cfg = open(os.path.join(ROOT, "parts", "haproxy", "haproxy.cfg")).read()
    for part, url in clients.items():
        address = urlsplit(url).netloc
        # HAProxy asks the probes there ("check addr .. port .."), but no server line sends
        # requests to it
        assert address not in haproxy_cfg, f"{part}'s metrics address {address} in haproxy.cfg"
        assert f"check addr {urlsplit(url).hostname} port {urlsplit(url).port}" in haproxy_cfg, part
        assert urlsplit(url).hostname == "127.0.0.1"
