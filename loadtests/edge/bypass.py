"""Ways around the edge's rules, tried from an address outside the admin networks.

The cases of ``python -m loadtests attacks`` that try to walk around HAProxy's path rules
rather than exhaust it (docs/explanation/edge.md#edge-limits); tests/test_edge_bypass.py
asserts on the same functions against the running stack:

- :data:`ZMI_PATHS`: the ZMI reached by an encoded or disguised path, a form directive
  (``manage_main:method``) or XML-RPC; each must get HAProxy's 403 from outside
  ``manage-networks``, while :data:`NOT_ZMI_PATHS` (pages whose name merely starts with
  "manage") reach Zope.
- :data:`VIRTUAL_HOST_PATHS`: client-sent VirtualHostMonster paths that would make Zope
  build its links from a host outside the allowlist (:data:`FOREIGN_HOST`); each must be
  refused (400) on the plain and the TLS listener, and no answer may name that host.
- :data:`INTERNAL_HEADERS`: response headers that tell a visitor which software, version,
  ZEO client or cache answered; removed for visitors, kept for the admin networks and the
  load generators.

Every request is one HTTP/1.1 ``GET`` (or the case's method) on a new connection from
``source`` (default ``127.0.0.6``: on loopback but outside the demo's 127.0.0.1/32, and not
one of the addresses .2-.5 that other edge tests count requests or connections of), read to
its end; nothing here raises for an HTTP status.
"""
import base64
import http.client
import ssl

#: The source address of the "outsider" (loopback, outside buildout.cfg's manage-networks).
OUTSIDER = "127.0.0.6"
#: The host a client-sent virtual-hosting path tries to put into Zope's links.
FOREIGN_HOST = "evil.example"

#: (method, path, headers, body) of requests that reach a ZMI screen in Zope unless refused.
ZMI_PATHS = [
    ("GET", "/Plone/manage_main", {}, b""),
    ("GET", "/Plone/manage%5Fmain", {}, b""),
    ("GET", "/Plone/manage%5fmain", {}, b""),
    ("GET", "/Plone/%6Danage_main", {}, b""),
    ("GET", "/Plone/%6danage%5fmain", {}, b""),
    ("GET", "/Plone/manage%5Fworkspace", {}, b""),
    ("GET", "/Plone/acl_users/manage%5Fmain", {}, b""),
    ("GET", "/Plone/manage_undo_transactions", {}, b""),
    ("GET", "/Plone/manage_zmi_prefs", {}, b""),
    ("GET", "/Plone/manage_main;x", {}, b""),
    ("GET", "/Plone/manage", {}, b""),
    ("GET", "/Plone//manage_main", {}, b""),
    ("GET", "/Plone/./manage_main", {}, b""),
    ("GET", "/Plone/news/../manage_main", {}, b""),
    ("GET", "/Plone%2Fmanage_main", {}, b""),
    ("GET", "/Plone/@@manage_main", {}, b""),
    ("GET", "/manage_main", {}, b""),
    ("GET", "/Plone?manage_main:method=1", {}, b""),
    ("GET", "/Plone?manage%5Fmain%3Amethod=1", {}, b""),
    ("GET", "/Plone?:action=manage_main", {}, b""),
    ("GET", "/Plone?manage_main:default_method=1", {}, b""),
    ("POST", "/Plone", {"Content-Type": "application/x-www-form-urlencoded"}, b"manage_main%3Amethod=1"),
    ("POST", "/Plone", {"Content-Type": "multipart/form-data; boundary=b"},
     b'--b\r\nContent-Disposition: form-data; name="manage_main:method"\r\n\r\n1\r\n--b--\r\n'),
    ("POST", "/Plone", {"Content-Type": "text/xml"},
     b"<?xml version='1.0'?><methodCall><methodName>manage_main</methodName><params/></methodCall>"),
    # A path HAProxy cannot decode would pass as it is (the WSGI server leaves "%ZZ" alone)
    # and Zope resolve "/../": refused for everyone (400).
    ("GET", "/Plone/%ZZ/../manage_main", {}, b""),
    ("GET", "/Plone/%00/../manage_main", {}, b""),
]
#: Paths that merely start with "manage": Zope answers them (404 here), not HAProxy's 403.
NOT_ZMI_PATHS = ["/Plone/managers-guide", "/Plone/manageable", "/Plone/management"]

