"""The cache tier: varnish between HAProxy's TLS frontend and the pool, purged by Plone.

The unit tests render templates/varnish.vcl.j2 and compile it with Debian's varnishd. The
integration tests use the running stack (``stack`` fixture, conftest.py; buildout.cfg's
[varnish] and ``[haproxy] cache = varnish``): what is a hit, what is never cached, what an
edit purges, who may PURGE, and that the plain frontend (the A/B's) is never cached.
"""
import os
import shutil
import subprocess
import time
import uuid

import pytest
import requests

from conftest import STACK, admin_auth, run
from plonedeploy.recipe import options, varnish

# The demo's certificate is self-signed.
pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")

TEMPLATE = os.path.join(options.TEMPLATES_DIRECTORY, "varnish.vcl.j2")


def render(tmp_path, **overrides):
    context = varnish.template_context("test", ("127.0.0.1", 8088), ["127.0.0.1/32", "10.0.0.0/8"])
    context.update(overrides)
    path = tmp_path / "varnish.vcl"
    path.write_text(options.render_template(TEMPLATE, context))
    return path


def test_vcl_compiles_with_varnishd(tmp_path):
    path = render(tmp_path)
    text = path.read_text()
    assert '"127.0.0.1"/32;' in text and '"10.0.0.0"/8;' in text
    assert '.port = "8088";' in text
    varnish.check_vcl(varnish.find_varnishd(), str(path))  # raises UserError if varnishd refuses it


def test_broken_vcl_is_refused_with_varnish_message(tmp_path):
    path = tmp_path / "broken.vcl"
    path.write_text('vcl 4.1;\nbackend b { .host = "127.0.0.1"; .port = "1"; }\nsub vcl_recv { return (nonsense); }\n')
    with pytest.raises(Exception) as info:
        varnish.check_vcl(varnish.find_varnishd(), str(path))
    assert "nonsense" in str(info.value)


def test_template_context_refuses_empty_acl_and_odd_cookie_names():
    with pytest.raises(ValueError, match="PURGE"):
        varnish.template_context("test", ("127.0.0.1", 8088), [])
    with pytest.raises(ValueError, match="cookie"):
        varnish.template_context("test", ("127.0.0.1", 8088), ["127.0.0.1/32"], ["__ac", "a.b"])


# ----------------------------------------------------------------------- live stack


@pytest.fixture(scope="module")
def edge(stack):
    """``(tls_url, cache)`` of the running stack; fails if the build has no cache tier."""
    cache = stack.config.get("cache")
    if not cache or not stack.config.get("tls_url"):
        pytest.fail("the build has no cache tier: buildout.cfg sets [haproxy] cache = varnish and tls-bind")
    return stack.config["tls_url"], cache


def get(url, **kwargs):
    return requests.get(url, verify=False, timeout=60, **kwargs)


def varnishstat(cache, counter):
    """One counter of the stack's varnish (``MAIN.cache_hit`` ...), as an int."""
    out = run([shutil.which("varnishstat") or "/usr/bin/varnishstat", "-n", cache["workdir"], "-1",
               "-f", counter], timeout=30).stdout
    return int(out.split()[1])


