"""``plonedeploy.recipe:stack`` and ``bin/stack``: start, stop and inspect the whole stack.

Buildout part options (all part names of this buildout, the one source of truth):

``zeoserver``
    The plone.recipe.zeoserver part (its ``zeo-address`` and ``parts/<name>/bin/runzeo``).
``database``
    Optional; a plonedeploy.recipe:postgresql part (its ``argv`` and ``ready``), for clients
    with ``storage = relstorage``: its server starts in the ZEO server's place (stage 0,
    stopped last) and ``zeoserver`` must then be empty (relstorage.cfg).
``clients``
    Whitespace-separated plonedeploy.recipe:instance parts, started as ``bin/<part> console``
    (foreground, no debug mode, one process: the ctl script exec()s the WSGI server).
``upload-clients``
    Optional; plonedeploy.recipe:instance parts of HAProxy's upload lane (backend
    ``uploads``, the haproxy part's ``upload-backends``): started after ``clients``,
    waited for, restarted and reported like them, but not part of the A/B pool.
``haproxy``
    The plonedeploy.recipe:haproxy part (its ``config``, ``bind`` and ``stats-bind``).
``cache``
    Optional; the plonedeploy.recipe:varnish part (the haproxy part's ``cache``): its
    ``varnishd`` starts after the clients and before HAProxy, ready when it answers its
    health path; its Prometheus exporter (``metrics-address``), if any, with HAProxy.

The part writes ``parts/<name>/stack.json`` and a ``bin/<name>`` script. Usage::

    bin/stack start [NAME ...] [--no-wait-up] [--timeout SECONDS]
    bin/stack wait-up [--timeout SECONDS]
    bin/stack stop [--timeout SECONDS]
    bin/stack restart [NAME ...] [--timeout SECONDS]
    bin/stack status

Every process runs as a program of a supervisord of the stack's own (supervisor, the egg
pinned in versions.cfg; the config is rendered into ``parts/<name>/supervisord.conf`` and
``parts/<name>/supervisor.d/`` from the same templates the Ansible role process_manager
renders; its socket ``var/run/supervisor.sock``, mode 0700; ``bin/supervisorctl`` talks to
it), with stdout/stderr appended to ``var/log/<name>.stdout.log``. supervisord starts
nothing by itself (autostart = false): the order is bin/stack's. It restarts a process that
exits (autorestart), stops each process group with SIGTERM and, after 30 s, SIGKILL.

``start`` starts supervisord if it does not run, then goes in stages (processes of one
stage start together, each stage once the readiness probes of the one before answer): ZEO,
then each client in turn, then HAProxy; processes that run already are left alone. With
names it starts only those and does not wait for HAProxy's health checks (``bin/stack start
postgresql``: the database alone, for ``bin/zodbconvert`` or ``bin/postgresql restore``).
A process that exits while it starts, or a port taken by a program supervisord did not
start, fails the start, and what it started is stopped again.
``stop`` stops the processes through supervisord (HAProxy, clients, then ZEO), waiting up
to ``--timeout`` seconds for each (default 60), then shuts supervisord down. ``restart``
restarts the named processes (default: every ZEO client) one at a time; each client that
HAProxy balances goes through the rolling restart of :mod:`plonedeploy.recipe.rolling`, the
same code the Ansible playbooks run on their balancers (drained through HAProxy's runtime
API until its in-flight requests finished, put in MAINT, restarted through supervisord,
waited for until its health check path answers 200, enabled, waited for until HAProxy has
it UP), and only then is the next one touched, so a pool of two or more clients never
stops serving. Other processes are stopped and started. Exit status: 0 on success, 1 with
a message on stderr otherwise, 3 from ``status`` when not every process runs, and 141
without a message when the reader of stdout went away (``bin/stack status | head``), as
for a Unix tool killed by SIGPIPE.
"""
import argparse
import csv
import io
import json
import os
import pwd
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import zc.buildout

from plonedeploy.recipe import rolling, rules, varnish as varnish_rules
from plonedeploy.recipe.options import fail, parse_http_address, system_user
from plonedeploy.recipe.optiontables import STACK, DeclaredOptions
from plonedeploy.runtime import access


