"""Extra buildouts beside the stack, and the one way their processes start and stop.

:func:`build` writes a config into a work directory of its own and runs the checkout's
buildout on it (log, error with the output's tail); every tool that builds more ZEO
clients uses it: loadtests.ab.abslots (the A/B slot clients), loadtests.headline.offclients (the
``-off`` clients), loadtests.matrix.serverbuild (one client per server or per (server, threads):
the server tests, ``servers-wrk``, ``scaling``, the matrix). :func:`config` is the text
of the builds derived from the deployed parts: it ``extends`` the config the stack was
built with and keeps ``buildout:directory`` the checkout, so ``${buildout:directory}``
(ZEO, blob storage, logs) means the stack's own; ``.installed.cfg``, parts, bin and
develop-eggs live in the work directory (e.g. ``var/abslots``), so building it neither
uninstalls nor rewrites the stack's parts.

:func:`start` and :func:`stop` run what such a build made as bin/stack runs the stack
(plonedeploy.stack's helpers: a supervisord of the work directory's own, rendered
from the same templates at start time, stages, log, readiness probe; supervisord stops a
process group with SIGTERM, SIGKILL after 30 s), from process descriptions such as a
stack.json's or :func:`client_process`'s.
"""
import os
import subprocess
import time

import psutil

from loadtests.core.stack import ROOT
from plonedeploy.stack import balancer as stack_balancer, supervisor as stack_supervisor
from plonedeploy.stack.errors import StackError

BUILDOUT = os.path.join(ROOT, ".venv-buildout", "bin", "buildout")
#: How much of the end of stdout and of stderr a failure's message carries.
TAIL = 3000


def config(work_dir, extends, parts, sections, comment, service=None):
    """Text of the extra buildout's config: the common ``[buildout]`` header, then
    ``sections``, then the deployed stack's ``[service]`` users.

    ``work_dir``: absolute directory of the build (``.installed.cfg``, ``parts/``, ``bin/``,
    ``develop-eggs/``); ``extends``: path of the stack's config (``local.cfg`` or
    ``buildout.cfg``); ``parts``: list of part names to install; ``sections``: list of
    lines (the part sections, blank lines between them included); ``comment``: one line
    saying who generated the file, without the ``#``; ``service``: the ``[service]``
    options (``{"user": ..., "balancer-user": ...}``), default :func:`deployed_service`.
    The stack's build may have set them on bin/buildout's command line (make build does),
    which an extended config does not carry: without them, clients made ``<= instance``
    would run as root beside a ZEO server run as the service user. Returns a ``str`` of
    ``\\n``-joined lines (no trailing newline).
    """
    lines = [
        f"# {comment}",
        "[buildout]",
        f"extends = {extends}",
        f"directory = {ROOT}",
        f"installed = {os.path.join(work_dir, '.installed.cfg')}",
        f"parts-directory = {os.path.join(work_dir, 'parts')}",
        f"bin-directory = {os.path.join(work_dir, 'bin')}",
        f"develop-eggs-directory = {os.path.join(work_dir, 'develop-eggs')}",
        "parts = " + " ".join(parts),
        "",
    ]
    service = deployed_service() if service is None else service
    tail = ["", "[service]"] + [f"{key} = {value}" for key, value in service.items()] if service else []
    return "\n".join(lines + list(sections) + tail)


def deployed_service():
    """The ``[service]`` options the checkout's stack was built with, read back from its
    stack.json: ``{"user": the ZEO server's and clients' user, "balancer-user": HAProxy's}``
    (empty values: none); ``{}`` without a build."""
    from loadtests.core.stack import NotReady, load_stack, service_user

    try:
        stack = load_stack()
    except NotReady:
        return {}
    return {"user": service_user(stack), "balancer-user": stack.get("haproxy_context", {}).get("user", "")}


def checkout_header(extends, parts=None, comment=None, develop_eggs=None):
    """Text of the ``[buildout]`` section of a build that stands on its own, not derived from
    the stack's config (:func:`config` is for those): it ``extends`` the given config
    (absolute path: ``versions.cfg`` for bare client parts, ``buildout.cfg`` or
    ``relstorage.cfg`` for a whole stack), takes this checkout's recipes as develop eggs and
    its ``eggs`` directory, fetches nothing newer and picks no unpinned version. ``parts``:
    part names (list), or None to keep the extended config's; ``comment``: one line saying who
    generated the file, without the ``#``; ``develop_eggs``: a develop-eggs directory that
    holds the two develop eggs already (the tests make one per session): it is used instead
    of developing them again, which costs pip's editable install of both on every run (~8 s).
    Returns ``\n``-terminated lines; the part sections follow."""
    recipes = os.path.join(ROOT, "recipes")
    lines = ([f"# {comment}"] if comment else []) + [
        "[buildout]",
        f"extends = {extends}",
    ] + ([f"develop = {os.path.join(recipes, 'plonedeploy.recipe')} {os.path.join(recipes, 'plonedeploy.runtime')}"]
         if develop_eggs is None else ["develop =", f"develop-eggs-directory = {develop_eggs}"]) + [
        f"eggs-directory = {os.path.join(ROOT, 'eggs')}",
        "newest = false",
        "allow-picked-versions = false",
    ] + ([] if parts is None else ["parts = " + " ".join(parts)])
    return "\n".join(lines) + "\n"


