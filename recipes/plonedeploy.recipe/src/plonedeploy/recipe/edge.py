"""The balancer's edge rules: request-body lanes, per-server body caps, allowed host names.

One implementation for both deploy paths: ``plonedeploy.recipe:haproxy`` raises
``zc.buildout.UserError`` with these messages, and the Ansible ``haproxy`` role calls the
same functions through ``ansible/filter_plugins/plonedeploy_edge.py``. Nothing here imports
zc.buildout, Jinja2 or Zope, so it runs in any Python 3.

The rule (docs/explanation/edge.md#edge-limits): HAProxy buffers a request body whole
(``option http-buffer-request``, within ``timeout http-request``) before a server sees it,
but only up to its buffer. So

* the **page lane** (the ``zeoclients`` backend) receives only requests whose headers and
  body fit in HAProxy's buffer and whose body is at most ``upload-threshold`` bytes: a body
  that trickles is cut with 408 by HAProxy and never takes a Zope thread;
* the **upload lane** (the ``uploads`` backend) receives every larger body, streamed, and
  must run a server that reads the whole body itself (spooling it to disk) before a worker
  thread sees the request: waitress does (``inbuf_overflow``, 512 KiB, then a temporary
  file); pyruvate reads bodies into memory and the other servers hand the socket to a thread.
"""
import ipaddress
import re

#: HAProxy 2.6's ``tune.bufsize`` and ``tune.maxrewrite`` (Debian's build: ``haproxy -vv``).
HAPROXY_BUFSIZE = 16384
HAPROXY_MAXREWRITE = 1024
#: Most bytes of request (headers and body) HAProxy can hold while it waits for the body.
BUFFERABLE = HAPROXY_BUFSIZE - HAPROXY_MAXREWRITE

#: WSGI servers that read a request body completely (to disk above 512 KiB) before any
#: worker thread sees the request: the only servers allowed in the upload lane.
SPOOLING_SERVERS = ("waitress",)

#: Default ``upload-threshold`` (bytes): larger bodies go to the upload lane. Big enough for
#: Plone's login and edit forms of a page, small enough to leave room for headers in
#: HAProxy's buffer (BUFFERABLE).
DEFAULT_UPLOAD_THRESHOLD = 8192

#: Default ``max-request-body-size`` (bytes) of a ZEO client: 1 GiB for servers that spool
#: bodies to disk (plone.recipe.zope2instance's default, waitress' limit); 1 MiB for the
#: others, which hold a body in memory: 1 MiB is Zope's own ``form-memory-limit``, the most
#: Zope itself reads into memory as ``request["BODY"]``; larger bodies are uploads.
SPOOLING_BODY_CAP = 1024 ** 3
MEMORY_BODY_CAP = 1024 ** 2

_NAME_RE = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
                      r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def default_body_cap(wsgi_server):
    """Default ``max-request-body-size`` in bytes for a ZEO client on ``wsgi_server``."""
    return SPOOLING_BODY_CAP if wsgi_server in SPOOLING_SERVERS else MEMORY_BODY_CAP