class Recipe:
    """Writes ``stack.json`` from the zeoserver, client and haproxy parts, and ``bin/stack``."""

    def __init__(self, buildout, name, options):
        self.buildout, self.name, self.options = buildout, name, options
        # Reads go through the table (an undeclared option raises); writes to options.
        opts = DeclaredOptions(name, options, STACK)
        directory = buildout["buildout"]["directory"]
        bin_dir = buildout["buildout"]["bin-directory"]
        database = opts.get("database", "").strip()
        for key in ("clients", "haproxy") + (() if database else ("zeoserver",)):
            if not opts.get(key, "").split():
                raise zc.buildout.UserError(f"[{name}] {key} is required (part names)")
        if database:
            # RelStorage clients: the database part's server takes the ZEO server's stage.
            if opts.get("zeoserver", "").strip():
                raise zc.buildout.UserError(
                    f"[{name}] zeoserver and database are both set; keep one (database = the "
                    "plonedeploy.recipe:postgresql part for clients with storage = relstorage)")
            processes = [{"name": database, "argv": json.loads(buildout[database]["argv"]),
                          "ready": json.loads(buildout[database]["ready"]), "stage": 0}]
            zeo_address = blob_storage = None
        else:
            zeo_part = opts["zeoserver"]
            zeo = buildout[zeo_part]
            zeo_host, zeo_port = parse_http_address(zeo_part, zeo["zeo-address"], "zeo-address")
            zeo_address, blob_storage = f"{zeo_host}:{zeo_port}", zeo.get("blob-storage") or None
            processes = [{
                "name": zeo_part,
                "argv": [os.path.join(buildout["buildout"]["parts-directory"], zeo_part, "bin", "runzeo")],
                "ready": {"tcp": [zeo_host, zeo_port]},
                "stage": 0,
            }]
        clients = opts["clients"].split()
        upload_clients = opts.get("upload-clients", "").split()
        overlap = set(clients) & set(upload_clients)
        if overlap:
            raise zc.buildout.UserError(
                f"[{name}] {', '.join(sorted(overlap))} in both clients and upload-clients")
        # Clients start one after the other: on an empty database each one creates the
        # Zope root at start-up, and two doing so at once end in a ConflictError.
        for stage, part in enumerate(clients + upload_clients, start=1):
            host, port = parse_http_address(part, buildout[part]["http-address"])
            processes.append({
                "name": part,
                "argv": [os.path.join(bin_dir, part), "console"],
                "ready": {"http": f"http://{host}:{port}/"},
                "stage": stage,
            })
        # Prometheus metrics of each client (metrics-address): one address per client, none
        # equal to another client's http-address, since each is a listening socket.
        metrics, listeners = {}, {}
        for part in clients + upload_clients:
            listeners[parse_http_address(part, buildout[part]["http-address"])] = f"[{part}] http-address"
        for part in clients + upload_clients:
            address = buildout[part].get("metrics-address", "").strip()
            if not address:
                continue
            key = parse_http_address(part, address, "metrics-address")
            if key in listeners:
                raise zc.buildout.UserError(
                    f"[{part}] metrics-address = {address!r} is invalid: {listeners[key]} listens there "
                    "already; give every client its own metrics-address")
            listeners[key] = f"[{part}] metrics-address"
            metrics[part] = f"http://{key[0]}:{key[1]}/metrics"
        cache = None
        cache_part = opts.get("cache", "").strip()
        if cache_part:
            if cache_part not in buildout:
                raise zc.buildout.UserError(f"[{name}] cache names {cache_part!r}, which is not a section")
            varnish = buildout[cache_part]
            cache = {
                "name": cache_part,
                "url": varnish["url"],
                # varnishstat -n <workdir> / varnishadm -n <workdir> read this instance.
                "workdir": varnish["workdir"],
                "purge_acl": varnish["purge-acl"].split(),
                # The users varnishd's unix jail runs as (none: empty), and the VCL they read.
                "jail_users": varnish.get("jail-users", "").split(),
                "vcl": varnish["vcl"],
            }
            processes.append({
                "name": cache_part,
                "argv": shlex.split(varnish["argv"]),
                "ready": {"http": varnish["url"] + varnish_rules.HEALTH_PATH},
                "stage": len(clients) + len(upload_clients) + 1,
            })
            if varnish["exporter-argv"]:
                # Reads varnish's shared memory: started once varnish is ready, with HAProxy.
                cache["metrics_url"] = varnish["metrics-url"]
                processes.append({
                    "name": f"{cache_part}-exporter",
                    "argv": shlex.split(varnish["exporter-argv"]),
                    "ready": {"http": varnish["metrics-url"]},
                    "stage": len(clients) + len(upload_clients) + 2,
                    # Who supervisord runs it as when root starts the stack (empty: root).
                    "user": varnish.get("exporter-user", ""),
                })
                cache["exporter_user"] = varnish.get("exporter-user", "")
        hap = buildout[opts["haproxy"]]
        context = json.loads(hap["template-context"])
        for option, lane, key in (("clients", clients, "servers"), ("upload-clients", upload_clients, "upload_servers")):
            backends = [s["name"] for s in context[key]]
            if backends != lane:
                raise zc.buildout.UserError(
                    f"[{name}] {option} = {' '.join(lane)!r} is invalid: expected the [{opts['haproxy']}] "
                    f"part's {'backends' if key == 'servers' else 'upload-backends'} in their order, "
                    f"{' '.join(backends)!r}")
        stats_url = f"http://{context['stats_bind']}/stats;csv"
        processes.append({
            "name": opts["haproxy"],
            "argv": [hap["binary"], "-db", "-f", hap["config"]],
            "ready": {"http": stats_url},
            "stage": len(clients) + len(upload_clients) + 2,
        })
        facts = {}
        for part in clients + upload_clients:
            client = buildout[part]
            facts[part] = {
                "server": client.get("wsgi-server", "-"),
                "threads": int(client["threads"]),
                "url": "http://%s:%s" % parse_http_address(part, client["http-address"]),
                "blob_sendfile": client.get("blob-sendfile", "off") == "on",
                "metrics_url": metrics.get(part),
            }
        service = None
        service_user = opts.setdefault("service-user").strip()
        if service_user:
            check_service_user(name, service_user)
        for part in clients + upload_clients:
            # Each client's script drops to its own service-user when root starts it (bin/<part>
            # run, fg, the load tools' extra clients): the user supervisord runs it as, or none.
            theirs = buildout[part].get("service-user", "").strip()
            if theirs != service_user:
                fail(part, "service-user", theirs,
                     f"{service_user!r}, the [{name}] service-user (bin/{part} runs as that user when "
                     "root starts it, as supervisord does; buildout.cfg sets both from [service] user)")
        if service_user:
            service = service_layout(buildout, name, service_user, None if database else opts["zeoserver"],
                                     clients + upload_clients)
        location = os.path.join(buildout["buildout"]["parts-directory"], name)
        # The ZEO server's pid-file directory (var/zeoserver/ in buildout.cfg, so that a
        # service user may own it): runzeo refuses to start when it does not exist, and
        # plone.recipe.zeoserver does not make it. Made at install, with or without a service user.
        zeo = None if database else buildout[opts["zeoserver"]]
        self.pid_directory = os.path.dirname(zeo["pid-file"]) if zeo is not None and zeo.get("pid-file") else None
        self.config = contract(
            haproxy=context, clients=facts, part=name, processes=processes,
            run_dir=os.path.join(directory, "var", "run"), log_dir=os.path.join(directory, "var", "log"),
            supervisor_config=os.path.join(location, "supervisord.conf"), directory=directory,
            haproxy_binary=hap["binary"], haproxy_config=hap["config"], haproxy_template=hap["template"],
            cache=cache, storage="relstorage" if database else "zeo", zeoserver=None if database else opts["zeoserver"],
            zeo_address=zeo_address, blob_storage=blob_storage, service=service)
        # For the [logrotate] part: logrotate refuses a log directory that a group other than
        # root may write (the service user's, see prepare_service) unless a "su" directive
        # says whom to rotate as: root, since the directory also holds files of root's (the
        # stdout logs, and the logs of extra clients run as root) that the service user may
        # not rename there. Empty without a service user (a non-root logrotate cannot "su").
        options["logrotate-su"] = "su root root" if service else ""
        options["stack-config"] = json.dumps(self.config, sort_keys=True)
        options["location"] = location
        # bin/stack runs supervisord and talks to it with supervisor's own client: the egg
        # belongs in its working set whatever the part's eggs say.
        eggs = opts.setdefault("eggs").split()
        if "supervisor" not in eggs:
            options["eggs"] = "\n".join(eggs + ["supervisor"])

    def install(self):
        import zc.recipe.egg  # only needed at install time, when buildout provides it

        location = self.options["location"]
        os.makedirs(location, exist_ok=True)
        if self.pid_directory:
            os.makedirs(self.pid_directory, exist_ok=True)
        path = os.path.join(location, "stack.json")
        with open(path, "w", encoding="utf-8") as fp:
            json.dump(self.config, fp, indent=2, sort_keys=True)
        supervisord_conf = write_supervisor_config(self.config)
        egg = zc.recipe.egg.Egg(self.buildout, self.options["recipe"], self.options)
        _, working_set = egg.working_set()
        bin_dir = self.buildout["buildout"]["bin-directory"]
        scripts = zc.buildout.easy_install.scripts(
            [(self.name, "plonedeploy.recipe.stack", "main")], working_set, sys.executable, bin_dir,
            arguments=repr(path))
        # supervisorctl of the stack's supervisord, its config given: bin/supervisorctl status
        scripts += zc.buildout.easy_install.scripts(
            [("supervisorctl", "supervisor.supervisorctl", "main")], working_set, sys.executable, bin_dir,
            arguments=f"['-c', {supervisord_conf!r}] + sys.argv[1:]")
        return [location] + list(scripts)

    update = install


