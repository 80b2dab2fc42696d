"""The ACME route of haproxy.cfg.j2 (the Ansible role's haproxy_acme_*, docs/how-to/tls.md,
"ACME certificates"), on a real HAProxy of the test's own (ports of the OS's choosing, an
HTTP server in this process standing for certbot's standalone server): the CA's HTTP-01
request for /.well-known/acme-challenge/ on the plain listener reaches the ACME client before
the https redirect and after the Host check; everything else there is still redirected; over
TLS the path is the site's; without the client listening the path gets 503, never Zope.
Without acme_challenge_server the template has no such route. Issuing, renewing and the
reload against a real CA (pebble): make multihost (tests/multihost/acme.py, acme_test)."""
import contextlib
import http.client
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from urllib.parse import urlsplit

import pytest

from conftest import stop_group
from http_stub import answering_server
from loadtests.core.procs import free_local_port
from plonedeploy.recipe import edge, options, tls

requires_haproxy = pytest.mark.skipif(not shutil.which("haproxy"), reason="no haproxy binary")
NAME = "www.example.org"
TOKEN = "t0k3n_-x"


def render(directory, ports, acme=True):
    """haproxy.cfg.j2 with TLS and the redirect on, one (absent) Zope server, and the ACME
    route to 127.0.0.1:<ports['acme']> when ``acme``."""
    return options.render_template(options.HAPROXY_TEMPLATE, dict(
        part="edge", servers=[{"name": "zope", "host": "127.0.0.1", "port": ports["zope"], "maxconn": 1,
                               "wsgi_server": "pyruvate"}],
        bind=f"127.0.0.1:{ports['plain']}", stats_bind=f"127.0.0.1:{ports['stats']}", balance="leastconn",
        health_check="/Plone/@@ok", timeout_queue=5, max_body_size=1024, maxconn=100, fd_limit=1000,
        manage_networks=[], run_directory=directory,
        **edge.template_context(["127.0.0.1", NAME]),
        **tls.template_context(f"127.0.0.1:{ports['tls']}", os.path.join(directory, "site.pem"), True, 0),
        **({"acme_challenge_server": f"127.0.0.1:{ports['acme']}"} if acme else {})))


def _acme_client(request):
    """certbot's standalone server: the key authorization of TOKEN, 404 for other tokens."""
    if request.path != f"/.well-known/acme-challenge/{TOKEN}":
        return 404, {}, b""
    return 200, {}, f"{TOKEN}.thumbprint".encode()


def test_without_acme_the_template_has_no_route(tmp_path):
    ports = {name: 1000 + number for number, name in enumerate(("zope", "plain", "stats", "tls", "acme"))}
    config = render(str(tmp_path), ports, acme=False)
    assert "acme_challenge" not in config and "backend acme" not in config
    config = render(str(tmp_path), ports)
    assert "acme_challenge" in config and "\nbackend acme\n" in config
    assert f"server acme 127.0.0.1:{ports['acme']}\n" in config


@requires_haproxy
def test_challenge_reaches_the_acme_client_before_the_redirect():
    directory = tempfile.mkdtemp(prefix="acme-")  # short: the runtime socket's path
    ports = {name: free_local_port() for name in ("zope", "plain", "stats", "tls")}
    client = contextlib.ExitStack()  # closed in the test: "between renewals nothing listens"
    ports["acme"] = urlsplit(client.enter_context(answering_server(_acme_client))).port
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "1", "-subj", f"/CN={NAME}", "-keyout", os.path.join(directory, "site.pem.key"),
                    "-out", os.path.join(directory, "site.pem")], check=True, capture_output=True, timeout=60)
    config = os.path.join(directory, "haproxy.cfg")
    with open(config, "w", encoding="utf-8") as fp:
        fp.write(render(directory, ports))
    checked = subprocess.run(["haproxy", "-c", "-f", config], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    proc = subprocess.Popen(["haproxy", "-db", "-f", config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)

    def get(path, host=NAME, secure=False):
        if secure:
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            connection = http.client.HTTPSConnection("127.0.0.1", ports["tls"], timeout=30, context=context)
        else:
            connection = http.client.HTTPConnection("127.0.0.1", ports["plain"], timeout=30)
        try:
            connection.request("GET", path, headers={"Host": f"{host}:{ports['plain']}"})
            response = connection.getresponse()
            return response.status, response.getheader("Location"), response.read()
        finally:
            connection.close()

    challenge = f"/.well-known/acme-challenge/{TOKEN}"
    try:
        for _ in range(100):
            try:
                get("/")
                break
            except OSError:
                time.sleep(0.1)
        # the CA's request (Host with the plain port): the client's answer, not a redirect
        assert get(challenge) == (200, None, f"{TOKEN}.thumbprint".encode())
        assert get("/.well-known/acme-challenge/other")[0] == 404
        # the rest of the plain listener is redirected as before
        assert get("/Plone")[:2] == (301, f"https://{NAME}:{ports['tls']}/Plone")
        # the Host check comes first: a name the site does not answer to gets 421
        assert get(challenge, host="evil.example")[0] == 421
        # over TLS the path is the site's (its absent Zope: 503), never the ACME client's
        assert get(challenge, secure=True)[0] == 503
        # between renewals nothing listens there: 503 from HAProxy, never Zope or a redirect
        client.close()
        assert get(challenge)[0] == 503
    finally:
        stop_group(proc, timeout=10)
        client.close()
        shutil.rmtree(directory, ignore_errors=True)
