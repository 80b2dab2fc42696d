"""``plonedeploy.recipe:varnish`` -- the cache tier: a VCL for Debian's varnish 7 and its command line.

Layout (docs/explanation/edge.md#cache): HAProxy's TLS frontend sends GET and HEAD requests
to varnish while varnish is UP; varnish fetches misses from HAProxy's **cache-fill
listener** (this part's ``backend``), which hands them to the same ZEO client pool. The
haproxy part that names this part in its ``cache`` option binds that listener. The plain
frontend (the load tests' :8080) never goes through the cache.

Options: ``optiontables.VARNISH`` (name, default, allowed values, one line each;
docs/reference/recipe.md's table is generated from it).

Output: ``parts/<name>/varnish.vcl``, written only after ``varnishd -C`` compiled it (a
rejected VCL raises ``zc.buildout.UserError`` with varnish's message), and the option
``argv``: the ``varnishd`` command line ``bin/stack`` runs (``shlex`` quoting; foreground,
working directory ``var/<name>``, ``-j <jail>``: with ``none`` varnishd runs as the user who
runs ``bin/stack``; with ``unix``, started as root, its manager runs as Debian's ``varnish``
and its cache process, the one that talks to clients, as ``vcache``, as the Ansible role
runs it), and ``jail-users``: the users the jail runs as (empty with ``none``), whom
``bin/stack start`` gives search permission on the way to the VCL and the working directory.
With ``metrics-address``, ``exporter-argv`` (Debian's prometheus-varnish-exporter reading
that working directory's shared memory) and ``exporter-user``: with ``unix``, Debian's
``varnishlog`` (group ``varnish``, which may read the shared memory; the Ansible role's
``varnish_exporter_user``), whom ``bin/stack`` runs the exporter as when root starts it.
"""
import os
import pwd
import re
import shlex
import shutil
import subprocess
import tempfile

import zc.buildout

from plonedeploy.recipe.optiontables import INSTANCE, VARNISH, DeclaredOptions, default_of
from plonedeploy.recipe.options import (
    check_choice,
    fail,
    find_program,
    parse_http_address,
    parse_network,
    render_template,
    template_option,
    write_checked,
)

# The defaults of the part's options (declared in optiontables.VARNISH), for the template
# context and the Ansible role's comparison.
DEFAULT_BIND = default_of(VARNISH, "bind")
DEFAULT_BACKEND = default_of(VARNISH, "backend")
DEFAULT_CACHE_SIZE = default_of(VARNISH, "cache-size")
DEFAULT_COOKIE_ALLOWLIST = tuple(default_of(VARNISH, "cookie-allowlist").split())
# Answered by varnish itself (no backend): HAProxy's health check of the cache.
HEALTH_PATH = "/_varnish/ok"
_COOKIE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_SIZE_RE = re.compile(r"^[1-9][0-9]*[KMG]$")


def template_context(part, backend, purge_networks, cookie_allowlist=DEFAULT_COOKIE_ALLOWLIST):
    """Variables of ``templates/varnish.vcl.j2``.

    ``backend`` is ``(host, port)``; ``purge_networks`` a list of CIDR strings;
    ``cookie_allowlist`` cookie names (letters, digits, ``_`` and ``-``). Returns a dict.
    Raises ValueError for an empty ``purge_networks`` (varnish refuses an empty ACL
    no better than a PURGE that nobody may send) or a cookie name a regex would misread.
    """
    if not purge_networks:
        raise ValueError("no address may PURGE: give the ZEO clients' addresses")
    bad = [name for name in cookie_allowlist if not _COOKIE_NAME_RE.match(name)]
    if bad:
        raise ValueError(f"cookie names {bad} contain characters other than letters, digits, _ and -")
    return {
        "part": part,
        "backend_host": backend[0],
        "backend_port": backend[1],
        "purge_networks": list(dict.fromkeys(purge_networks)),
        "cookie_allowlist": list(cookie_allowlist),
        "health_path": HEALTH_PATH,
    }


#: Who varnishd's ``unix`` jail runs as: the manager, then the cache process (Debian's
#: package makes both; varnishd's own defaults).
JAIL_USERS = ("varnish", "vcache")
#: Who reads the shared memory of a jailed varnishd for the exporter: Debian's varnish
#: package makes it in group varnish for varnishlog and varnishncsa.
EXPORTER_USER = "varnishlog"


def find_varnishd(configured=None):
    """Path of the varnishd binary; raises ``zc.buildout.UserError`` if there is none."""
    return find_program(configured, ["varnishd", "/usr/sbin/varnishd"],
                        "varnishd not found (tried {tried}); install Debian's package with "
                        "'apt-get install varnish' or set the part's varnishd option")


