"""``plonedeploy.recipe:haproxy`` -- HAProxy config for the ZEO clients of this buildout.

The servers come from the client parts themselves (one source of truth): for each part
named in ``backends`` its ``http-address`` gives address and port, its ``threads`` the
server's ``maxconn`` (so requests wait in HAProxy's queue, not inside Zope) and its
``wsgi-server`` a comment. Options: ``optiontables.HAPROXY`` (name, default, allowed
values, one line each; docs/reference/recipe.md's table is generated from it). The reasons behind
some of them:

- ``maxconn`` (the frontend's, also its listen backlog): a connection beyond it waits in
  the kernel's accept queue until one closes, which with keep-alive clients can be never
  (docs/explanation/edge.md#fair-queueing-under-overload); the global ``maxconn`` is 16
  more so that the stats page stays reachable.
- ``fd-limit``: every server has ``maxconn``, so HAProxy needs one descriptor per client
  connection, not the two it assumes; below its own 2 x (maxconn + 16) + 64 the config
  says ``no strict-limits`` and HAProxy logs "FD limit ... too low" once at start.
- ``upload-threshold``: HAProxy waits for a page-lane body whole (``option
  http-buffer-request``) for at most ``timeout http-request`` (10 s) before any server is
  chosen, so a trickled body gets 408 and never takes a Zope thread; larger bodies go to
  the upload lane, whose server must spool them to disk (``edge.SPOOLING_SERVERS``).
- ``write-lane``: writes one at a time (backend ``writes``,
  docs/explanation/edge.md#write-lane): a save that waits in HAProxy's queue is better than one lost to a ConflictError
  on an object that cannot resolve it (CMFUid's counter) after the last retry.
- ``tls-bind``: requests over it reach Zope through its VirtualHostMonster
  (``/VirtualHostBase/https/<Host>/...``), so every link in the page starts with
  ``https://``; the plain ``bind`` never uses the cache (the A/B comparison runs there).

Output: ``parts/<name>/haproxy.cfg`` (option ``config``); the resolved binary is in option
``binary``, the template's variables as JSON in option ``template-context`` (the stack
part copies them into stack.json). The file is only written after
``haproxy -c`` accepted it; a rejected config raises ``zc.buildout.UserError`` with
HAProxy's own message.
"""
import grp
import json
import os
import shutil
import subprocess

import zc.buildout

from plonedeploy.recipe import edge, tls, varnish
from plonedeploy.recipe.optiontables import HAPROXY, INSTANCE, DeclaredOptions
from plonedeploy.recipe.options import (
    BALANCE_ALGORITHMS,
    HAPROXY_TEMPLATE,
    check_choice,
    fail,
    find_program,
    parse_http_address,
    parse_network,
    parse_positive_int,
    parse_switch,
    render_template,
    system_user,
    template_option,
    write_checked,
)
from plonedeploy.stack.rules import check_target, fd_limit_needed


