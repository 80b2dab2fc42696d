"""The edge's path rules on the real stack, tried from outside the admin networks: the ZMI
by every disguise Zope decodes, client-sent virtual hosting, and the headers a visitor sees.

The requests are ``loadtests.edge.bypass``'s (the same that ``python -m loadtests attacks``
reports in docs/explanation/edge.md's edge table). buildout.cfg's manage-networks and
per-source-exempt are 127.0.0.1/32; the outsider is 127.0.0.6 on the same loopback.
"""
import re

import pytest
import requests

from conftest import admin_auth
from loadtests.edge import bypass

pytestmark = pytest.mark.integration


def _listeners(stack):
    """``[(label, port, tls)]``: HAProxy's plain and TLS listeners."""
    tls_port = int(stack.config["tls_url"].rsplit(":", 1)[1])
    return [("plain", stack.ports["haproxy"], False), ("tls", tls_port, True)]


def test_zmi_refused_by_every_disguise_from_outside(stack):
    """Each of bypass.ZMI_PATHS, with the admin's credentials, from 127.0.0.6 gets
    HAProxy's 403 (400 for a path it cannot decode) on both listeners, where Zope would
    have shown the ZMI (the clients answer most of them with 200 when reached directly);
    a page that merely starts with "manage" reaches Zope (404); from 127.0.0.1 (the admin
    network) the encoded path still reaches the ZMI."""
    auth = admin_auth()
    for label, port, tls in _listeners(stack):
        result = bypass.zmi_case("127.0.0.1", port, auth=auth, tls=tls)
        wrong = [(method, path, status) for method, path, status in result["zmi"]
                 if status != (400 if re.search("%ZZ|%00", path) else 403)]
        assert not wrong, (label, wrong)
        assert [status for _, status in result["not_zmi"]] == [404] * len(bypass.NOT_ZMI_PATHS), (label, result)
        inside = bypass.request("127.0.0.1", port, "GET", "/Plone/manage%5Fmain", source="127.0.0.1",
                                tls=tls, auth=auth)
        assert inside.status == 200 and b"zmi-object-id" in inside.body, (label, inside)


def test_the_zmi_reaches_zope_directly(stack):
    """The control of the test above: the disguises are real ones. Sent to a ZEO client
    directly (past HAProxy), the encoded, dot-segment, query-directive and form-body forms
    show the ZMI (200 with its page) to the admin."""
    auth = admin_auth()
    port = stack.ports["client2"]
    shown = set()
    for method, path, headers, body in bypass.ZMI_PATHS:
        reply = bypass.request("127.0.0.1", port, method, path, headers, body, source="127.0.0.1", auth=auth)
        if reply.status == 200 and b"zmi-object-id" in reply.body:
            shown.add((method, path))
    for path in ("/Plone/manage%5Fmain", "/Plone/%6Danage_main", "/Plone/news/../manage_main",
                 "/Plone?manage_main:method=1", "/Plone?:action=manage_main", "/Plone/%ZZ/../manage_main"):
        assert ("GET", path) in shown, (path, sorted(shown))
    assert ("POST", "/Plone") in shown


def test_client_sent_virtual_hosting_refused_on_every_listener(stack):
    """VirtualHostBase, VirtualHostRoot and _vh_ segments, raw and encoded, get 400 on the
    plain and the TLS listener and no answer names evil.example; the kit's own rewrite on
    TLS still builds https links to the allowed Host."""
    for label, port, tls in _listeners(stack):
        rows = bypass.virtual_host_case("127.0.0.1", port, tls=tls)
        assert [(path, status, leaked) for path, status, leaked in rows if status != 400 or leaked] == [], (label, rows)
    tls_port = _listeners(stack)[1][1]
    page = bypass.request("127.0.0.1", tls_port, "GET", "/Plone", tls=True)
    assert page.status == 200
    assert re.search(rb"https://127\.0\.0\.1(:[0-9]+)?/Plone", page.body)  # the Host sent, no port
    assert bypass.FOREIGN_HOST.encode() not in page.body


def test_visitors_get_no_internal_headers(stack):
    """From outside: no Server, X-Powered-By, Via, X-Served-By, X-Varnish or X-Cache* on a
    page from the pool, a cached page (TLS, varnish) and HAProxy's own answers; from
    127.0.0.1 (admin network and load generator) X-Served-By stays (the A/B groups by it).
    HAProxy's stats page does not show its version."""
    paths = ["/Plone", "/Plone/@@ok", "/Plone/news", "/nonexistent-page"]
    for label, port, tls in _listeners(stack):
        bypass.request("127.0.0.1", port, "GET", "/Plone", tls=tls)  # a cache entry for the TLS run
        found = bypass.internal_headers("127.0.0.1", port, paths, tls=tls)
        assert found == {path: {} for path in paths}, (label, found)
        inside = bypass.internal_headers("127.0.0.1", port, ["/Plone"], source="127.0.0.1", tls=tls)["/Plone"]
        assert inside.get("x-served-by") in stack.config["servers"] or inside.get("x-cache"), (label, inside)
    stats = requests.get(stack.stats_url.replace(";csv", ""), timeout=10).text
    assert "Statistics Report for HAProxy" in stats
    assert not re.search(r"version\s+2\.\d", stats, re.I), re.findall(r".{40}version.{40}", stats, re.I)
