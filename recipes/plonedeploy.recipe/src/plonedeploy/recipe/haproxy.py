"""``plonedeploy.recipe:haproxy`` -- HAProxy config for the ZEO clients of this buildout.

The servers come from the client parts themselves (one source of truth): for each part
named in ``backends`` its ``http-address`` gives address and port, its ``threads`` the
server's ``maxconn`` (so requests wait in HAProxy's queue, not inside Zope) and its
``wsgi-server`` a comment. Options:

``backends``
    Required; whitespace-separated names of ``plonedeploy.recipe:instance`` parts.
``bind``
    Frontend ``host:port``, default ``127.0.0.1:8080``.
``stats-bind``
    Stats page ``host:port`` (``/stats``, CSV at ``/stats;csv``), default ``127.0.0.1:8404``.
``balance``
    One of ``leastconn`` (default), ``roundrobin``, ``static-rr``, ``first``, ``random``,
    ``source``.
``health-check``
    Path of the HTTP health check, default ``/Plone/@@ok`` (a cheap view answering ``OK``;
    plain TCP checks make pyruvate log ``Incomplete request``).
``timeout-queue``
    Seconds a request may wait for a free server slot before HAProxy answers 503,
    default 60.
``max-body-size``
    Largest request body in bytes, default 1073741824 (1 GiB, Zope's own default); larger
    ones get 413 from HAProxy, chunked request bodies 411.
``maxconn``
    Client connections the site's frontend holds at once, default 10000 (also its
    ``bind ... backlog``; the kernel caps that at ``net.core.somaxconn``); the global
    ``maxconn`` is 16 more, so that the stats page stays reachable when they are all
    taken. A connection beyond it waits in the kernel's accept queue until one closes:
    with keep-alive clients that can be never (see docs/performance.md, "Fair queueing
    under overload"). The servers' own ``maxconn`` is their thread count.
``fd-limit``
    File descriptors HAProxy may use (its ``ulimit-n``), default 20000. It must not exceed
    the hard limit (``ulimit -Hn``, systemd ``LimitNOFILE``) of whoever starts HAProxy,
    and must be at least maxconn + 16 + the servers' maxconn summed + 64: every server
    has ``maxconn``, so HAProxy needs one descriptor per client connection, not the two
    it assumes (when fd-limit is below its own 2 x (maxconn + 16) + 64, the config says
    ``no strict-limits`` and HAProxy logs "FD limit ... too low" once at start).
``manage-networks``
    Whitespace-separated IPv4/IPv6 networks (CIDR or address) allowed to reach Zope's
    management screens (paths with a segment ``manage`` or ``manage_<word>``); others get 403 from
    HAProxy. Empty (default): not blocked.
``template``
    Jinja2 template, default ``${buildout:directory}/haproxy/haproxy.cfg.j2``.
``haproxy``
    The haproxy binary used for ``haproxy -c -f`` (default: ``haproxy`` on PATH, else
    ``/usr/sbin/haproxy``).

Output: ``parts/<name>/haproxy.cfg`` (option ``config``); the resolved binary is in option
``binary``. The file is only written after
``haproxy -c`` accepted it; a rejected config raises ``zc.buildout.UserError`` with
HAProxy's own message.
"""
import os
import shutil
import subprocess
import tempfile

import zc.buildout

from plonedeploy.recipe.options import (
    BALANCE_ALGORITHMS,
    check_choice,
    parse_http_address,
    parse_network,
    parse_positive_int,
    render_template,
)


def fd_limit_needed(maxconn, servers):
    """Smallest ``fd-limit`` (file descriptors) for a frontend ``maxconn``: one per client
    connection (global maxconn = maxconn + 16), one per server connection (at most each
    server's ``maxconn``), plus 64 for listeners, health checks, the stats socket and logs."""
    return maxconn + 16 + sum(s["maxconn"] for s in servers) + 64


def find_haproxy(configured=None):
    """Return the path of the haproxy binary, or raise ``zc.buildout.UserError``."""
    candidates = [configured] if configured else ["haproxy", "/usr/sbin/haproxy"]
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found
    raise zc.buildout.UserError(
        f"haproxy binary not found (tried {', '.join(candidates)}); install Debian's "
        "package with 'apt-get install haproxy' or set the part's haproxy option"
    )


