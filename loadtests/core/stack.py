"""The stack's facts, as the load tools read them: where the checkout and the load tools are
(``ROOT``, ``HERE``), ``parts/stack/stack.json`` (``load_stack``), the four paths and the
blob's size, HAProxy's stats and rendered config, the stack's processes and its ZEO server;
``NotReady`` when the stack (or wrk) is not there.

Units: seconds for times, bytes for sizes, unless a name says otherwise.
"""
import json
import os
import time

import psutil

from loadtests.core import haproxy_stats


#: The load tools' folder (loadtests/, where the wrk scripts and the locustfile are) and the checkout.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(HERE)
#: The stack's contract, written by bin/buildout (the ``stack`` part).
STACK_JSON = os.path.join(ROOT, "parts", "stack", "stack.json")

#: path label -> (URL path, Accept header); the labels of the Locust tests.
PATHS = {
    "/": ("/", ""),
    "/Plone": ("/Plone", ""),
    "@json": ("/Plone", "application/json"),
    "blob": ("/Plone/blob-5mb/@@download/file", ""),
}
#: Bytes of the blob behind ``PATHS["blob"]``; scripts/create_site.py makes it this size.
BLOB_SIZE = 5 * 1024 * 1024
#: The editors' password of the locustfile's logged-in shape (scripts/create_site.py writes
#: the file, 0600); the environment variable, when set, wins (also in Locust's processes).
EDITOR_PASSWORD_FILE = os.path.join(ROOT, "var", "editor-password")
EDITOR_PASSWORD_ENV = "PLONEDEPLOY_EDITOR_PASSWORD"


def editor_password():
    """The editors' password: ``$PLONEDEPLOY_EDITOR_PASSWORD`` when set, else the contents of
    EDITOR_PASSWORD_FILE (stripped); None when neither is there or the file is empty."""
    found = os.environ.get(EDITOR_PASSWORD_ENV)
    if found:
        return found
    try:
        with open(EDITOR_PASSWORD_FILE, encoding="utf-8") as fp:
            return fp.read().strip() or None
    except FileNotFoundError:
        return None


def editor_password_missing():
    """None when the logged-in shape has a password to log in with (:func:`editor_password`),
    else why not (a str naming both sources and ``make site``)."""
    if editor_password() is not None:
        return None
    return (f"the logged-in shape needs the editors' password, ${EDITOR_PASSWORD_ENV} or {EDITOR_PASSWORD_FILE}, "
            "and neither is there or the file is empty (run scripts/create_site.py with its editors: "
            "PLONEDEPLOY_EDITORS=on make site)")


# ----------------------------------------------------------------------------- the stack

class NotReady(RuntimeError):
    """A run cannot start: the stack is not built, not running or not healthy, or wrk is
    missing. The message says which and what to run; :func:`exits_2_when_not_ready` prints
    it and exits 2."""


def load_stack(path=STACK_JSON):
    """Read the stack's facts from ``parts/stack/stack.json`` (or the file at ``path``).

    Returns the parsed dict (``processes``, ``run_dir``, ``frontend_url``, ``stats_url``,
    ``backend``, ``servers``, ``server_kinds``, ...). Raises NotReady when the file is
    missing or not JSON.
    """
    try:
        with open(path, encoding="utf-8") as fp:
            return json.load(fp)
    except FileNotFoundError:
        raise NotReady(f"{path} not found: run bin/buildout first (make build)") from None
    except (OSError, ValueError) as exc:
        raise NotReady(f"{path} unreadable ({exc}): run bin/buildout again (make build)") from None


def fetch_stats(config):
    """The rows of the stack's HAProxy stats CSV (see :func:`haproxy_stats.fetch`); raises
    NotReady when the stats page does not answer."""
    try:
        return haproxy_stats.fetch(config["stats_url"])
    except OSError as exc:
        raise NotReady(f"HAProxy stats at {config['stats_url']} not answering ({exc}): "
                       "start the stack with 'make start'") from None


def check_servers_up(config):
    """Check that the stack's HAProxy answers and reports every server of its backend UP.

    Returns the stats rows read. Raises NotReady when the stats do not answer or a
    server is not UP.
    """
    rows = fetch_stats(config)
    states = {n: r["status"] for n, r in haproxy_stats.servers(rows, config["backend"]).items()}
    if not states or any(s != "UP" for s in states.values()):
        raise NotReady(f"not every server is UP: {states}; see 'bin/stack status'")
    return rows


def default_buildout_config():
    """Path of the config the stack was built with, which extra buildouts (A/B slots, the
    blob benchmark's clients) extend.

    ``make build`` writes it to ``var/buildout-config`` (``STORAGE=relstorage`` builds
    ``relstorage.cfg``); that record counts while it is not older than ``.installed.cfg``.
    When bin/buildout ran after it, or without make: ``local.cfg`` if it exists, else
    ``buildout.cfg``.
    """
    record, installed = os.path.join(ROOT, "var", "buildout-config"), os.path.join(ROOT, ".installed.cfg")
    try:
        if os.path.getmtime(record) >= os.path.getmtime(installed):
            with open(record, encoding="utf-8") as fp:
                path = fp.read().strip()
            if os.path.exists(path):
                return path
    except OSError:
        pass
    local = os.path.join(ROOT, "local.cfg")
    return local if os.path.exists(local) else os.path.join(ROOT, "buildout.cfg")