def service_layout(buildout, name, user, zeo_part, clients):
    """What the service user ``user`` of stack part ``name`` runs and owns, for
    ``stack.json``'s ``service`` (see :func:`contract`): the ZEO server part ``zeo_part``
    (None on RelStorage) and the client parts ``clients`` run as it; it owns the
    directories they write (the ZEO server's Data.fs directory, blob directory and pid-file
    directory; each client's, :func:`client_layout`), their log files, the RelStorage
    passfile the clients read, and ``var/admin-password`` (scripts/create_site.py, which a
    client script run by root runs as this user, writes the generated password there); it
    needs to reach the build (:func:`build_reach`). The defaults are those of
    plone.recipe.zeoserver where a part does not set the option.

    Raises zc.buildout.UserError naming ``[name] service-user`` when the user does not exist
    or is root (:func:`check_service_user`), naming ``[<zeoserver>] pid-file`` when the pid
    file lies directly in a directory root keeps (``var/``, the buildout directory): runzeo
    replaces it there.
    """
    check_service_user(name, user)
    top = buildout["buildout"]["directory"]
    var = os.path.join(top, "var")
    directories, files, readable = [], [], []
    file_storage = blob_storage = None
    if zeo_part:
        zeo = buildout[zeo_part]
        storage = zeo.get("file-storage") or os.path.join(var, "filestorage", "Data.fs")
        pid_file = zeo.get("pid-file") or os.path.join(var, f"{zeo_part}.pid")
        if os.path.dirname(pid_file) in (top, var):
            fail(zeo_part, "pid-file", pid_file,
                 f"a file in a directory of its own with [{name}] service-user (runzeo, running as "
                 f"{user!r}, replaces it; var/ itself stays root's), e.g. ${{buildout:directory}}/var/"
                 f"{zeo_part}/{zeo_part}.pid")
        directories += [os.path.dirname(storage), os.path.dirname(pid_file)]
        if zeo.get("blob-storage"):
            directories.append(zeo["blob-storage"])
        file_storage, blob_storage = storage, zeo.get("blob-storage") or None
        files.append(zeo.get("zeo-log") or os.path.join(var, "log", f"{zeo_part}.log"))
    for part in clients:
        client = buildout[part]
        layout = client_layout(buildout, part, client)
        directories += layout["directories"]
        files += layout["files"]
        readable += layout["readable"]
    unique = lambda paths: list(dict.fromkeys(os.path.normpath(p) for p in paths))  # noqa: E731
    return {
        "user": user,
        "processes": ([zeo_part] if zeo_part else []) + list(clients),
        "directories": unique(directories),
        "files": unique(files),
        "readable": unique(readable),
        # Files it must be able to write in directories root keeps, made empty (0600) when
        # missing: scripts/create_site.py fills an empty admin-password file.
        "writable": [os.path.join(var, "admin-password")],
        "reach": build_reach(buildout),
        "file_storage": file_storage,
        "blob_storage": blob_storage,
        # Written by processes of other users too: the shared blob directory, where every ZEO
        # client of this ZEO server writes a new blob's directories itself and the server then
        # moves the file in (a client run as root without service-user, e.g. an older build's).
        "shared": [blob_storage] if blob_storage else [],
    }


def check_service_user(part, user):
    """The ``pwd`` entry of system user ``user``, option ``service-user`` of part ``part``
    (the stack's or a client's). Raises zc.buildout.UserError naming the option when the
    user does not exist or is root (:func:`plonedeploy.recipe.options.system_user`)."""
    return system_user(part, "service-user", user, "an existing system user (make demo creates 'plonedeploy': "
                       "useradd --system --user-group --home-dir /nonexistent --shell /usr/sbin/nologin plonedeploy)")


def client_layout(buildout, part, client):
    """What ZEO client part ``part`` (its options ``client``) writes and reads when it runs
    as a service user: ``{"directories", "files", "readable", "reach"}``, lists of absolute
    paths. Directories: its home ``var/<part>`` (Zope's pid file), Chameleon cache, blob
    directory or RelStorage blob cache, ``TUS_TMP_FILE_DIR``; files: its event and access
    logs; readable: the RelStorage passfile; reach: :func:`build_reach`. The defaults are
    plone.recipe.zope2instance's where the part does not set the option. Used by the stack
    (supervisord's programs) and by the instance recipe (the client's own script, which
    becomes the user when root starts it: plonedeploy.runtime.access.become)."""
    var = os.path.join(buildout["buildout"]["directory"], "var")
    client_var = client.get("var") or var
    directories = [client.get("client-home") or os.path.join(client_var, part)]
    files, readable = [], []
    environment = dict(line.strip().split(None, 1) for line in client.get("environment-vars", "").splitlines()
                       if len(line.split(None, 1)) == 2)
    cache = environment.get("CHAMELEON_CACHE")
    if cache is None:
        cache = client.get("template-cache", "on").strip()
        if cache.lower() in ("on", "1", "true", "enabled"):
            cache = os.path.join(client_var, "cache")
        elif cache.lower() in ("off", "0", "false", "disabled"):
            cache = None
    directories += [d for d in (cache, environment.get("TUS_TMP_FILE_DIR")) if d]
    if client.get("storage") == "relstorage":
        directories.append(client["relstorage-blob-dir"])
        dsn = dict(pair.split("=", 1) for pair in client["relstorage-dsn"].split() if "=" in pair)
        if dsn.get("passfile"):
            readable.append(dsn["passfile"])
    elif client.get("blob-storage"):
        directories.append(client["blob-storage"])
    for option, suffix in (("event-log", ""), ("z2-log", "-access")):
        path = client.get(option) or (client.get("access-log") if option == "z2-log" else None) \
            or os.path.join(client_var, "log", f"{part}{suffix}.log")
        if path.lower() != "disable":
            files.append(path)
    return {"directories": directories, "files": files, "readable": readable, "reach": build_reach(buildout)}


def build_reach(buildout):
    """The paths a service user must be able to reach to run from this build: the buildout
    directory, eggs, develop eggs (and the source directories their ``.egg-link`` files
    name: a build sharing the checkout's develop-eggs), the Python of the ``bin/`` scripts."""
    top = buildout["buildout"]["directory"]
    develop = [os.path.join(top, path) for path in buildout["buildout"].get("develop", "").split()]
    links = buildout["buildout"]["develop-eggs-directory"]
    for link in sorted(os.listdir(links)) if os.path.isdir(links) else ():
        if link.endswith(".egg-link"):
            with open(os.path.join(links, link), encoding="utf-8") as fp:
                develop.append(fp.readline().strip())
    reach = [top, buildout["buildout"]["eggs-directory"], buildout["buildout"]["develop-eggs-directory"],
             *develop, sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix]
    return list(dict.fromkeys(os.path.normpath(p) for p in reach))