def wait_for_counter(cache, counter, above, timeout=10.0):
    """The counter once it exceeds ``above`` (varnish's worker threads add their counts to
    the shared ones in batches, not per request); fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (now := varnishstat(cache, counter)) <= above:
        assert time.monotonic() < deadline, f"{counter} still {now} after {timeout} s"
        time.sleep(0.2)
    return now


@pytest.mark.integration
def test_anonymous_page_is_a_hit_the_second_time(edge):
    tls_url, cache = edge
    # A query string of its own: a key no other test has warmed.
    url = f"{tls_url}/Plone?probe={uuid.uuid4().hex}"
    hits = varnishstat(cache, "MAIN.cache_hit")
    first, second = get(url), get(url)
    assert first.status_code == second.status_code == 200
    assert first.headers["X-Cache"] == "MISS"
    assert second.headers["X-Cache"] == "HIT", second.headers
    assert "s-maxage=" in second.headers["Cache-Control"]  # plone.app.caching marked it cacheable
    wait_for_counter(cache, "MAIN.cache_hit", hits)
    assert first.text == second.text
    # Links stay https (the VirtualHostMonster path is added on the miss, not in the key).
    assert f'href="{tls_url}/Plone' in second.text


@pytest.mark.integration
def test_html_and_json_are_separate_variants(edge):
    tls_url, _ = edge
    url = f"{tls_url}/Plone?variant={uuid.uuid4().hex}"
    for _ in range(2):
        page = get(url)
        data = get(url, headers={"Accept": "application/json"})
        assert page.headers["Content-Type"].startswith("text/html")
        assert data.headers["Content-Type"].startswith("application/json")
    assert page.headers["X-Cache"] == data.headers["X-Cache"] == "HIT"


@pytest.mark.integration
def test_logged_in_requests_never_come_from_or_go_into_the_cache(edge):
    tls_url, _ = edge
    url = f"{tls_url}/Plone?auth={uuid.uuid4().hex}"
    for _ in range(2):
        assert get(url, auth=admin_auth()).headers["X-Cache"] == "MISS"
    # The admin's pages were not stored: the first anonymous request is a miss.
    assert get(url).headers["X-Cache"] == "MISS"
    assert get(url).headers["X-Cache"] == "HIT"
    # Plone's login cookie (even a forged one) always passes the cache.
    for _ in range(2):
        assert get(url, cookies={"__ac": "forged"}).headers["X-Cache"] == "MISS"
    # Tracking cookies are dropped: the cached page is served.
    assert get(url, cookies={"_ga": "GA1.2.3", "_pk_id": "5"}).headers["X-Cache"] == "HIT"


@pytest.mark.integration
def test_edit_through_restapi_purges_the_page_within_a_second(edge):
    tls_url, _ = edge
    doc = f"cache-{uuid.uuid4().hex[:8]}"
    api = {"Accept": "application/json"}
    created = requests.post(f"{tls_url}/Plone", json={"@type": "Document", "id": doc, "title": "Before"},
                            headers=api, auth=admin_auth(), verify=False, timeout=60)
    assert created.status_code == 201, created.text[:500]
    try:
        published = requests.post(f"{tls_url}/Plone/{doc}/@workflow/publish", headers=api, auth=admin_auth(),
                                  verify=False, timeout=60)
        assert published.status_code == 200, published.text[:500]
        url = f"{tls_url}/Plone/{doc}"
        assert "<title>Before" in get(url).text
        cached = get(url)
        assert cached.headers["X-Cache"] == "HIT" and "<title>Before" in cached.text
        edited = requests.patch(url, json={"title": "After"}, headers=api, auth=admin_auth(), verify=False,
                                timeout=60)
        assert edited.status_code == 204, edited.text[:500]
        start = time.monotonic()
        while "<title>After" not in get(url).text:
            assert time.monotonic() - start < 1.0, "the edited page was still served from the cache after 1 s"
            time.sleep(0.05)
    finally:
        requests.delete(f"{tls_url}/Plone/{doc}", headers=api, auth=admin_auth(), verify=False, timeout=60)


@pytest.mark.integration
def test_purge_only_from_the_zeo_clients_and_pages_only_through_haproxy(edge):
    tls_url, cache = edge
    path = f"/Plone?purge={uuid.uuid4().hex}"
    get(tls_url + path)
    assert get(tls_url + path).headers["X-Cache"] == "HIT"
    # From an address outside the ACL (127.0.0.5 is still this host): refused by varnish.
    foreign = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PURGE",
                              "--interface", "127.0.0.5", cache["url"] + path],
                             capture_output=True, text=True, timeout=30, check=False)
    assert foreign.stdout == "405", foreign
    # A visitor's GET straight to varnish, not from HAProxy on this host: refused.
    direct = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                             "--interface", "127.0.0.5", cache["url"] + path],
                            capture_output=True, text=True, timeout=30, check=False)
    assert direct.stdout == "403", direct
    # Through the edge: refused by HAProxy, whatever the visitor's address.
    via_edge = requests.request("PURGE", tls_url + path, verify=False, timeout=30)
    assert via_edge.status_code == 405
    assert get(tls_url + path).headers["X-Cache"] == "HIT"
    # From the clients' address (what plone.cachepurging sends): the page goes.
    assert requests.request("PURGE", cache["url"] + path, timeout=30).status_code == 200
    assert get(tls_url + path).headers["X-Cache"] == "MISS"


@pytest.mark.integration
def test_plain_frontend_is_never_cached(stack, edge):
    url = f"{stack.frontend_url}/Plone"
    for _ in range(2):
        response = get(url)
        assert response.status_code == 200
        assert "X-Cache" not in response.headers  # HAProxy sent it to the pool, not to varnish


@pytest.mark.integration
def test_varnish_down_sends_requests_straight_to_the_pool(stack, edge):
    """varnish stopped: once HAProxy has the cache tier DOWN (three refused connections, or
    its health check: inter 2 s x fall 3), GETs over TLS go straight to the pool and are
    answered 200, with https links and no varnish header; started again, they go through
    varnish again. A GET that HAProxy sent to varnish before it was DOWN gets HAProxy's 503
    after its connect retries (a second apart, measured ~3 s) and nothing worse: there is no
    other server in the cache backend to retry on (docs/explanation/edge.md, "Cache")."""
    from plonedeploy.stack.balancer import cache_state
    from plonedeploy.stack.supervisor import stop_process

    tls_url, _ = edge
    url = f"{tls_url}/Plone?down={uuid.uuid4().hex}"
    assert get(url).headers["X-Cache"] == "MISS" and get(url).headers["X-Cache"] == "HIT"
    answers = []  # (seconds since the stop, status or exception name, through varnish)
    stop_process(stack.config, "varnish")
    stopped = time.monotonic()
    try:
        while (state := cache_state(stack.config)) != "DOWN":
            assert time.monotonic() - stopped < 15, f"varnish still {state} in HAProxy 15 s after its stop"
            try:
                answer = get(url)
                answers.append((time.monotonic() - stopped, answer.status_code, "X-Cache" in answer.headers))
            except requests.RequestException as exc:
                answers.append((time.monotonic() - stopped, type(exc).__name__, False))
            time.sleep(0.1)
        down_after = time.monotonic() - stopped
        while_down = [get(url) for _ in range(5)]
    finally:
        run([STACK, "start", "varnish"], timeout=120)
        deadline = time.monotonic() + 30
        while cache_state(stack.config) != "UP" and time.monotonic() < deadline:
            time.sleep(0.2)
    print(f"\nvarnish stopped: DOWN in HAProxy after {down_after:.2f} s; before that {answers}")
    assert down_after < 10, down_after
    assert all(status == 503 or (status == 200 and not cached) for _, status, cached in answers), answers
    assert [(a.status_code, "X-Cache" in a.headers) for a in while_down] == [(200, False)] * 5
    assert all(f'href="{tls_url}/Plone' in a.text for a in while_down)  # VirtualHostMonster path set
    assert cache_state(stack.config) == "UP", "varnish not UP again in HAProxy 30 s after its start"
    assert "X-Cache" in get(url).headers  # through varnish again