def stack_pids(config):
    """Return ``{process name: psutil.Process}`` for the stack's running processes (as the
    stack's supervisord says: plonedeploy.stack.running_pids); processes not
    running are left out."""
    from plonedeploy.stack.supervisor import running_pids

    procs = {}
    for name, pid in running_pids(config).items():
        try:
            procs[name] = psutil.Process(pid)
        except psutil.Error:
            pass
    return procs


def running_zeo_server(config):
    """``"host:port"`` of the stack's running ZEO server, for the tools that build ZEO clients
    of their own beside the stack's (matrix, servers-wrk, scaling), checked before they build
    anything.

    ``config``: stack.json's dict (:func:`load_stack`). Raises NotReady as :func:`zeo_server`,
    and when the ZEO server's process (``zeoserver`` of stack.json) is not running.
    """
    address, _ = zeo_server(config)
    name = config.get("zeoserver") or "zeoserver"
    if name not in stack_pids(config):
        raise NotReady(f"the stack's {name} is not running: make start")
    return address


def frontend_maxconn(config):
    """Connections (int) the site's HAProxy frontend holds at once (``frontend_maxconn`` of
    stack.json), or None when the contract does not say (the Ansible role's abtest.json)."""
    return config.get("frontend_maxconn")


def client_facts(config, part):
    """``{"server", "threads", "url", "blob_sendfile", "metrics_url"}`` of the stack's ZEO
    client ``part`` (``clients`` of stack.json: wsgi-server, threads = its HAProxy maxconn
    in the page lane, base URL ``http://host:port``, whether the blobsendfile filter is
    on, Prometheus URL or None). Raises NotReady when stack.json has no such client (an
    older build: run bin/buildout again)."""
    try:
        return config["clients"][part]
    except KeyError:
        raise NotReady(f"stack.json describes no client {part!r}: run bin/buildout again (make build)") from None


def client_urls(config, parts=None):
    """``{client part: base URL without trailing /}`` for ``parts`` (default: the pool's
    ``servers``), in that order. Raises NotReady as :func:`client_facts`."""
    return {part: client_facts(config, part)["url"] for part in (config["servers"] if parts is None else parts)}


def zeo_server(config):
    """``(ZEO address "host:port", blob directory)`` of the stack, for tools that build more
    ZEO clients of it (``zeo_address``/``blob_storage`` of stack.json). Raises NotReady for
    a stack without a ZEO server (RelStorage: ``storage`` of stack.json) or an older
    stack.json."""
    if config.get("storage") == "relstorage":
        raise NotReady("the stack is built for RelStorage on PostgreSQL (relstorage.cfg), and this tool "
                       "builds ZEO clients of the stack's ZEO server, which a RelStorage build does not "
                       "have: build and start the ZEO stack (make build STORAGE=zeo; make start)")
    if not config.get("zeo_address") or not config.get("blob_storage"):
        raise NotReady("stack.json names no ZEO server and blob directory (a RelStorage stack, or "
                       "built before they were recorded: run bin/buildout again)")
    return config["zeo_address"], config["blob_storage"]


def service_user(config):
    """The stack's service user (stack.json's ``service``), or ``""`` without one: what a
    tool that builds more ZEO clients of the stack's ZEO server gives them as
    ``service-user``, so that, started as root, they write the shared blob directory as the
    ZEO server's own user (plonedeploy.runtime.access.become)."""
    return (config.get("service") or {}).get("user", "")


def render_haproxy(config, **changes):
    """Text of an HAProxy config for a variant of the stack: the project's template
    (``haproxy_template`` of stack.json, the recipe's haproxy/haproxy.cfg.j2) rendered with the variables
    the stack's HAProxy was rendered with (``haproxy_context``), each key of ``changes``
    replacing one (``balance="roundrobin"``, ``bind="127.0.0.1:8090"``, ``servers=[{"name",
    "host", "port", "maxconn", "wsgi_server"}]``, ...). Raises NotReady when stack.json has no
    ``haproxy_context`` (an older build, or the Ansible role's abtest.json), KeyError for a
    key the template does not use."""
    from plonedeploy.stack.templates import render_template

    context = config.get("haproxy_context")
    if not context or not config.get("haproxy_template"):
        raise NotReady("stack.json has no haproxy_context: run bin/buildout again (make build); "
                       "the Ansible role's abtest.json describes no HAProxy to vary")
    unknown = sorted(set(changes) - set(context))
    if unknown:
        raise KeyError(f"not a variable of {config['haproxy_template']}: {', '.join(unknown)}")
    return render_template(config["haproxy_template"], {**context, **changes})


def wait_backend_idle(config, timeout=120.0):
    """Wait until HAProxy's backend has no request queued or in progress (the previous
    run's requests are gone); return the seconds waited. Raises RuntimeError on timeout."""
    started = time.monotonic()
    while True:
        row = haproxy_stats.backend_row(haproxy_stats.fetch(config["stats_url"]), config["backend"])
        if int(row["qcur"] or 0) == 0 and int(row["scur"] or 0) == 0:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"HAProxy backend still busy after {timeout} s: "
                               f"{row['qcur']} queued, {row['scur']} in progress")
        time.sleep(0.5)