def contract(*, haproxy, clients, part="stack", processes=(), run_dir="", log_dir="", haproxy_binary="haproxy",
             haproxy_config="", haproxy_template="", cache=None, storage="zeo", zeoserver=None, zeo_address=None,
             blob_storage=None, supervisor_config="", directory="", service=None):
    """The stack's facts, the dict written as ``stack.json``: the one place that says what
    the load tools and tests may know about a stack (they read it through
    ``loadtests.core``, never from haproxy.cfg or wsgi.ini).

    ``haproxy``: the variables ``templates/haproxy.cfg.j2`` was rendered with (the haproxy
    part's option ``template-context``: ``servers``/``upload_servers`` as dicts with
    ``name``, ``host``, ``port``, ``maxconn``, ``wsgi_server``; ``bind``, ``stats_bind``,
    ``tls_bind``, ``balance``, ``maxconn``, ``run_directory`` ...). ``clients``:
    ``{client part: {"server": wsgi-server, "threads": int, "url": "http://host:port",
    "blob_sendfile": bool, "metrics_url": URL or None}}`` for every client of both lanes.
    ``part``: the stack part's name (extra buildouts extend it with ``<=``);
    ``processes``: bin/stack's start list (``name``, ``argv``, ``ready``, ``stage``);
    ``run_dir``/``log_dir``: supervisord's socket and pidfile, HAProxy's socket, and the
    logs; ``supervisor_config``: the supervisord.conf bin/stack renders and runs;
    ``directory``: the buildout directory, where the processes run; ``haproxy_binary``/``haproxy_config``/
    ``haproxy_template``: paths; ``cache``: the cache tier's dict or None;
    ``storage``: ``zeo`` or ``relstorage``; ``zeoserver``: the ZEO server's process name
    (None for RelStorage); ``zeo_address``: the ZEO server's ``host:port`` and
    ``blob_storage`` its blob directory, for tools that build more ZEO clients of it (None
    for RelStorage). ``service``: None, or the service user's dict of :func:`service_layout`
    (``user``; ``processes`` that run as it when bin/stack runs as root; ``directories`` and
    ``files`` it owns; ``readable`` files it must read; ``writable`` files in root's
    directories it must write, made empty when missing; ``reach``: paths it must be able to
    reach). ``cache`` has ``jail_users``, the users varnishd's unix jail runs as (empty
    without it), and ``vcl``, the VCL they read. The A/B tool's keys come from ``rules.ab_contract``, which the Ansible
    role's abtest.json uses too.

    Returns a JSON-able dict; raises KeyError when ``haproxy`` lacks a variable named
    above or a backend server is missing from ``clients``.
    """
    servers = [s["name"] for s in haproxy["servers"]]
    upload_servers = [s["name"] for s in haproxy.get("upload_servers", [])]
    missing = [name for name in servers + upload_servers if name not in clients]
    if missing:
        raise KeyError(f"backend servers without client facts: {', '.join(missing)}")
    stats = haproxy["stats_bind"]
    document = rules.ab_contract(haproxy["servers"], haproxy.get("upload_servers", []), haproxy["bind"], stats,
                                 haproxy.get("tls_bind") or "", haproxy["balance"], run_dir)
    document.update({
        "part": part,
        "log_dir": log_dir,
        "processes": list(processes),
        "supervisor_config": supervisor_config,
        "directory": directory,
        # Connections the site's frontend holds at once (HAProxy's frontend maxconn).
        "frontend_maxconn": haproxy["maxconn"],
        # Each ZEO client: server kind, threads (= its HAProxy maxconn in the page lane),
        # base URL, whether the blobsendfile filter is on, its metrics URL.
        "clients": clients,
        # {client part: URL of its Prometheus metrics}; HAProxy's own are on stats-bind.
        "metrics": {name: c["metrics_url"] for name, c in clients.items() if c.get("metrics_url")},
        "haproxy_metrics_url": f"http://{stats}/metrics",
        # HAProxy's binary, rendered config and runtime API (drain/enable servers for a
        # rolling restart), and the template with the variables it was rendered with: a
        # tool that needs a variant (other ports, balance mode, servers) renders the
        # template with changed variables instead of editing the rendered file.
        "haproxy_binary": haproxy_binary,
        "haproxy_config": haproxy_config,
        "haproxy_socket": os.path.join(haproxy["run_directory"], "haproxy.sock"),
        "haproxy_template": haproxy_template,
        "haproxy_context": haproxy,
        # The cache tier in front of the pool on the TLS listener, or null.
        "cache": cache,
        # "zeo" or "relstorage", and the ZEO server's process or null: the load-test tools
        # that build ZEO clients of their own refuse a RelStorage stack.
        "storage": storage,
        "zeoserver": zeoserver,
        # The ZEO server and its blob directory (null for RelStorage).
        "zeo_address": zeo_address,
        "blob_storage": blob_storage,
        # Who runs ZEO and the clients when bin/stack runs as root, and what it owns; or null.
        "service": service,
    })
    return document


# --------------------------------------------------------------------------- runtime


class StackError(Exception):
    """A stack operation failed; the message says which process and why."""


#: Where bin/stack's supervisord keeps its socket: ``<run_dir>/supervisor.sock``.
SOCKET = "supervisor.sock"
#: Seconds supervisord waits after SIGTERM before it sends SIGKILL to the process group
#: (stopwaitsecs; the Ansible role's process_manager_stop_timeout).
STOP_WAIT = 30
#: A program must run this long (s) before supervisord counts it as started (startsecs): one
#: that exits sooner is retried, then FATAL, instead of being restarted in a tight loop.
START_SECONDS = 1
#: The states in which a program has a process (supervisor.states.ProcessStates names).
_ALIVE = ("STARTING", "RUNNING", "STOPPING")
#: The states in which supervisord may still start the program again (BACKOFF: between two
#: tries of a program that exited too soon): a stop must end these too.
_STOPPABLE = _ALIVE + ("BACKOFF",)


#: supervisord's umask, which its programs inherit: what they create is theirs and their
#: group's to read, nobody else's (logs, Data.fs, blobs, caches). The same as a client
#: script's that dropped to the service user (plonedeploy.runtime.access.become).
UMASK = format(access.SERVICE_UMASK, "03o")
#: Mode of the log directory with a service user: root's and its group's (the service user
#: writes its own logs there), sticky: neither may remove or replace the other's files. root
#: (supervisord) writes every program's stdout log there; the service user must not be able
#: to swap one of those for a symbolic link to a file of root's.
LOG_DIRECTORY_MODE = 0o1770


#: What ``bin/stack start`` says on stderr when root starts a stack without a service user.
ROOT_WARNING = ("bin/stack: warning: running as root without [{part}] service-user: the ZEO server and the "
                "ZEO clients run as root. Set service-user = plonedeploy (an unprivileged system user; "
                "make build SERVICE_USER=plonedeploy) and run bin/buildout again (docs/operations.md, Users).")