def find_haproxy(configured=None):
    """Return the path of the haproxy binary, or raise ``zc.buildout.UserError``."""
    return find_program(configured, ["haproxy", "/usr/sbin/haproxy"],
                        "haproxy binary not found (tried {tried}); install Debian's package with "
                        "'apt-get install haproxy' or set the part's haproxy option")


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
        # Reads go through the table (an undeclared option raises); writes to options.
        opts = DeclaredOptions(name, options, HAPROXY)
        names = opts.get("backends", "").split()
        if not names:
            raise zc.buildout.UserError(
                f"[{name}] backends is required: the names of the ZEO client parts"
            )
        if len(set(names)) != len(names):
            raise zc.buildout.UserError(f"[{name}] backends = {opts['backends']!r} names a part twice")
        upload_names = opts.setdefault("upload-backends").split()
        if len(set(upload_names)) != len(upload_names):
            raise zc.buildout.UserError(
                f"[{name}] upload-backends = {opts['upload-backends']!r} names a part twice")
        self.upload_maxconn = parse_positive_int(
            name, opts.setdefault("upload-maxconn"), "upload-maxconn")
        # Before the servers: where each is checked follows from it (rules.check_target).
        self.health_check = opts.setdefault("health-check")
        if not self.health_check.startswith("/") or any(c.isspace() for c in self.health_check):
            raise zc.buildout.UserError(
                f"[{name}] health-check = {self.health_check!r} is invalid: expected a path "
                "starting with / and without spaces"
            )
        self.servers = [self.client(buildout, name, "backends", part, self.health_check) for part in names]
        self.write_lane = parse_switch(name, "write-lane", opts.setdefault("write-lane"))
        self.upload_servers = [self.client(buildout, name, "upload-backends", part, self.health_check,
                                           self.upload_maxconn)
                               for part in upload_names]
        # Recorded as an option so that a change in any client part re-renders this one.
        options["servers"] = "\n".join(
            f"{s['name']} {s['host']}:{s['port']} maxconn={s['maxconn']} {s['wsgi_server']} "
            f"max-body={s['max_body']}"
            for s in self.servers + self.upload_servers
        )
        self.bind = parse_http_address(name, opts.setdefault("bind"), "bind")
        self.stats_bind = parse_http_address(
            name, opts.setdefault("stats-bind"), "stats-bind"
        )
        self.balance = check_choice(
            name, "balance", opts.setdefault("balance"), BALANCE_ALGORITHMS
        )
        self.timeout_queue = parse_positive_int(
            name, opts.setdefault("timeout-queue"), "timeout-queue"
        )
        self.max_body_size = parse_positive_int(
            name, opts.setdefault("max-body-size"), "max-body-size"
        )
        self.upload_threshold = parse_positive_int(
            name, opts.setdefault("upload-threshold"),
            "upload-threshold", f"a number of bytes, at most {edge.BUFFERABLE}")
        errors = edge.body_limit_errors(self.max_body_size, self.upload_threshold,
                                        self.servers, self.upload_servers)
        if errors:
            raise zc.buildout.UserError(
                f"[{name}] inconsistent body limits (max-body-size, upload-threshold, "
                "max-request-body-size of the clients):\n  " + "\n  ".join(errors))
        # After the body limits, which name a client put in both lanes more clearly.
        addresses = [(s["host"], s["port"]) for s in self.servers + self.upload_servers]
        if len(set(addresses)) != len(addresses):
            raise zc.buildout.UserError(f"[{name}] two backends share one http-address")
        self.server_names = self.parse_server_names(name, options)
        self.per_source = {
            key: parse_positive_int(name, opts.setdefault(f"per-source-{key}"),
                                    f"per-source-{key}")
            for key in edge.DEFAULT_PER_SOURCE
        }
        self.per_source_exempt = [
            parse_network(name, "per-source-exempt", value)
            for value in opts.setdefault("per-source-exempt").split()
        ]
        self.parse_tls(buildout, name, options)
        self.parse_cache(buildout, name, options)
        self.maxconn = parse_positive_int(name, opts.setdefault("maxconn"), "maxconn")
        self.fd_limit = parse_positive_int(name, opts.setdefault("fd-limit"), "fd-limit")
        needed = fd_limit_needed(self.maxconn, self.servers + self.upload_servers)
        if self.fd_limit < needed:
            raise zc.buildout.UserError(
                f"[{name}] fd-limit = {self.fd_limit} is too low for maxconn = {self.maxconn}: "
                f"expected at least {needed} (maxconn + 16 + the servers' maxconn + 64), or a "
                "smaller maxconn"
            )
        self.manage_networks = [
            parse_network(name, "manage-networks", value)
            for value in opts.setdefault("manage-networks").split()
        ]
        self.user, self.group = self.parse_user(name, options)
        options["template"] = template_option(name, opts, "template", "haproxy.cfg.j2",
                                              os.path.dirname(HAPROXY_TEMPLATE))
        options["location"] = os.path.join(buildout["buildout"]["parts-directory"], name)
        self.chroot = self.parse_chroot(name, options, self.user)
        options["config"] = os.path.join(options["location"], "haproxy.cfg")
        opts.setdefault(
            "run-directory", os.path.join(buildout["buildout"]["directory"], "var", "run")
        )
        options["binary"] = find_haproxy(opts.get("haproxy"))
        self.context = self.template_context()
        # JSON for the stack part (stack.json's haproxy_context); "$" escaped, since buildout
        # would read "${" in an option as a substitution.
        options["template-context"] = json.dumps(self.context, sort_keys=True).replace("$", "\\u0024")

    def template_context(self):
        """The variables of ``haproxy/haproxy.cfg.j2`` (a JSON-able dict): what ``install``
        renders, and what option ``template-context`` records for the stack part, whose
        stack.json hands it to tools that render variants (other ports or balance mode)."""
        options = self.options
        return {
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
            "write_lane": self.write_lane,
            **edge.template_context(self.server_names, self.upload_servers, self.upload_threshold,
                                    self.per_source_exempt, self.per_source),
            **tls.template_context(self.tls_bind and f"{self.tls_bind[0]}:{self.tls_bind[1]}",
                                   options["tls-certificate"] if self.tls_bind else "",
                                   self.tls_redirect, self.hsts_max_age, self.tls_redirect_exempt),
            "run_directory": options["run-directory"],
            "user": self.user,
            "group": self.group,
            "chroot": self.chroot,
            "cache_server": self.cache_server,
            "cache_fill_bind": self.cache_fill_bind,
            "cache_health_path": varnish.HEALTH_PATH,
        }

    @staticmethod
    def parse_user(name, options):
        """``(user, group)`` HAProxy drops to after binding its listeners (global ``user`` and
        ``group``; both empty: no drop). ``group`` defaults to the user's primary group.
        Raises zc.buildout.UserError naming the option when the user or group does not exist,
        is root, or a group is set without a user."""
        opts = DeclaredOptions(name, options, HAPROXY)
        user, group = opts.setdefault("user").strip(), opts.setdefault("group").strip()
        if not user:
            if group:
                fail(name, "group", group, "empty without user (the group of the user HAProxy drops to)")
            return "", ""
        entry = system_user(name, "user", user, "an existing system user such as haproxy (Debian's haproxy "
                            "package makes it; make system installs the package)")
        try:
            group_entry = grp.getgrnam(group) if group else grp.getgrgid(entry.pw_gid)
        except KeyError:
            fail(name, "group", group, "an existing group, or empty for the user's own")
        if group_entry.gr_gid == 0:
            fail(name, "group", group_entry.gr_name, "a group other than root")
        options["group"] = group_entry.gr_name
        return user, group_entry.gr_name

    @staticmethod
    def parse_chroot(name, options, user):
        """The directory HAProxy confines itself to once it has bound its listeners (global
        ``chroot``), or "" for none. ``auto`` (the default): ``parts/<name>/empty``, an empty
        directory :meth:`install` makes, when HAProxy drops to ``user``, else none; ``none``;
        or an absolute path of an existing directory, root's and writable by nobody else
        (Debian's /var/lib/haproxy), with ``user``. A chroot as root confines nothing: root
        leaves it. Raises zc.buildout.UserError naming the option otherwise."""
        value = DeclaredOptions(name, options, HAPROXY).setdefault("chroot").strip()
        if value == "none" or (value == "auto" and not user):
            return ""
        if value == "auto":
            return os.path.join(options["location"], "empty")
        allowed = ("auto, none, or with user an absolute path of an existing directory that root owns "
                   "and nobody else may write (such as /var/lib/haproxy)")
        if not user or not os.path.isabs(value) or not os.path.isdir(value):
            fail(name, "chroot", value, allowed)
        info = os.stat(value)
        if info.st_uid != 0 or info.st_mode & 0o022:
            fail(name, "chroot", value, allowed)
        return value

    @staticmethod
    def client(buildout, name, option, part, health_check, maxconn=None):
        """``{name, host, port, maxconn, wsgi_server, max_body}`` of ZEO client part ``part``,
        and ``check_addr``/``check_port`` when ``health_check`` is asked on its metrics
        address (rules.check_target).

        ``maxconn``: the client's ``threads`` (page lane) unless given (upload lane).
        Raises ``zc.buildout.UserError`` if ``part`` is not a section or its options are bad,
        or the health check is a probe and the client has no metrics address.
        """
        if part not in buildout:
            raise zc.buildout.UserError(f"[{name}] {option} names {part!r}, which is not a section")
        # The client's own options, as its recipe (instance) declares them.
        client = DeclaredOptions(part, buildout[part], INSTANCE)
        host, port = parse_http_address(part, client.get("http-address", ""))
        server = client.get("wsgi-server", "unknown")
        max_body = client.get("max-request-body-size") or str(edge.default_body_cap(server))
        try:
            target = check_target(health_check, part, client.get("metrics-address", "").strip())
        except ValueError as exc:
            raise zc.buildout.UserError(f"[{name}] health-check = {health_check}: {exc}") from None
        return {
            "name": part,
            "host": host,
            "port": port,
            "maxconn": maxconn or parse_positive_int(part, client.get("threads", "")),
            "wsgi_server": server,
            "max_body": parse_positive_int(part, max_body, "max-request-body-size", "a number of bytes"),
            **target,
        }

    def parse_tls(self, buildout, name, options):
        """Read the ``tls-*`` and ``hsts-max-age`` options; raises UserError."""
        opts = DeclaredOptions(name, options, HAPROXY)
        self.tls_bind = None
        self.tls_redirect = False
        self.tls_redirect_exempt = []
        self.hsts_max_age = 0
        text = opts.setdefault("tls-bind").strip()
        if not text:
            for key in ("tls-certificate", "tls-redirect", "tls-redirect-exempt"):
                if opts.get(key, "").strip():
                    raise zc.buildout.UserError(f"[{name}] {key} is set but tls-bind is empty: set "
                                                "tls-bind (host:port of the HTTPS listener) or remove it")
            return
        self.tls_bind = parse_http_address(name, text, "tls-bind")
        if self.tls_bind == self.bind:
            raise zc.buildout.UserError(f"[{name}] tls-bind = {text} is the same address as bind")
        self.tls_redirect = parse_switch(name, "tls-redirect", opts.setdefault("tls-redirect"))
        self.tls_redirect_exempt = [parse_network(name, "tls-redirect-exempt", value)
                                    for value in opts.setdefault("tls-redirect-exempt").split()]
        if self.tls_redirect_exempt and not self.tls_redirect:
            raise zc.buildout.UserError(f"[{name}] tls-redirect-exempt is set but tls-redirect is off: "
                                        "every plain request is served already; remove it")
        hsts = opts.setdefault("hsts-max-age").strip()
        self.hsts_max_age = 0 if hsts == "0" else parse_positive_int(
            name, hsts, "hsts-max-age", "a number of seconds such as 63072000, or 0 for no header")
        given = opts.get("tls-certificate", "").strip()
        self.tls_generate = not given
        if given:
            if not os.path.isfile(given):
                fail(name, "tls-certificate", given, "a readable PEM file with the certificate and its key")
            options["tls-certificate"] = given
        else:
            options["tls-certificate"] = os.path.join(
                buildout["buildout"]["directory"], "var", "tls", f"{name}.pem")
            if not shutil.which("openssl"):
                raise zc.buildout.UserError(
                    f"[{name}] tls-certificate is empty and openssl is not installed to make a "
                    "self-signed one: apt-get install openssl, or give tls-certificate")

    def parse_cache(self, buildout, name, options):
        """Read ``cache`` (a varnish part); sets ``cache_server`` and ``cache_fill_bind``."""
        opts = DeclaredOptions(name, options, HAPROXY)
        self.cache_server = self.cache_fill_bind = ""
        part = opts.setdefault("cache").strip()
        if not part:
            return
        if part not in buildout:
            raise zc.buildout.UserError(f"[{name}] cache names {part!r}, which is not a section")
        if not self.tls_bind:
            raise zc.buildout.UserError(
                f"[{name}] cache = {part} needs tls-bind: the cache serves the HTTPS listener "
                "(the plain bind stays uncached for the load tests)")
        cache = buildout[part]
        host, port = parse_http_address(part, cache["bind"].split()[0], "bind")
        fill = parse_http_address(part, cache["backend"], "backend")
        if fill in (self.bind, self.tls_bind, self.stats_bind):
            raise zc.buildout.UserError(
                f"[{part}] backend = {cache['backend']} is one of [{name}]'s own listeners: give "
                "HAProxy's cache-fill listener an address of its own")
        self.cache_server = f"{host}:{port}"
        self.cache_fill_bind = f"{fill[0]}:{fill[1]}"
        # Recorded so that a change of the varnish part re-renders this one.
        options["cache-server"] = self.cache_server
        options["cache-fill-bind"] = self.cache_fill_bind

    @staticmethod
    def parse_server_names(name, options):
        """The ``server-names`` list; default the host of ``bind``. Raises UserError."""
        opts = DeclaredOptions(name, options, HAPROXY)
        bind_host = opts["bind"].rpartition(":")[0]
        if "server-names" not in opts:
            if bind_host in ("0.0.0.0", "*", "[::]", "::", ""):
                raise zc.buildout.UserError(
                    f"[{name}] server-names is required when bind = {opts['bind']} listens on "
                    "all addresses: the host names the site answers to, e.g. www.example.org")
            options["server-names"] = bind_host
        names = opts["server-names"].split()
        if not names:
            fail(name, "server-names", opts["server-names"],
                 "host names such as www.example.org 127.0.0.1 (at least one)")
        for entry in names:
            error = edge.server_name_error(entry)
            if error:
                fail(name, "server-names", opts["server-names"],
                     f"host names, IPv4 addresses or [IPv6] addresses without ports ({error})")
        return names

    def install(self):
        options = self.options
        context = self.context
        if self.tls_bind and self.tls_generate and tls.needs_new(options["tls-certificate"], self.server_names):
            try:
                tls.make_self_signed(options["tls-certificate"], self.server_names)
            except tls.TLSError as exc:
                raise zc.buildout.UserError(f"[{self.name}] cannot make a self-signed certificate: {exc}")
        text = render_template(options["template"], context)
        os.makedirs(options["run-directory"], exist_ok=True)
        if context["chroot"] == os.path.join(options["location"], "empty"):
            # Empty and not writable but by its owner: what HAProxy sees after chroot().
            os.makedirs(context["chroot"], mode=0o755, exist_ok=True)
            os.chmod(context["chroot"], 0o755)
        write_checked(options["config"], text, lambda tmp: check_config(options["binary"], tmp))
        return [options["location"]]

    update = install
