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

The part writes ``parts/<name>/stack.json`` (the contract of :func:`contract`), the
``parts/<name>/supervisord.conf`` bin/stack runs, and the scripts ``bin/<name>`` (the program
of :mod:`plonedeploy.stack`, which documents its commands) and ``bin/supervisorctl``.
"""
import json
import os
import shlex
import sys

import zc.buildout

from plonedeploy.recipe import varnish as varnish_rules
from plonedeploy.recipe.options import fail, parse_http_address
from plonedeploy.recipe.optiontables import STACK, DeclaredOptions
from plonedeploy.recipe.service import check_service_user, service_layout
from plonedeploy.stack import rules
from plonedeploy.stack.supervisor import write_supervisor_config


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
        for option, lane, key in (("clients", clients, "servers"),
                                  ("upload-clients", upload_clients, "upload_servers")):
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
            supervisord=os.path.join(location, "supervisord"),
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
            [(self.name, "plonedeploy.stack.cli", "main")], working_set, sys.executable, bin_dir,
            arguments=repr(path))
        # supervisord with the supervisor egg on its path (bin/stack's is not a child's):
        # parts/<name>/supervisord, which bin/stack starts (stack.json's "supervisord")
        scripts += zc.buildout.easy_install.scripts(
            [("supervisord", "supervisor.supervisord", "main")], working_set, sys.executable, location)
        # supervisorctl of the stack's supervisord, its config given: bin/supervisorctl status
        scripts += zc.buildout.easy_install.scripts(
            [("supervisorctl", "supervisor.supervisorctl", "main")], working_set, sys.executable, bin_dir,
            arguments=f"['-c', {supervisord_conf!r}] + sys.argv[1:]")
        return [location] + list(scripts)

    update = install


def contract(*, haproxy, clients, part="stack", processes=(), run_dir="", log_dir="", haproxy_binary="haproxy",
             haproxy_config="", haproxy_template="", cache=None, storage="zeo", zeoserver=None, zeo_address=None,
             blob_storage=None, supervisor_config="", supervisord="", directory="", service=None):
    """The stack's facts, the dict written as ``stack.json``: the one place that says what
    the load tools and tests may know about a stack (they read it through
    ``loadtests.core``, never from haproxy.cfg or wsgi.ini).

    ``haproxy``: the variables ``haproxy/haproxy.cfg.j2`` was rendered with (the haproxy
    part's option ``template-context``: ``servers``/``upload_servers`` as dicts with
    ``name``, ``host``, ``port``, ``maxconn``, ``wsgi_server``; ``bind``, ``stats_bind``,
    ``tls_bind``, ``balance``, ``maxconn``, ``run_directory`` ...). ``clients``:
    ``{client part: {"server": wsgi-server, "threads": int, "url": "http://host:port",
    "blob_sendfile": bool, "metrics_url": URL or None}}`` for every client of both lanes.
    ``part``: the stack part's name (extra buildouts extend it with ``<=``);
    ``processes``: bin/stack's start list (``name``, ``argv``, ``ready``, ``stage``);
    ``run_dir``/``log_dir``: supervisord's socket and pidfile, HAProxy's socket, and the
    logs; ``supervisor_config``: the supervisord.conf bin/stack renders and runs (with
    ``supervisord``, the script the recipe writes that runs it);
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
        "supervisord": supervisord,
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