def service_users(config):
    """``{process name: user}`` for the processes that supervisord runs as another user:
    the ``service`` processes of ``config`` as its service user, and each process with a
    ``user`` of its own (varnish's exporter as varnishlog), when this process runs as root;
    else none (supervisord started by anyone else cannot change user, and runs everything
    as that one)."""
    if os.geteuid() != 0:
        return {}
    users = {proc["name"]: proc["user"] for proc in config["processes"] if proc.get("user")}
    service = config.get("service")
    if service:
        users.update({name: service["user"] for name in service["processes"]})
    return users


def prepare_service(config, say=None):
    """As root with a service user: give it what it needs before its programs start. The
    directories it writes are made and owned by it (recursively: files that root wrote
    meanwhile, e.g. by bin/restore or bin/instance fg, become its own again); its log files
    (and their rotations) and the files it reads (the RelStorage passfile) too, where they
    exist; the files it writes in root's directories (``writable``: var/admin-password) are
    made empty (0600) when missing and are its own; the log directory becomes root's and its group's, sticky (:data:`LOG_DIRECTORY_MODE`),
    and root's own logs in it (supervisord.log, every program's stdout log) are made plain
    files of root's, so that supervisord never opens a link the service user put there;
    and it gets search permission on the way to the build (:func:`access.grant_search`).
    Symbolic links are never followed (``lchown``). Does nothing without a service user or
    when not root. ``say``: prints what it did (default print). Raises StackError when the
    user is missing or cannot reach the build."""
    service = config.get("service")
    if not service or os.geteuid() != 0:
        return
    say = say or (lambda line: print(line, flush=True))
    user = service["user"]
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise StackError(f"service-user {user!r} does not exist (make demo creates 'plonedeploy'); "
                         "create it or build without service-user") from None
    uid, gid = entry.pw_uid, entry.pw_gid
    log_dir = config["log_dir"]
    os.makedirs(log_dir, exist_ok=True)
    os.chown(log_dir, 0, gid)
    os.chmod(log_dir, LOG_DIRECTORY_MODE)
    for name in ["supervisord"] + [p["name"] for p in config["processes"]]:
        path = os.path.join(log_dir, "supervisord.log" if name == "supervisord" else f"{name}.stdout.log")
        info = os.lstat(path) if os.path.lexists(path) else None
        if info is not None and (not os.path.isfile(path) or os.path.islink(path) or info.st_uid != 0):
            os.unlink(path)  # root may, in its sticky directory; a link or foreign file is not ours
            info = None
        if info is None:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640))
    access.make_missing(service.get("writable", []), 0o600)
    access.own(uid, gid, service["directories"], service["files"],
               service["readable"] + service.get("writable", []))
    _new_file_storage(service, uid, gid, say)
    for directory in service.get("shared", []):
        # A default ACL: the directories a root client makes in there are the service user's
        # to write too (ZODB makes them with the creator's umask; its blob files are 0444).
        try:
            access.default_entry(user, directory)
        except access.AccessError as exc:
            raise StackError(f"service-user {user!r}: {exc}") from exc
    try:
        access.grant_search(user, service["reach"], "it runs ZEO and the ZEO clients from this build", say)
    except (access.AccessError, OSError) as exc:
        raise StackError(f"service-user {user!r}: {exc}") from exc


def prepare_jail(config, say=None):
    """As root with varnishd in a ``unix`` jail (the cache's ``jail_users``, and its
    ``exporter_user`` that reads the shared memory): give each of those users search
    permission on the way to the VCL and the working directory
    (:func:`access.grant_search`; a checkout under a mode-0700 directory stops them there).
    Does nothing else, and nothing when not root or without such a jail. ``say``: prints
    what it granted (default print). Raises StackError when a user cannot reach them."""
    cache = config.get("cache") or {}
    if os.geteuid() != 0 or not cache.get("jail_users"):
        return
    for user in cache["jail_users"] + ([cache["exporter_user"]] if cache.get("exporter_user") else []):
        try:
            access.grant_search(user, [cache["workdir"], cache["vcl"]], "varnishd's jail runs as it",
                                say or (lambda line: print(line, flush=True)))
        except (access.AccessError, OSError, KeyError) as exc:
            raise StackError(f"varnish jail user {user!r}: {exc}") from exc


#: The first bytes of a FileStorage (ZODB._compat.FILESTORAGE_MAGIC, FileStorage's
#: packed_version: "FS30" on Python 3; "FS21" was Python 2's, which ZODB 6 refuses with
#: FileStorageFormatError): what FileStorage itself writes into a new Data.fs, an empty database.
FILE_STORAGE_MAGIC = b"FS30"


def _new_file_storage(service, uid, gid, say):
    """A fresh build: no Data.fs yet. FileStorage would create it and first remove and make
    again the blob directory, whose parent (``var/``) stays root's, so the ZEO server, run as
    the service user, could do neither. Write the empty database FileStorage would write,
    owned by the service user; with blobs of an earlier database in the blob directory,
    refuse (FileStorage would delete them) and say what to do. Raises StackError."""
    path, blobs = service.get("file_storage"), service.get("blob_storage")
    if not path or os.path.lexists(path):
        return
    if blobs and os.path.isdir(blobs) and set(os.listdir(blobs)) - {".layout", "tmp"}:
        raise StackError(f"{path} is missing but {blobs} holds blobs: restore the Data.fs (bin/restore) "
                         f"or remove {blobs} to start with an empty database")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    with os.fdopen(fd, "wb") as fp:
        fp.write(FILE_STORAGE_MAGIC)
    os.chown(path, uid, gid)
    say(f"zeoserver: new empty database {path}")


def supervisor_config(config):
    """Path of the supervisord.conf of ``config`` (stack.json's ``supervisor_config``, else
    ``<run_dir>/supervisor/supervisord.conf`` for the run configs of loadtests.extrabuild)."""
    return config.get("supervisor_config") or os.path.join(config["run_dir"], "supervisor", "supervisord.conf")