def check_config(haproxy, path):
    """Run ``haproxy -c -f path``; raise ``zc.buildout.UserError`` with its output on error."""
    result = subprocess.run(
        [haproxy, "-c", "-f", path], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise zc.buildout.UserError(
            f"haproxy -c rejected the rendered config {path}:\n{result.stdout}{result.stderr}"
        )


class Recipe:
    """HAProxy config part; see the module docstring for its options."""

    def __init__(self, buildout, name, options):
        self.name, self.options = name, options
        directory = buildout["buildout"]["directory"]
        names = options.get("backends", "").split()
        if not names:
            raise zc.buildout.UserError(
                f"[{name}] backends is required: the names of the ZEO client parts"
            )
        if len(set(names)) != len(names):
            raise zc.buildout.UserError(f"[{name}] backends = {options['backends']!r} names a part twice")
        self.servers = []
        for part in names:
            if part not in buildout:
                raise zc.buildout.UserError(f"[{name}] backends names {part!r}, which is not a section")
            client = buildout[part]
            host, port = parse_http_address(part, client.get("http-address", ""))
            self.servers.append({
                "name": part,
                "host": host,
                "port": port,
                "maxconn": parse_positive_int(part, client.get("threads", "")),
                "wsgi_server": client.get("wsgi-server", "unknown"),
            })
        addresses = [(s["host"], s["port"]) for s in self.servers]
        if len(set(addresses)) != len(addresses):
            raise zc.buildout.UserError(f"[{name}] two backends share one http-address")
        # Recorded as an option so that a change in any client part re-renders this one.
        options["servers"] = "\n".join(
            f"{s['name']} {s['host']}:{s['port']} maxconn={s['maxconn']} {s['wsgi_server']}"
            for s in self.servers
        )
        self.bind = parse_http_address(name, options.setdefault("bind", "127.0.0.1:8080"), "bind")
        self.stats_bind = parse_http_address(
            name, options.setdefault("stats-bind", "127.0.0.1:8404"), "stats-bind"
        )
        self.balance = check_choice(
            name, "balance", options.setdefault("balance", "leastconn"), BALANCE_ALGORITHMS
        )
        self.health_check = options.setdefault("health-check", "/Plone/@@ok")
        if not self.health_check.startswith("/") or any(c.isspace() for c in self.health_check):
            raise zc.buildout.UserError(
                f"[{name}] health-check = {self.health_check!r} is invalid: expected a path "
                "starting with / and without spaces"
            )
        self.timeout_queue = parse_positive_int(
            name, options.setdefault("timeout-queue", "60"), "timeout-queue"
        )
        self.max_body_size = parse_positive_int(
            name, options.setdefault("max-body-size", "1073741824"), "max-body-size"
        )
        self.maxconn = parse_positive_int(name, options.setdefault("maxconn", "10000"), "maxconn")
        self.fd_limit = parse_positive_int(name, options.setdefault("fd-limit", "20000"), "fd-limit")
        needed = fd_limit_needed(self.maxconn, self.servers)
        if self.fd_limit < needed:
            raise zc.buildout.UserError(
                f"[{name}] fd-limit = {self.fd_limit} is too low for maxconn = {self.maxconn}: "
                f"expected at least {needed} (maxconn + 16 + the servers' maxconn + 64), or a "
                "smaller maxconn"
            )
        self.manage_networks = [
            parse_network(name, "manage-networks", value)
            for value in options.setdefault("manage-networks", "").split()
        ]
        options.setdefault("template", os.path.join(directory, "haproxy", "haproxy.cfg.j2"))
        options["location"] = os.path.join(buildout["buildout"]["parts-directory"], name)
        options["config"] = os.path.join(options["location"], "haproxy.cfg")
        options.setdefault(
            "run-directory", os.path.join(buildout["buildout"]["directory"], "var", "run")
        )
        options["binary"] = find_haproxy(options.get("haproxy"))

    def install(self):
        options = self.options
        context = {
            "part": self.name,
            "servers": self.servers,
            "bind": f"{self.bind[0]}:{self.bind[1]}",
            "stats_bind": f"{self.stats_bind[0]}:{self.stats_bind[1]}",
            "balance": self.balance,
            "health_check": self.health_check,
            "timeout_queue": self.timeout_queue,
            "max_body_size": self.max_body_size,
            "maxconn": self.maxconn,
            "fd_limit": self.fd_limit,
            "manage_networks": self.manage_networks,
            "run_directory": options["run-directory"],
        }
        text = render_template(options["template"], context)
        os.makedirs(options["location"], exist_ok=True)
        os.makedirs(options["run-directory"], exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=options["location"], suffix=".cfg")
        with os.fdopen(fd, "w", encoding="utf-8") as fp:
            fp.write(text)
        try:
            check_config(options["binary"], tmp)
            os.chmod(tmp, 0o644)
            os.replace(tmp, options["config"])
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return [options["location"]]

    update = install