#: Client-sent virtual hosting, raw and encoded (must get 400 on every listener).
VIRTUAL_HOST_PATHS = [
    f"/VirtualHostBase/http/{FOREIGN_HOST}:80/Plone/VirtualHostRoot/",
    f"/VirtualHostBase/https/{FOREIGN_HOST}:443/Plone/VirtualHostRoot/login_form",
    f"/%56irtualHostBase/http/{FOREIGN_HOST}:80/Plone/VirtualHostRoot/",
    f"/Plone/VirtualHostBase/http/{FOREIGN_HOST}:80/Plone/VirtualHostRoot/",
    "/Plone/VirtualHostRoot/",
    "/Plone/VirtualHostRoot/_vh_evil/",
    "/Plone/%5Fvh%5Fevil/VirtualHostRoot/",
    "/VirtualHostBase;x/http/evil.example:80/Plone/VirtualHostRoot/",
]

#: Response headers a visitor must not get (names lower-case; X-Cache also as a prefix).
INTERNAL_HEADERS = ("server", "x-powered-by", "via", "x-served-by", "x-varnish", "x-cache")


class Reply:
    """``status`` (int; -1 when the request failed, ``error`` says why), ``headers`` (dict,
    names lower-case) and ``body`` (bytes) of one answer."""

    def __init__(self, status, headers, body, error=""):
        self.status, self.headers, self.body, self.error = status, headers, body, error

    def __repr__(self):
        return f"Reply({self.status}{', ' + self.error if self.error else ''})"


def request(host, port, method, path, headers=None, body=b"", source=OUTSIDER, tls=False,
            server_name="127.0.0.1", auth=None, timeout=30.0):
    """Send one request on a new connection from ``source`` and return its :class:`Reply`.

    ``path`` goes on the request line exactly as given (no normalisation); ``tls``: HTTPS
    without certificate verification (the demo's certificate is self-signed);
    ``server_name``: the Host header; ``auth``: ``(user, password)`` for HTTP basic auth.
    """
    if tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context,
                                                 source_address=(source, 0))
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout, source_address=(source, 0))
    sent = {"Host": server_name, **(headers or {})}
    if auth:
        sent["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    if body:
        sent["Content-Length"] = str(len(body))
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in sent.items():
            connection.putheader(name, value)
        connection.endheaders(body or None)
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    except (OSError, http.client.HTTPException) as exc:
        return Reply(-1, {}, b"", f"{type(exc).__name__}: {exc}")
    finally:
        connection.close()


def zmi_case(host, port, auth=None, source=OUTSIDER, tls=False):
    """Each of :data:`ZMI_PATHS` and :data:`NOT_ZMI_PATHS` from ``source``, with the admin's
    credentials ``auth`` (so that Zope would show the ZMI if the request reached it).

    Returns ``{"zmi": [(method, path, status)], "not_zmi": [(path, status)]}``.
    """
    zmi = [(method, path, request(host, port, method, path, headers, body, source=source, tls=tls,
                                  auth=auth).status)
           for method, path, headers, body in ZMI_PATHS]
    not_zmi = [(path, request(host, port, "GET", path, source=source, tls=tls, auth=auth).status)
               for path in NOT_ZMI_PATHS]
    return {"zmi": zmi, "not_zmi": not_zmi}


def virtual_host_case(host, port, source=OUTSIDER, tls=False):
    """Each of :data:`VIRTUAL_HOST_PATHS` from ``source``: ``[(path, status, names the
    foreign host)]`` where the last is whether :data:`FOREIGN_HOST` occurs in the body or
    the Location header."""
    rows = []
    for path in VIRTUAL_HOST_PATHS:
        reply = request(host, port, "GET", path, source=source, tls=tls)
        leaked = FOREIGN_HOST.encode() in reply.body or FOREIGN_HOST in reply.headers.get("location", "")
        rows.append((path, reply.status, leaked))
    return rows


def internal_headers(host, port, paths, source=OUTSIDER, tls=False):
    """The :data:`INTERNAL_HEADERS` present in the answers to ``GET`` of each of ``paths``
    from ``source``: ``{path: {name: value}}`` (empty dicts when none was sent)."""
    found = {}
    for path in paths:
        headers = request(host, port, "GET", path, source=source, tls=tls).headers
        found[path] = {name: value for name, value in headers.items()
                       if name in INTERNAL_HEADERS or name.startswith("x-cache")}
    return found