def write_supervisor_config(config):
    """Render supervisord.conf and one ``supervisor.d/<name>.conf`` per process of ``config``
    from the templates the Ansible role process_manager renders too (its variables, with the
    values bin/stack needs: no autostart, since the stage order is ours; logs
    ``<log_dir>/<name>.stdout.log`` that logrotate rotates, not supervisord). Programs of
    earlier calls that ``config`` no longer has are removed. Returns the config's path;
    raises OSError when a file cannot be written, jinja2 errors on a broken template."""
    from plonedeploy.recipe.options import TEMPLATES_DIRECTORY, render_template

    path = supervisor_config(config)
    programs = os.path.join(os.path.dirname(path), "supervisor.d")
    os.makedirs(programs, exist_ok=True)
    common = {
        "ansible_managed": "Generated by plonedeploy.recipe (bin/buildout, bin/stack) from its "
                           "templates/; the Ansible role process_manager renders the same. Do not edit.",
        "process_manager_prefix": config.get("directory") or os.getcwd(),
        "process_manager_supervisor_config": path,
        "process_manager_supervisor_socket": os.path.join(config["run_dir"], SOCKET),
        "process_manager_run_directory": config["run_dir"],
        "process_manager_log_directory": config["log_dir"],
        "process_manager_supervisor_programs": programs,
        "process_manager_supervisor_logfile_maxbytes": 0,
        "process_manager_stop_timeout": STOP_WAIT,
    }
    if config.get("service"):
        # Files the programs and supervisord create (logs, data, caches): no access for others.
        common["process_manager_supervisor_umask"] = UMASK
    filters = {"quote": shlex.quote}
    wanted = set()
    users = service_users(config)
    for proc in config["processes"]:
        name = f"{proc['name']}.conf"
        wanted.add(name)
        text = render_template(os.path.join(TEMPLATES_DIRECTORY, "program.conf.j2"), dict(
            common, process_manager_program_name=proc["name"], process_manager_program_command=proc["argv"],
            process_manager_program_user=users.get(proc["name"], ""),
            process_manager_program_directory=common["process_manager_prefix"],
            process_manager_program_autostart=False, process_manager_program_startsecs=START_SECONDS,
            process_manager_program_logfile=os.path.join(config["log_dir"], f"{proc['name']}.stdout.log"),
            process_manager_program_logfile_maxbytes=0, process_manager_program_logfile_backups=0), filters)
        _write_if_changed(os.path.join(programs, name), text)
    for name in os.listdir(programs):
        if name.endswith(".conf") and name not in wanted:
            os.unlink(os.path.join(programs, name))
    _write_if_changed(path, render_template(os.path.join(TEMPLATES_DIRECTORY, "supervisord.conf.j2"), common, filters))
    return path


def _write_if_changed(path, text):
    try:
        with open(path, encoding="utf-8") as fp:
            if fp.read() == text:
                return
    except OSError:
        pass
    with open(path, "w", encoding="utf-8") as fp:
        fp.write(text)


def _supervisor(config):
    """supervisord's XML-RPC namespace ``supervisor`` over its unix socket (supervisor's own
    transport). A call raises OSError when supervisord does not run, xmlrpc.client.Fault
    when it refuses (e.g. BAD_NAME)."""
    import xmlrpc.client

    from supervisor.xmlrpc import SupervisorTransport

    transport = SupervisorTransport(None, None, "unix://" + os.path.join(config["run_dir"], SOCKET))
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport).supervisor


def _infos(config):
    """``{program name: supervisor's process info}``; {} when supervisord does not run."""
    try:
        return {info["name"]: info for info in _supervisor(config).getAllProcessInfo()}
    except OSError:
        return {}


def running_pids(config):
    """``{process name: PID}`` of the processes of ``config`` that run now, as their
    supervisord says (a process it is starting or stopping counts); the others are left out."""
    infos = _infos(config)
    return {p["name"]: infos[p["name"]]["pid"] for p in config["processes"]
            if p["name"] in infos and infos[p["name"]]["statename"] in _ALIVE and infos[p["name"]]["pid"]}


def read_pid(config, name):
    """Return the PID of process ``name`` if it runs under the stack's supervisord, else None."""
    return running_pids(config).get(name)


def _supervisord_argv(path):
    """supervisord of the supervisor egg this module imports, with ``-c path``. Its
    distribution directory goes first on sys.path of that Python only, not into PYTHONPATH,
    which every program would inherit from supervisord."""
    import supervisor

    where = os.path.dirname(os.path.dirname(os.path.abspath(supervisor.__file__)))
    code = f"import sys; sys.path.insert(0, {where!r}); from supervisor.supervisord import main; main()"
    return [sys.executable, "-c", code, "-c", path]