def body_limit_errors(max_body_size, upload_threshold, page_servers, upload_servers):
    """Check the site's body limits together; return a list of error messages (empty: fine).

    ``max_body_size``: largest body HAProxy accepts (bytes, option ``max-body-size``);
    ``upload_threshold``: bodies above it go to the upload lane (bytes);
    ``page_servers`` / ``upload_servers``: lists of ``{"name", "wsgi_server", "max_body"}``
    (``max_body``: the client's ``max-request-body-size`` in bytes) of each lane; an empty
    upload lane means every accepted body goes to the page lane. Each message names the
    options involved and what would be consistent.
    """
    errors = []
    if upload_threshold > BUFFERABLE:
        errors.append(
            f"upload-threshold = {upload_threshold} is larger than HAProxy can buffer with the "
            f"headers (tune.bufsize {HAPROXY_BUFSIZE} - tune.maxrewrite {HAPROXY_MAXREWRITE} = "
            f"{BUFFERABLE} bytes): expected at most {BUFFERABLE}")
    if upload_servers:
        page_bound = min(upload_threshold, max_body_size)
        if upload_threshold >= max_body_size:
            errors.append(
                f"upload-threshold = {upload_threshold} must be smaller than max-body-size = "
                f"{max_body_size}, or the upload lane receives nothing")
    else:
        page_bound = max_body_size
    for server in page_servers:
        if server["max_body"] < page_bound:
            what = ("upload-threshold" if upload_servers else
                    "max-body-size (there is no upload lane: upload-backends is empty)")
            errors.append(
                f"[{server['name']}] max-request-body-size = {server['max_body']} is smaller than "
                f"{what} = {page_bound}, the largest body its lane sends it: raise it or lower {what.split()[0]}")
        if server["wsgi_server"] not in SPOOLING_SERVERS and page_bound > BUFFERABLE:
            errors.append(
                f"[{server['name']}] runs {server['wsgi_server']}, which holds a request body in a "
                f"worker before it has arrived, but without an upload lane it would receive bodies "
                f"up to max-body-size = {max_body_size} that HAProxy cannot buffer whole (more than "
                f"{BUFFERABLE} bytes): set upload-backends (a waitress ZEO client) or "
                f"max-body-size <= {BUFFERABLE}")
    for server in upload_servers:
        if server["wsgi_server"] not in SPOOLING_SERVERS:
            errors.append(
                f"[{server['name']}] is in upload-backends but runs {server['wsgi_server']}: the "
                f"upload lane needs a server that spools bodies to disk before a thread takes "
                f"the request, one of: {', '.join(SPOOLING_SERVERS)}")
        if server["max_body"] < max_body_size:
            errors.append(
                f"[{server['name']}] max-request-body-size = {server['max_body']} is smaller than "
                f"max-body-size = {max_body_size}: the upload lane must accept every body HAProxy "
                f"accepts; raise it or lower max-body-size")
    names = [s["name"] for s in page_servers]
    both = sorted(s["name"] for s in upload_servers if s["name"] in names)
    if both:
        errors.append(f"{', '.join(both)} named in both backends and upload-backends: "
                      "an upload client must not take page requests")
    return errors


def server_name_error(name):
    """Return why ``name`` is not a valid ``server-names`` entry, or None if it is.

    Allowed: a DNS host name (``www.example.org``), an IPv4 address, an IPv6 address in
    brackets (``[::1]``), each without a port (any port is accepted with it).
    """
    text = name.strip()
    if text.startswith("[") and text.endswith("]"):
        try:
            ipaddress.IPv6Address(text[1:-1])
            return None
        except ValueError:
            return f"{name!r} is not an IPv6 address in brackets"
    if ":" in text:
        return f"{name!r} has a port or is an IPv6 address without brackets: give the bare name"
    if not _NAME_RE.match(text):
        return f"{name!r} is not a host name such as www.example.org or an IPv4 address"
    return None


def host_regex(names):
    """HAProxy regex (PCRE) matching a Host header of one of ``names``, any port.

    ``names``: valid server names (see :func:`server_name_error`), compared lower-case, so
    the template matches ``req.hdr(host),lower`` against it. Returns e.g.
    ``^(127\\.0\\.0\\.1|localhost)(:[0-9]+)?$``.
    """
    alternatives = "|".join(re.escape(n.strip().lower()) for n in names)
    return f"^({alternatives})(:[0-9]+)?$"


#: Default per-source limits (recipe options ``per-source-*``, Ansible ``haproxy_per_source_*``):
#: concurrent connections, requests per period, period in seconds. A browser opens at most 6
#: connections per host over HTTP/1.1 and a Plone page view costs tens of requests; 100 and
#: 1000 per 10 s leave room for a few dozen people behind one NAT address.
DEFAULT_PER_SOURCE = {"connections": 100, "requests": 1000, "period": 10}


def template_context(server_names, upload_servers=(), upload_threshold=DEFAULT_UPLOAD_THRESHOLD,
                     per_source_exempt=(), per_source=None):
    """The edge variables of ``haproxy/haproxy.cfg.j2`` as a dict.

    ``server_names``: allowed Host names; ``upload_servers``: the upload lane (template
    ``servers`` entries); ``upload_threshold``: bytes; ``per_source_exempt``: CIDRs;
    ``per_source``: ``{"connections", "requests", "period"}`` (default DEFAULT_PER_SOURCE).
    For callers that render the template themselves (loadtests, tests); the recipe and the
    Ansible role pass the same keys.
    """
    limits = dict(DEFAULT_PER_SOURCE, **(per_source or {}))
    return {
        "server_names": list(server_names),
        "host_regex": host_regex(server_names),
        "upload_servers": list(upload_servers),
        "upload_threshold": upload_threshold,
        "per_source_exempt": list(per_source_exempt),
        "per_source_connections": limits["connections"],
        "per_source_requests": limits["requests"],
        "per_source_period": limits["period"],
    }
