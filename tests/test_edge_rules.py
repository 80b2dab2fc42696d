"""Unit tests of the edge rules (plonedeploy.recipe.edge): body lanes and caps, host names."""
import re

import pytest

from plonedeploy.recipe import edge

GIB, MIB = 1024 ** 3, 1024 ** 2


def server(name, wsgi_server, max_body=None):
    return {"name": name, "wsgi_server": wsgi_server,
            "max_body": max_body if max_body is not None else edge.default_body_cap(wsgi_server)}


PAGES = [server("instance", "pyruvate"), server("client2", "waitress")]
UPLOADS = [server("uploads", "waitress")]


def test_default_caps_by_server():
    assert edge.default_body_cap("waitress") == GIB
    assert edge.default_body_cap("pyruvate") == MIB
    assert edge.default_body_cap("gunicorn") == MIB


def test_demo_limits_are_consistent():
    assert edge.body_limit_errors(GIB, edge.DEFAULT_UPLOAD_THRESHOLD, PAGES, UPLOADS) == []


def test_no_upload_lane_with_small_bodies_is_consistent():
    assert edge.body_limit_errors(8192, 8192, PAGES, []) == []


def test_no_upload_lane_with_large_bodies_names_the_options():
    errors = edge.body_limit_errors(GIB, 8192, PAGES, [])
    text = "\n".join(errors)
    # pyruvate's own cap (1 MiB) is below max-body-size, and it would receive trickled bodies
    assert "[instance] max-request-body-size = 1048576 is smaller than max-body-size" in text
    assert "[instance] runs pyruvate" in text and "set upload-backends" in text
    # waitress spools bodies and accepts 1 GiB: nothing to say about client2
    assert "[client2]" not in text


def test_upload_lane_must_spool_and_accept_every_body():
    errors = edge.body_limit_errors(GIB, 8192, [server("client2", "waitress")],
                                    [server("up", "pyruvate", max_body=2 * GIB), server("up2", "waitress", 10 * MIB)])
    text = "\n".join(errors)
    assert "[up] is in upload-backends but runs pyruvate" in text and "one of: waitress" in text
    assert "[up2] max-request-body-size = 10485760 is smaller than max-body-size = 1073741824" in text


def test_threshold_beyond_the_buffer():
    errors = edge.body_limit_errors(GIB, 20000, PAGES, UPLOADS)
    assert any(e.startswith("upload-threshold = 20000 is larger than HAProxy can buffer") for e in errors)


def test_threshold_not_below_max_body_size():
    errors = edge.body_limit_errors(4096, 8192, PAGES, UPLOADS)
    assert any("must be smaller than max-body-size = 4096" in e for e in errors)


def test_page_cap_below_threshold():
    errors = edge.body_limit_errors(GIB, 8192, [server("instance", "pyruvate", max_body=4096)], UPLOADS)
    assert errors == ["[instance] max-request-body-size = 4096 is smaller than upload-threshold = 8192, "
                      "the largest body its lane sends it: raise it or lower upload-threshold"]


def test_a_client_in_both_lanes():
    errors = edge.body_limit_errors(GIB, 8192, PAGES, [server("client2", "waitress")])
    assert any(e.startswith("client2 named in both backends and upload-backends") for e in errors)


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "www.example.org", "[::1]", "a-b.example"])
def test_valid_server_names(name):
    assert edge.server_name_error(name) is None


@pytest.mark.parametrize("name, fragment", [
    ("www.example.org:443", "has a port"),
    ("::1", "has a port or is an IPv6 address without brackets"),
    ("[nothost]", "not an IPv6 address"),
    ("exa mple", "not a host name"),
    ("-bad.example", "not a host name"),
    ("*.example.org", "not a host name"),
])
def test_invalid_server_names(name, fragment):
    assert fragment in edge.server_name_error(name)


@pytest.mark.parametrize("host, allowed", [
    ("127.0.0.1", True), ("127.0.0.1:8080", True), ("LOCALHOST", True), ("localhost:1", True),
    ("www.example.org", True), ("[::1]:8443", True),
    ("127x0x0x1", False), ("localhost.evil", False), ("evil.localhost", False),
    ("www.example.org.evil", False), ("localhost:", False), ("localhost:80x", False), ("", False),
])
def test_host_regex(host, allowed):
    pattern = edge.host_regex(["127.0.0.1", "localhost", "www.example.org", "[::1]"])
    # HAProxy compares the lower-cased Host header (req.hdr(host),lower)
    assert bool(re.match(pattern, host.lower())) is allowed