def ensure_supervisord(config, timeout=30.0):
    """Write the supervisor config of ``config``, start its supervisord if it does not run,
    else make it load what changed (``supervisorctl update``: new programs added, changed or
    removed ones that are not running replaced or dropped; a running one keeps its old
    command until it stops). Returns the XML-RPC namespace. Raises StackError when
    supervisord exits or does not answer within ``timeout`` seconds."""
    path = write_supervisor_config(config)
    # A proxy whose call failed is spent (its connection stays half-used): a new one per try.
    try:
        _supervisor(config).getState()
    except OSError:
        pass
    else:
        rpc = _supervisor(config)
        _update(config, rpc)
        return rpc
    os.makedirs(config["run_dir"], exist_ok=True)
    os.makedirs(config["log_dir"], exist_ok=True)
    with tempfile.TemporaryFile() as out:
        # supervisord forks into the background: the parent exits once the config is read.
        status = subprocess.run(_supervisord_argv(path), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, timeout=timeout, check=False).returncode
        out.seek(0)
        said = out.read().decode("utf-8", "replace")
    if status:
        raise StackError(f"supervisord -c {path}: exited with status {status}\n{said}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            if _supervisor(config).getState()["statename"] == "RUNNING":
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            log = os.path.join(config["log_dir"], "supervisord.log")
            raise StackError(f"supervisord -c {path}: not answering after {timeout} s\n{said}{_tail(log)}")
        time.sleep(0.2)
    rpc = _supervisor(config)
    print(f"supervisord: started pid {rpc.getPID()}, config {path}", flush=True)
    return rpc


def _update(config, rpc):
    added, changed, removed = rpc.reloadConfig()[0]
    alive = {name for name, info in _infos(config).items() if info["statename"] in _ALIVE}
    for name in changed + removed:
        if name not in alive:
            if rpc.getProcessInfo(name)["statename"] == "BACKOFF":
                rpc.stopProcess(name)
            rpc.removeProcessGroup(name)
    for name in added + [n for n in changed if n not in alive]:
        rpc.addProcessGroup(name)


def _probe(ready, timeout=2.0):
    """Return True if the readiness probe answers: a command exiting 0 (checked first), a
    TCP connect, or any HTTP response."""
    if "command" in ready:
        try:
            return subprocess.run(ready["command"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=timeout + 3, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False
    if "tcp" in ready:
        host, port = ready["tcp"]
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            return False
    try:
        with urllib.request.urlopen(ready["http"], timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means the server is serving
    except (OSError, ValueError):
        return False


def _port_of(ready):
    if "tcp" in ready:
        return tuple(ready["tcp"])
    host_port = ready["http"].split("/")[2]
    host, port = host_port.rsplit(":", 1)
    return host, int(port)


def _log_of(config, name):
    return os.path.join(config["log_dir"], f"{name}.stdout.log")


def start_stage(config, procs, timeout):
    """Start ``procs`` together under the supervisord of ``config`` (started first if it
    does not run), then wait until each one's readiness probe answers. Processes that run
    already are left alone.

    Raises StackError if a port is taken by a program supervisord did not start, or if one
    exits (supervisord would restart it: autorestart) or is not ready within ``timeout`` s
    (the last lines of its log are in the message).
    """
    import xmlrpc.client

    prepare_service(config)  # before supervisord opens a log: the log directory's mode first
    prepare_jail(config)
    rpc = ensure_supervisord(config)
    started = time.monotonic()
    waiting = {}  # name -> (proc, the PID it got, once seen)
    for proc in procs:
        name = proc["name"]
        info = rpc.getProcessInfo(name)
        if info["statename"] in _ALIVE:
            print(f"{name}: already running (pid {info['pid']})")
            continue
        if info["statename"] == "BACKOFF":  # a crash loop of an earlier run: ours to end
            rpc.stopProcess(name)
        if _probe(proc["ready"], timeout=1.0):
            host, port = _port_of(proc["ready"])
            raise StackError(f"{name}: {host}:{port} is already in use by another program")
        try:
            rpc.startProcess(name, False)
        except xmlrpc.client.Fault as exc:
            raise StackError(f"{name}: supervisord did not start it: {exc.faultString}\n"
                             f"{_tail(_log_of(config, name))}") from exc
        print(f"{name}: starting, log {_log_of(config, name)}", flush=True)
        waiting[name] = (proc, None)
    while waiting:
        for name, (proc, pid) in list(waiting.items()):
            info = rpc.getProcessInfo(name)
            # Exited, or exited and restarted by supervisord in between two looks.
            if info["statename"] not in _ALIVE or (pid and info["pid"] != pid):
                # One that exits within startsecs has no status, only supervisord's word.
                why = (f"{info['statename']}: {info['spawnerr']}" if info["spawnerr"] else
                       f"status {info['exitstatus']}, {info['statename']}")
                raise StackError(f"{name}: exited ({why})\n{_tail(_log_of(config, name))}")
            waiting[name] = (proc, pid or info["pid"] or None)
            if _probe(proc["ready"]):
                print(f"{name}: ready after {time.monotonic() - started:.1f} s (pid {info['pid']})", flush=True)
                del waiting[name]
        if waiting and time.monotonic() - started > timeout:
            names = ", ".join(waiting)
            logs = "\n".join(_tail(_log_of(config, n)) for n in waiting)
            raise StackError(f"{names}: not ready after {timeout} s\n{logs}")
        if waiting:
            time.sleep(0.5)


def _tail(path, lines=15):
    try:
        with open(path, "rb") as fp:
            return b"".join(fp.readlines()[-lines:]).decode("utf-8", "replace")
    except OSError:
        return ""


def stop_process(config, name, timeout=STOP_WAIT + 30):
    """Have supervisord stop ``name`` (SIGTERM to its process group, SIGKILL to the group
    after STOP_WAIT seconds) and wait for it. Raises StackError when it still runs after
    ``timeout`` seconds, or when supervisord refuses."""
    import xmlrpc.client

    from supervisor.xmlrpc import Faults

    rpc = _supervisor(config)
    try:
        info = rpc.getProcessInfo(name)
    except (OSError, xmlrpc.client.Fault):  # no supervisord, or it does not know the name
        info = {"statename": "STOPPED", "pid": 0}
    if info["statename"] not in _STOPPABLE:
        print(f"{name}: not running")
        return
    pid, began = info["pid"], time.monotonic()
    try:
        rpc.stopProcess(name, False)
    except xmlrpc.client.Fault as exc:
        if exc.faultCode != Faults.NOT_RUNNING:  # it exited in between: stopped all the same
            raise StackError(f"{name}: supervisord did not stop it: {exc.faultString}") from exc
    while rpc.getProcessInfo(name)["statename"] in _STOPPABLE:
        if time.monotonic() - began > timeout:
            raise StackError(f"{name}: still running {timeout} s after the stop (pid {pid})")
        time.sleep(0.2)
    took = time.monotonic() - began
    how = f"killed (did not stop within {STOP_WAIT} s)" if took >= STOP_WAIT else "stopped"
    print(f"{name}: {how}" + (f" (pid {pid})" if pid else ""), flush=True)


def stop_processes(config, names=None, timeout=STOP_WAIT + 30):
    """Stop the processes of ``config`` named in ``names`` (default all), last stage first
    (:func:`stop_process`), then shut their supervisord down if nothing of it runs any
    more, and wait until it is gone. Raises StackError as stop_process, and when
    supervisord is still there ``timeout`` seconds after its shutdown."""
    import psutil

    for proc in sorted(config["processes"], key=lambda p: p["stage"], reverse=True):
        if names is None or proc["name"] in names:
            stop_process(config, proc["name"], timeout)
    infos = _infos(config)
    if not infos or any(info["statename"] in _STOPPABLE for info in infos.values()):
        return
    rpc = _supervisor(config)
    try:
        pid = rpc.getPID()
        rpc.shutdown()
    except OSError:
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        if time.monotonic() > deadline:
            raise StackError(f"supervisord: still running {timeout} s after its shutdown (pid {pid})")
        time.sleep(0.2)
    print(f"supervisord: stopped (pid {pid})", flush=True)


def all_clients(config):
    """Every ZEO client of the stack: the pool's ``servers``, then the upload lane's."""
    return config["servers"] + config.get("upload_servers", [])


def backend_of(config, name):
    """HAProxy backend of client ``name``: the pool's, or the upload lane's."""
    return config["upload_backend"] if name in config.get("upload_servers", []) else config["backend"]


def server_states(config, timeout=2.0):
    """Return ``{client name: status}`` from HAProxy's stats CSV, for every ZEO client.

    Status is HAProxy's ``status`` column (``UP``, ``DOWN``, ``MAINT``, ``UP 1/2`` ...).
    Raises OSError if the stats page does not answer.
    """
    return {name: row["status"] for name, row in _server_rows(config, timeout).items()
            if name in all_clients(config)}


def _stats_rows(config, timeout=2.0):
    """Every row of HAProxy's stats CSV as a dict; raises OSError."""
    with urllib.request.urlopen(config["stats_url"], timeout=timeout) as response:
        text = response.read().decode("utf-8")
    return list(csv.DictReader(io.StringIO(text.lstrip("# "))))


def _server_rows(config, timeout=2.0):
    """``{client name: stats CSV row}`` of each client in its own backend; raises OSError."""
    return {row["svname"]: row for row in _stats_rows(config, timeout)
            if row["svname"] in all_clients(config) and row["pxname"] == backend_of(config, row["svname"])}


def cache_state(config, timeout=2.0):
    """HAProxy's status of the cache tier's server (``UP``, ``DOWN``, ``MAINT`` ...), or None
    without a cache tier. Raises OSError if the stats page does not answer."""
    if not config.get("cache"):
        return None
    return next((row["status"] for row in _stats_rows(config, timeout)
                 if row["pxname"] == "cache" and row["svname"] == "varnish"), None)


def restart_client(config, proc, timeout=rolling.TIMEOUT):
    """Rolling restart of the ZEO client ``proc`` (a ``processes`` entry of ``config``):
    :func:`plonedeploy.recipe.rolling.restart_client`, the steps the Ansible playbooks run
    too (drain in HAProxy, restart, health check, enable), with the stop and start through
    the stack's supervisord (:func:`stop_process`, :func:`start_stage`) as the restart step.

    ``timeout``: seconds for each step (drain, start, health, UP). Raises
    rolling.RollingError from the balancer steps, StackError from the restart.
    """
    name = proc["name"]
    health_url = health_url_of(config, name)

    def restart():
        stop_process(config, name)
        start_stage(config, [proc], timeout)

    rolling.restart_client(config["haproxy_socket"], backend_of(config, name), name, restart, health_url,
                           timeout=timeout, say=lambda line: print(line, flush=True))


def health_url_of(config, name):
    """The URL of client ``name``'s health check as HAProxy asks it: its probe on the
    metrics address for a probe path (rules.check_target), else the path on its own URL."""
    path = config["haproxy_context"]["health_check"]
    if path in rules.PROBE_PATHS:
        return config["clients"][name]["metrics_url"].rsplit("/", 1)[0] + path
    return config["clients"][name]["url"] + path


def wait_up(config, timeout):
    """Wait until HAProxy reports every server UP; raise StackError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    states = {}
    while time.monotonic() < deadline:
        try:
            states = server_states(config)
        except OSError:
            states = {}
        if states and all(states.get(s) == "UP" for s in all_clients(config)):
            print("haproxy: all servers UP: " + ", ".join(all_clients(config)), flush=True)
            return
        time.sleep(1)
    answers = {name: health_answer(config, name) for name in all_clients(config) if states.get(name) != "UP"}
    raise StackError(
        f"haproxy: servers not UP after {timeout} s: {states or 'stats not answering'}; "
        f"their health checks answer: {answers}"
    )


def health_answer(config, name, timeout=2.0):
    """``"<status> <first line of the body>"`` of client ``name``'s health check now, or
    the error (for messages: why HAProxy keeps a client out)."""
    url = health_url_of(config, name)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return f"{url}: {response.status} {response.read(200).decode(errors='replace').strip()}"
    except urllib.error.HTTPError as exc:
        return f"{url}: {exc.code} {exc.read(200).decode(errors='replace').strip()}"
    except OSError as exc:
        return f"{url}: {exc}"


def _check_names(names, known):
    """Raise StackError naming every one of ``names`` that is not in ``known`` (process names)."""
    unknown = [n for n in names if n not in known]
    if unknown:
        raise StackError(f"no process {', '.join(unknown)}; processes: {', '.join(known)}")


def main(config_path, argv=None):
    """Entry point of ``bin/stack`` (``config_path``: its stack.json; ``argv``: the
    arguments, default ``sys.argv[1:]``); see the module docstring. Returns the exit
    status: 0, 1 (a StackError, message on stderr), 3 (``status``: not all running), or
    141 without a word when the reader of stdout went away (``bin/stack status | head``),
    the status of a Unix tool killed by SIGPIPE."""
    try:
        status = _command(config_path, argv)
        sys.stdout.flush()  # output to a pipe is buffered: a closed pipe shows up here
        return status
    except BrokenPipeError:
        # Python would report the same error again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _command(config_path, argv):
    """Parse ``argv`` and run one ``bin/stack`` command; returns its exit status."""
    parser = argparse.ArgumentParser(
        prog="bin/stack",
        description="Start, stop and inspect zeoserver, the ZEO clients, varnish and HAProxy "
        "under a supervisord of the stack's own (socket in var/run, logs in var/log).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start everything, wait until HAProxy has all servers UP")
    start.add_argument("names", nargs="*", metavar="NAME",
                       help="start only these processes (no waiting for HAProxy's health checks)")
    start.add_argument("--no-wait-up", action="store_true",
                       help="do not wait for the HAProxy health checks (before the site exists)")
    start.add_argument("--timeout", type=float, default=180.0,
                       help="seconds to wait for each process and for UP (default 180)")
    up = sub.add_parser("wait-up", help="wait until HAProxy reports every server UP")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds (default 120)")
    stop = sub.add_parser("stop", help="stop everything (HAProxy, clients, ZEO), then supervisord")
    stop.add_argument("--timeout", type=float, default=float(STOP_WAIT + 30),
                      help=f"seconds to wait for each process to stop (default {STOP_WAIT + 30}; "
                      f"supervisord sends SIGKILL to its process group after {STOP_WAIT})")
    restart = sub.add_parser(
        "restart", help="restart processes one at a time; ZEO clients drained in HAProxy first")
    restart.add_argument("names", nargs="*", metavar="NAME",
                         help="processes to restart (default: every ZEO client)")
    restart.add_argument("--timeout", type=float, default=rolling.TIMEOUT,
                         help=f"seconds to wait for each drain, start, health check and UP "
                         f"(default {rolling.TIMEOUT:g}, the Ansible playbooks' too)")
    sub.add_parser("status", help="print each process' PID and HAProxy's server states")
    args = parser.parse_args(argv)
    with open(config_path, encoding="utf-8") as fp:
        config = json.load(fp)
    try:
        if args.command == "start":
            _check_names(args.names, [p["name"] for p in config["processes"]])
            if os.geteuid() == 0 and not config.get("service"):
                print(ROOT_WARNING.format(part=config.get("part", "stack")), file=sys.stderr, flush=True)
            chosen = [p for p in config["processes"] if not args.names or p["name"] in args.names]
            try:
                for stage in sorted({p["stage"] for p in chosen}):
                    start_stage(config, [p for p in chosen if p["stage"] == stage], args.timeout)
                if not args.no_wait_up and not args.names:
                    wait_up(config, args.timeout)
            except StackError:
                # A half-started stack would hold ports, and supervisord would restart what
                # exited: take down what this start was to start (with names, the others
                # keep running), and supervisord with it when nothing else runs.
                stop_processes(config, [p["name"] for p in chosen])
                raise
        elif args.command == "wait-up":
            wait_up(config, args.timeout)
        elif args.command == "restart":
            by_name = {p["name"]: p for p in config["processes"]}
            names = args.names or all_clients(config)
            _check_names(names, by_name)
            for name in names:
                if name in all_clients(config):  # every client HAProxy balances, even a lane's only one
                    restart_client(config, by_name[name], args.timeout)
                else:  # ZEO, HAProxy, varnish, or a client HAProxy does not balance: plain stop and start
                    stop_process(config, name)
                    start_stage(config, [by_name[name]], args.timeout)
        elif args.command == "stop":
            stop_processes(config, timeout=args.timeout)
        else:
            running, pids = True, running_pids(config)
            for proc in config["processes"]:
                pid = pids.get(proc["name"])
                running = running and pid is not None
                print(f"{proc['name']}: {'pid %d' % pid if pid else 'not running'}")
            try:
                for server, state in server_states(config).items():
                    print(f"haproxy server {server}: {state}")
                if config.get("cache"):
                    # While it is not UP, HTTPS requests go to the pool uncached.
                    print(f"haproxy server cache/varnish: {cache_state(config)}")
            except OSError:
                print("haproxy stats: not answering")
            return 0 if running else 3
    except (StackError, rolling.RollingError) as exc:
        print(f"bin/stack {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0