def build(work_dir, text, label="extra buildout", timeout=900):
    """Write ``text`` to ``work_dir/buildout.cfg`` and run the checkout's buildout on it.

    ``work_dir``: absolute directory, created if missing; buildout runs there. ``text``: the
    config (see :func:`config`). ``label``: names the build in the error message.
    Buildout's whole output goes to ``work_dir/buildout.log`` (overwritten each time).
    Returns the seconds the run took (float; a few when nothing changed: buildout is
    idempotent). Raises RuntimeError, with the path of the config and of the log and the
    last :data:`TAIL` characters of stdout and of stderr, when buildout exits non-zero;
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds; OSError when the config or
    the log cannot be written or buildout cannot be started.
    """
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, "buildout.cfg")
    log = os.path.join(work_dir, "buildout.log")
    with open(path, "w", encoding="utf-8") as fp:
        fp.write(text)
    started = time.monotonic()
    result = subprocess.run([BUILDOUT, "-c", path], cwd=work_dir, capture_output=True, text=True,
                            timeout=timeout, check=False)
    took = time.monotonic() - started
    # A failure's message keeps only the tails; the log keeps what a tail cut off.
    with open(log, "w", encoding="utf-8") as fp:
        fp.write(result.stdout)
        fp.write(result.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"{label} {path} failed (whole output: {log}):\n"
                           f"{result.stdout[-TAIL:]}\n{result.stderr[-TAIL:]}")
    return took


# ----------------------------------------------------------------------------- start and stop

def client_process(work_dir, part, url, stage=0):
    """bin/stack's description of ZEO client ``part`` of the build in ``work_dir``: started
    as ``bin/<part> console``, ready when ``url`` (``http://host:port``) gives any HTTP
    answer, in start stage ``stage`` (processes of one stage start together)."""
    return {"name": part, "argv": [os.path.join(work_dir, "bin", part), "console"],
            "ready": {"http": url.rstrip("/") + "/"}, "stage": stage}


def run_config(work_dir, processes, stats_url=None, backend="zeoclients", servers=(), log_dir=None):
    """The dict plonedeploy.stack's start/stop helpers take for ``processes`` (dicts
    as :func:`client_process` returns, or a stack.json's): the supervisord's socket and
    pidfile in ``work_dir/run``, its config in ``work_dir/run/supervisor/`` (written by
    :func:`start`), logs in ``log_dir`` (default ``work_dir/log``), the processes run in the
    checkout; with ``stats_url`` (an HAProxy among them) :func:`start` also waits until its
    ``backend`` has ``servers`` UP."""
    config = {"run_dir": os.path.join(work_dir, "run"), "log_dir": log_dir or os.path.join(work_dir, "log"),
              "directory": ROOT, "processes": list(processes), "backend": backend, "servers": list(servers)}
    if stats_url:
        config["stats_url"] = stats_url
    return config


def start(config, names=None, timeout=300):
    """Start the processes of ``config`` (:func:`run_config`) named in ``names`` (default
    all), stage by stage as bin/stack does (under the supervisord of ``config``, started
    first if it does not run; output appended to ``<log_dir>/<name>.stdout.log``), each
    ready within ``timeout`` seconds; then, if ``config`` has a ``stats_url``, wait up to
    120 s for its servers UP. Processes already running are left alone. Returns ``{name:
    psutil.Process}`` of the named processes. Raises plonedeploy.stack.StackError
    when one does not start or become ready, after stopping those this call started."""
    chosen = [p for p in config["processes"] if names is None or p["name"] in names]
    try:
        for stage in sorted({p["stage"] for p in chosen}):
            stack_supervisor.start_stage(config, [p for p in chosen if p["stage"] == stage], timeout)
        if config.get("stats_url"):
            stack_balancer.wait_up(config, 120)
    except StackError:
        stop(config, [p["name"] for p in chosen])
        raise
    pids = stack_supervisor.running_pids(config)
    return {p["name"]: psutil.Process(pids[p["name"]]) for p in chosen}


def stop(config, names=None, timeout=stack_supervisor.STOP_WAIT + 30):
    """Stop the processes of ``config`` named in ``names`` (default all), last stage first,
    through their supervisord (SIGTERM to each process group, SIGKILL after
    ``plonedeploy.stack.supervisor.STOP_WAIT`` seconds), waiting up to ``timeout`` seconds for each; then that
    supervisord too once nothing of it runs. Those not running are skipped. Raises
    plonedeploy.stack.StackError when one is still there after ``timeout``."""
    stack_supervisor.stop_processes(config, names, timeout)