def check_vcl(varnishd, path):
    """Compile ``path`` with ``varnishd -C`` (in a scratch working directory).

    Returns None; raises ``zc.buildout.UserError`` with varnish's message when it fails.
    """
    with tempfile.TemporaryDirectory(prefix="varnish-check-") as workdir:
        result = subprocess.run([varnishd, "-C", "-j", "none", "-n", workdir, "-f", path],
                                capture_output=True, text=True, check=False)
    if result.returncode != 0:
        # On success the C source goes to stderr; on failure the message is at its end.
        raise zc.buildout.UserError(
            f"varnishd -C rejected the rendered VCL {path}:\n{result.stderr[-4000:]}")


class Recipe:
    """Varnish part; see the module docstring for its options."""

    def __init__(self, buildout, name, options):
        self.name, self.options = name, options
        # Reads go through the table (an undeclared option raises); writes to options.
        opts = DeclaredOptions(name, options, VARNISH)
        directory = buildout["buildout"]["directory"]
        self.binds = [parse_http_address(name, value, "bind")
                      for value in opts.setdefault("bind").split()]
        if not self.binds:
            fail(name, "bind", opts["bind"], f"host:port addresses such as {DEFAULT_BIND}")
        self.backend = parse_http_address(name, opts.setdefault("backend"), "backend")
        if self.backend in self.binds:
            fail(name, "backend", opts["backend"], "HAProxy's cache-fill listener, not varnish's own bind")
        clients = opts.get("clients", "").split()
        if not clients:
            raise zc.buildout.UserError(
                f"[{name}] clients is required: the ZEO client parts that may PURGE (plone.cachepurging)")
        networks = []
        for part in clients:
            if part not in buildout:
                raise zc.buildout.UserError(f"[{name}] clients names {part!r}, which is not a section")
            host, _ = parse_http_address(part, DeclaredOptions(part, buildout[part], INSTANCE).get("http-address", ""))
            networks.append(parse_network(part, "http-address", host.strip("[]")))
        networks += [parse_network(name, "purge-networks", value)
                     for value in opts.setdefault("purge-networks").split()]
        size = opts.setdefault("cache-size").strip()
        if not _SIZE_RE.match(size):
            fail(name, "cache-size", size, "a size such as 256M or 2G (K, M or G)")
        cookies = opts.setdefault("cookie-allowlist").split()
        try:
            self.context = template_context(name, self.backend, networks, cookies)
        except ValueError as exc:
            fail(name, "cookie-allowlist", opts["cookie-allowlist"], f"cookie names ({exc})")
        options["purge-acl"] = " ".join(self.context["purge_networks"])
        options["template"] = template_option(name, opts, "template", "varnish.vcl.j2")
        options["location"] = os.path.join(buildout["buildout"]["parts-directory"], name)
        options["vcl"] = os.path.join(options["location"], "varnish.vcl")
        options["workdir"] = os.path.join(directory, "var", name)
        options["binary"] = find_varnishd(opts.get("varnishd"))
        options["url"] = "http://%s:%s" % self.binds[0]
        jail = check_choice(name, "jail", opts.setdefault("jail").strip(), ("unix", "none"))
        options["jail-users"] = " ".join(JAIL_USERS) if jail == "unix" else ""
        for user in options["jail-users"].split() + ([EXPORTER_USER] if jail == "unix" else []):
            try:
                pwd.getpwnam(user)
            except KeyError:
                fail(name, "jail", jail, f"none, or unix with the users {', '.join(JAIL_USERS + (EXPORTER_USER,))}, "
                     f"which Debian's varnish package makes (make system); {user!r} does not exist")
        argv = [options["binary"], "-F", "-j", jail, "-n", options["workdir"], "-f", options["vcl"],
                "-s", f"malloc,{size}"]
        for host, port in self.binds:
            argv += ["-a", f"{host}:{port}"]
        options["argv"] = shlex.join(argv)
        metrics = opts.setdefault("metrics-address").strip()
        options["exporter-argv"] = options["exporter-user"] = ""
        if metrics:
            host, port = parse_http_address(name, metrics, "metrics-address")
            if (host, port) in self.binds or (host, port) == self.backend:
                fail(name, "metrics-address", metrics, "a host:port other than bind and backend")
            exporter = shutil.which(opts.setdefault("exporter"))
            if not exporter:
                raise zc.buildout.UserError(
                    f"[{name}] metrics-address is set but prometheus-varnish-exporter is not installed: "
                    "apt-get install prometheus-varnish-exporter, or leave metrics-address empty")
            options["metrics-url"] = f"http://{host}:{port}/metrics"
            options["exporter-argv"] = shlex.join([exporter, "-n", options["workdir"],
                                                   "-web.listen-address", f"{host}:{port}"])
            options["exporter-user"] = EXPORTER_USER if jail == "unix" else ""

    def install(self):
        options = self.options
        text = render_template(options["template"], self.context)
        write_checked(options["vcl"], text, lambda tmp: check_vcl(options["binary"], tmp))
        return [options["location"]]

    update = install
