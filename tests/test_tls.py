"""TLS at HAProxy: the self-signed certificate the build makes, and HTTPS on the real stack.

The unit tests need only Debian's openssl; the integration tests use the running stack
(``stack`` fixture, conftest.py) and its ``tls-bind`` (buildout.cfg: 127.0.0.1:8443), and
speak TLS with curl and ``openssl s_client`` as a browser or an old client would.
"""
import os
import re
import stat
import subprocess

import pytest

from conftest import run
from plonedeploy.recipe import tls


def test_self_signed_certificate_for_the_names(tmp_path):
    path = str(tmp_path / "tls" / "site.pem")
    tls.make_self_signed(path, ["127.0.0.1", "localhost", "[::1]"])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = open(path).read()
    assert "BEGIN CERTIFICATE" in text and "PRIVATE KEY" in text  # HAProxy's crt: both in one file
    assert tls.certificate_names(path) == {"IP:127.0.0.1", "DNS:localhost", "IP:::1"}
    assert not tls.needs_new(path, ["127.0.0.1", "localhost", "[::1]"])
    # no key left beside it
    assert sorted(os.listdir(tmp_path / "tls")) == ["site.pem"]


def test_certificate_made_anew_only_when_names_change(tmp_path):
    path = str(tmp_path / "site.pem")
    tls.make_self_signed(path, ["www.example.org"])
    assert not tls.needs_new(path, ["www.example.org"])
    assert tls.needs_new(path, ["www.example.org", "example.org"])
    assert tls.needs_new(str(tmp_path / "missing.pem"), ["www.example.org"])


def test_certificate_close_to_its_end_is_made_anew(tmp_path):
    path = str(tmp_path / "site.pem")
    tls.make_self_signed(path, ["www.example.org"], days=tls.RENEW_BEFORE_DAYS - 1)
    assert tls.needs_new(path, ["www.example.org"])


@pytest.fixture
def tls_url(stack):
    if not stack.config.get("tls_url"):
        pytest.fail("the build has no tls-bind: buildout.cfg sets [haproxy] tls-bind")
    return stack.config["tls_url"]


def curl(*args, timeout=60):
    return run(["curl", "--silent", "--show-error", "--insecure", *args], timeout=timeout)


@pytest.mark.integration
def test_http2_over_tls_with_hsts(tls_url):
    result = curl("--http2", "--output", "/dev/null", "--dump-header", "-",
                  "--write-out", "%{http_version} %{http_code}\n", tls_url + "/Plone")
    assert result.stdout.strip().splitlines()[-1] == "2 200", result.stdout
    assert re.search(r"^strict-transport-security: max-age=63072000\r?$", result.stdout, re.M | re.I)


@pytest.mark.integration
def test_links_are_https(tls_url):
    page = curl(tls_url + "/Plone").stdout
    own = re.findall(r'(?:href|src)="(https?://127\.0\.0\.1[^"]*)"', page)
    assert own and all(link.startswith(tls_url + "/") or link == tls_url + "/Plone" for link in own), own[:5]
    data = curl("-H", "Accept: application/json", tls_url + "/Plone").stdout
    assert f'"@id": "{tls_url}/Plone"' in data


@pytest.mark.integration
@pytest.mark.parametrize("version, accepted", [("-tls1_1", False), ("-tls1", False), ("-tls1_2", True),
                                               ("-tls1_3", True)])
def test_only_tls12_and_later(tls_url, version, accepted):
    host_port = tls_url.split("//")[1]
    result = subprocess.run(["openssl", "s_client", "-connect", host_port, version, "-servername", "localhost"],
                            input="", capture_output=True, text=True, timeout=30, check=False)
    # "New, TLSv1.3, Cipher is TLS_AES_256_GCM_SHA384"; a refused handshake: "New, (NONE), ..."
    session = re.search(r"^New, (\S+), Cipher is (\S+)", result.stdout, re.MULTILINE)
    assert session, result.stdout[-2000:] + result.stderr[-2000:]
    assert (session.group(2) != "(NONE)") is accepted, result.stdout[-2000:] + result.stderr[-2000:]
    if accepted:
        assert session.group(1) in ("TLSv1.2", "TLSv1.3")


@pytest.mark.integration
def test_edge_rules_apply_over_tls(tls_url):
    """The same frontend: a forged Host is refused over HTTPS as over HTTP."""
    result = curl("--output", "/dev/null", "--write-out", "%{http_code}", "-H", "Host: evil.example",
                  tls_url + "/Plone")
    assert result.stdout == "421"
