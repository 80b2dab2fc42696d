"""``python -m loadtests canary-deploy RELEASE_DIR`` (``make canary CANARY_RELEASE=...``): a
canary deploy on the running buildout stack, judged by the canary's judge (issue 29, item 3).

The steps (:func:`deploy`), while ``python -m loadtests``' Locust load
(:class:`loadtests.core.locustrun.BackgroundLocust`) goes through the stack's HAProxy:

1. the canary (``--canary``, default :func:`choose`'s: the last pool client whose WSGI server
   another pool client has) serves the current build for the A/A phase (``--phase`` s);
   (after ``--settle`` s, so that a canary restarted just before is warm);
2. it is restarted drained onto ``RELEASE_DIR``'s build of the same part, on the same port
   (:func:`switch`: :func:`plonedeploy.stack.rolling.restart_client`, the steps of ``bin/stack
   restart`` and the Ansible playbooks, with the stack's supervisord running the release's
   ``bin/<canary>``), and serves it for the A/B phase, which starts ``--settle`` s later;
3. unless ``--keep``, it is restarted drained back onto the current build: locally nothing is
   promoted (the stack's other clients run from this checkout; a promote is the operator's
   next build of it, or the Ansible play's rolling restart);
4. the load stops, and :func:`loadtests.ab.canary.judge` (the same code as ``canary-judge``)
   judges HAProxy's log lines of both phases; the report (``report.md``, ``report.json``,
   ``canary.png``) goes to ``var/reports/canary-deploy-<time>/`` with the failed requests.

``RELEASE_DIR`` is another buildout of the same site (a second checkout, or a build
:func:`release_config` writes) that uses this stack's ZEO server and data: its ``var`` a
link to this stack's ``var``, as in the Ansible releases layout (Data.fs, blobs and logs
outside the releases). :func:`check_release` refuses, before anything changes, a release
whose canary part listens elsewhere, runs another WSGI server, or has another ZEO address or
blob directory. Exit status: the judge's (0 promote, 1 rollback, 3 not enough data); 2 when it
could not run (bad options, a release that does not fit, the stack not running or not UP);
4 when requests of the load failed (the judge's verdict is in the report all the same).
"""
import configparser
import os
import sys
import time

from loadtests.ab import canary
from loadtests.core import extrabuild, haproxy_log
from loadtests.core.stack import ROOT, NotReady, default_buildout_config, load_stack
from plonedeploy.stack import rolling
from plonedeploy.stack.balancer import restart_client, server_states
from plonedeploy.stack.errors import StackError
from plonedeploy.stack.rules import canary_and_peers

#: Seconds of each phase: the judge needs MIN_WINDOWS (10) windows of 10 s in each, in which
#: both sides answered, and a window at each end may be cut short.
DEFAULT_PHASE_S = 120.0
#: Seconds of load before the A/A phase (ZODB caches, HAProxy's first picks).
DEFAULT_WARMUP_S = 20.0
#: Seconds the canary serves after each restart before a phase starts: a client just started
#: has cold caches (ZODB objects, templates), and a phase that began with them measured it, not
#: the release. canary-bench of 28 Nov 2026: an A/A phase that began at the restart of the
#: deploy before it had the canary's page Tr p50 up to 2.1× its comparison's, a floor under which
#: a 50 ms slower release (1.70×) was promoted. With 60 s (canary-bench of 28 Nov 17:21, 10
#: deploys) the page limits were 1.13-1.31× in 9 and 2.67× in one (load average 4-6): enough
#: mostly, not always (docs/explanation/canary.md#sensitivity).
DEFAULT_SETTLE_S = 60.0
#: Locust users: closed loop, enough to keep both pyruvate clients' 2 threads busy on 2 cores.
DEFAULT_USERS = 6
#: The locustfile's shapes: all three are the judge's class ``page`` (``@json`` asks by the
#: Accept header). No blob: 5 MiB downloads on 2 cores starve the pages, and with fewer than
#: 200 blob requests a side the verdict is "not enough data", never a promote.
DEFAULT_WEIGHTS = "root=1,plone=1,json=1"
#: Classes judged: the write lane sends every write to the pool's first client, so writes
#: have no comparison (docs/explanation/canary.md, "What it cannot see").
DEFAULT_CLASSES = ("page", "json", "blob")
#: Exit status when requests of the load failed.
EXIT_FAILED_REQUESTS = 4
#: Where :func:`release_config`'s builds go (git-ignored var/ of the checkout).
RELEASES_DIR = os.path.join(ROOT, "var", "canary-releases")


class CanaryError(RuntimeError):
    """A canary deploy that cannot run: the message names the option or the fact."""


def choose(stack, canary=None):
    """``(canary, [comparison clients])`` of the pool (stack.json's ``servers``, their WSGI
    server ``clients[name]["server"]``). The comparison: every other pool client of the
    canary's WSGI server (the judge compares like with like). ``canary`` None: the last pool
    client that has such a peer (the write lane's first client keeps the writes). Raises
    CanaryError naming the clients and their servers when there is none."""
    pool = stack["servers"]
    kinds = {name: stack["clients"][name]["server"] for name in pool}
    listing = ", ".join(f"{name} ({kind})" for name, kind in kinds.items())
    if canary is not None and canary not in pool:
        raise CanaryError(f"--canary {canary!r} is not a client of the pool: {listing}")
    chosen = canary_and_peers(kinds, [canary] if canary else list(reversed(pool)))
    if chosen:
        return chosen
    raise CanaryError(f"the canary needs a comparison client of its own WSGI server in the pool, which has {listing}: "
                      "add one (a part '<= instance' in [haproxy] backends) or set one client's wsgi-server")


def installed_options(directory, part):
    """The options zc.buildout recorded for ``part`` in ``directory/.installed.cfg`` (a dict of
    str). Raises CanaryError when the build or the part is not there."""
    path = os.path.join(directory, ".installed.cfg")
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    if not parser.read(path):
        raise CanaryError(f"{directory} is no buildout that ran: no {path}")
    if not parser.has_section(part):
        raise CanaryError(f"{directory} has no part {part!r} installed ({path})")
    return dict(parser[part])


def check_release(stack, directory, name):
    """The argv that runs client ``name`` of the build in ``directory``, after checking it is
    this stack's client in another build: ``bin/<name>`` exists; its ``http-address`` and
    ``wsgi-server`` are the stack's client's; its ``zeo-address`` is the stack's ZEO server's
    and its ``blob-storage`` the same directory (after links: a ``var`` link to this stack's).
    Raises CanaryError naming what differs."""
    directory = os.path.abspath(directory)
    script = os.path.join(directory, "bin", name)
    if not os.access(script, os.X_OK):
        raise CanaryError(f"{script} is missing: build the release first (bin/buildout in {directory})")
    options = installed_options(directory, name)
    client = stack["clients"][name]
    wanted = {"http-address": client["url"].split("://", 1)[1], "wsgi-server": client["server"],
              "zeo-address": stack.get("zeo_address")}
    for option, value in wanted.items():
        if value is not None and options.get(option, "").strip() != value:
            raise CanaryError(f"[{name}] {option} of the release is {options.get(option)!r}, the stack's is {value!r}: "
                              "the canary must be the same client on the same port")
    blobs = options.get("blob-storage", "").strip()
    if stack.get("blob_storage") and os.path.realpath(blobs) != os.path.realpath(stack["blob_storage"]):
        raise CanaryError(f"[{name}] blob-storage of the release is {blobs!r} ({os.path.realpath(blobs)}), not the "
                          f"stack's {stack['blob_storage']}: link the release's var to the stack's var")
    return [script, "console"]


def switch(stack, name, argv, timeout=rolling.TIMEOUT):
    """Restart client ``name`` drained onto ``argv`` (its process's command: the current
    build's, or a release's from :func:`check_release`): ``bin/stack restart``'s rolling restart
    (:func:`plonedeploy.stack.balancer.restart_client`: drain in HAProxy, restart through the
    stack's supervisord, health check, enable) of the stack's config with that one command
    changed, so supervisord's program is rewritten while the client is stopped. Prints each
    step. Returns the seconds it took. Raises rolling.RollingError or
    plonedeploy.stack.errors.StackError."""
    proc = dict(next(p for p in stack["processes"] if p["name"] == name), argv=list(argv))
    variant = dict(stack, processes=[proc if p["name"] == name else p for p in stack["processes"]])
    if variant.get("service"):
        # As root with a service user: it must reach the release's scripts too.
        variant["service"] = dict(variant["service"], reach=list(variant["service"]["reach"]) + [argv[0]])
    began = time.monotonic()
    restart_client(variant, proc, timeout)
    return time.monotonic() - began


def current_argv(stack, name):
    """The argv of client ``name`` in the stack's own build (stack.json's process)."""
    return list(next(p for p in stack["processes"] if p["name"] == name)["argv"])


def deploy(stack, name, release_argv, phase_s, keep=False, timeout=rolling.TIMEOUT, sleep=time.sleep,
           settle_s=DEFAULT_SETTLE_S):
    """One canary deploy of client ``name`` onto ``release_argv`` (module docstring, steps 1-3),
    the load running. Each phase starts ``settle_s`` seconds after the canary's last restart
    (:data:`DEFAULT_SETTLE_S`): the A/A phase after the wait, the A/B phase after the switch
    and the wait; the seconds between are in neither phase. Returns ``{"phases": {"aa": (from,
    until), "ab": (from, until)} (epoch seconds, the judge's), "switch_s": [seconds of each
    restart], "kept": keep}``. Raises as :func:`switch`; a failed switch onto the release puts
    the canary back on the current build first."""
    sleep(settle_s)
    aa_from = time.time()
    sleep(phase_s)
    aa_until = time.time()
    try:
        took = [switch(stack, name, release_argv, timeout)]
    except Exception:
        print(f"{name}: the switch to the release failed; back onto the current build", flush=True)
        switch(stack, name, current_argv(stack, name), timeout)
        raise
    sleep(settle_s)
    ab_from = time.time()
    sleep(phase_s)
    ab_until = time.time()
    if not keep:
        took.append(switch(stack, name, current_argv(stack, name), timeout))
    return {"phases": {"aa": (aa_from, aa_until), "ab": (ab_from, ab_until)}, "switch_s": took, "kept": keep}


def log_path(stack):
    """The stack's HAProxy request log (bin/stack's supervisord writes its stdout there)."""
    return os.path.join(stack["log_dir"], "haproxy.stdout.log")


def failed_lines(lines, start, end):
    """``{"requests", "errors"}`` of HAProxy log ``lines`` accepted in ``[start, end)`` (epoch
    seconds), every server, ``<NOSRV>`` too: the load's requests as HAProxy answered them, an
    error by :func:`loadtests.ab.canary.is_error` or a 503 HAProxy gave without a server."""
    out = {"requests": 0, "errors": 0}
    for line in lines:
        if start <= haproxy_log.accepted_epoch(line) < end and line["method"]:
            out["requests"] += 1
            out["errors"] += canary.is_error(line)
    return out


def release_config(release_dir, part, extends=None, added_delay=0, develop_eggs=None, service=None):
    """Text of ``release_dir/buildout.cfg``: a release of this checkout that builds ``part``
    alone, ``extends`` the stack's config (default the one it was built with), with
    ``added-delay`` ms (``plonedeploy.runtime.delay``, 0: none) and the stack's ``[service]``
    users. Its ``buildout:directory`` is ``release_dir``, whose ``var`` must be a link to the
    stack's (:func:`make_release` makes it). ``develop_eggs``: a develop-eggs directory that has
    the kit's two develop eggs already (the stack's), else they are developed again."""
    header = extrabuild.checkout_header(extends or default_buildout_config(), [part],
                                        f"Generated by loadtests.ab.canary_deploy: a canary release of {part} "
                                        f"(added-delay {added_delay} ms)", develop_eggs)
    service = extrabuild.deployed_service() if service is None else service
    lines = [f"[{part}]", f"added-delay = {int(added_delay)}"]
    lines += ["", "[service]"] + [f"{key} = {value}" for key, value in service.items()] if service else []
    return header + "\n" + "\n".join(lines) + "\n"


def make_release(release_dir, part, added_delay=0, var=os.path.join(ROOT, "var")):
    """Build the release :func:`release_config` describes in ``release_dir`` (created, its
    ``var`` a link to ``var``, the stack's); returns the seconds bin/buildout took. Raises
    RuntimeError as :func:`loadtests.core.extrabuild.build`, CanaryError when ``release_dir/var``
    exists and is not that link."""
    os.makedirs(release_dir, exist_ok=True)
    link = os.path.join(release_dir, "var")
    if not os.path.lexists(link):
        os.symlink(var, link)
    elif os.path.realpath(link) != os.path.realpath(var):
        raise CanaryError(f"{link} exists and is not a link to {var}")
    develop = os.path.join(ROOT, "develop-eggs")
    text = release_config(release_dir, part, added_delay=added_delay,
                          develop_eggs=develop if os.path.isdir(develop) else None)
    return extrabuild.build(release_dir, text, label=f"canary release {release_dir}")


def check_up(stack):
    """Raise NotReady unless HAProxy reports every client of the stack UP."""
    try:
        states = server_states(stack)
    except OSError as exc:
        raise NotReady(f"HAProxy's stats page {stack['stats_url']} does not answer ({exc}): bin/stack start") from None
    down = {name: state for name, state in states.items() if state != "UP"}
    if down or not states:
        raise NotReady(f"not every client is UP: {states}; bin/stack start (or wait-up)")


def parse_args(argv):
    from loadtests.core.cli import add_stack_arguments, new_parser

    parser = new_parser(
        "canary-deploy", "A canary deploy on the running stack under Locust load: one client serves the current "
        "build (A/A), then RELEASE_DIR's build (A/B), then the current one again; judged from HAProxy's log.",
        epilog="Exit status: 0 promote, 1 rollback, 3 not enough data (the judge's), 2 could not run, "
        f"{EXIT_FAILED_REQUESTS} requests failed. docs/explanation/canary.md.")
    parser.add_argument("release", metavar="RELEASE_DIR",
                        help="another build of this site whose var links to this stack's var (same ports)")
    parser.add_argument("--canary", metavar="CLIENT",
                        help="the canary (a pool client; default the last one with a peer of its WSGI server)")
    parser.add_argument("--phase", type=float, default=DEFAULT_PHASE_S, metavar="SECONDS",
                        help=f"seconds of the A/A and of the A/B phase each (default {DEFAULT_PHASE_S:g})")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_S, metavar="SECONDS",
                        help=f"seconds of load before the A/A phase (default {DEFAULT_WARMUP_S:g})")
    parser.add_argument("--settle", type=float, default=DEFAULT_SETTLE_S, metavar="SECONDS",
                        help=f"seconds the canary serves after a restart before a phase starts (default "
                        f"{DEFAULT_SETTLE_S:g}: a cold client is not the release)")
    parser.add_argument("--users", type=int, default=DEFAULT_USERS, help=f"Locust users (default {DEFAULT_USERS})")
    parser.add_argument("--weights", default=DEFAULT_WEIGHTS,
                        help=f"the locustfile's shapes (default {DEFAULT_WEIGHTS}: all the judge's class page)")
    parser.add_argument("--classes", default=",".join(DEFAULT_CLASSES), metavar="CLASS[,CLASS]",
                        help=f"the path classes judged (default {','.join(DEFAULT_CLASSES)}: the write lane "
                        "gives writes no comparison)")
    parser.add_argument("--keep", action="store_true",
                        help="leave the canary on the release (default: back onto the current build)")
    parser.add_argument("--timeout", type=float, default=rolling.TIMEOUT, metavar="SECONDS",
                        help=f"seconds for each step of a switch (default {rolling.TIMEOUT:g})")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    args.classes = [name for name in args.classes.split(",") if name]
    if not args.phase > 0 or args.warmup < 0 or args.settle < 0 or args.users < 1:
        parser.error("--phase must be > 0, --warmup and --settle >= 0, --users >= 1")
    return args


def main(argv=None):
    """Run one canary deploy (module docstring); returns the exit status."""
    from loadtests.ab import canary_report
    from loadtests.core.locustrun import BackgroundLocust
    from loadtests.core.reports import report_folder

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        stack = load_stack(args.stack_config)
        name, compare = choose(stack, args.canary)
        release_argv = check_release(stack, args.release, name)
        check_up(stack)
    except (CanaryError, NotReady) as exc:
        print(f"canary-deploy: {exc}", file=sys.stderr)
        return 2
    print(f"canary {name} (compared with {', '.join(compare)}): A/A {args.phase:g} s on "
          f"{current_argv(stack, name)[0]}, A/B {args.phase:g} s on {release_argv[0]}", flush=True)
    load = BackgroundLocust(stack["frontend_url"], args.weights, args.users).start()
    started = time.time()
    try:
        time.sleep(args.warmup)
        if not load.running():
            raise CanaryError("Locust exited during the warm-up")
        timeline = deploy(stack, name, release_argv, args.phase, keep=args.keep, timeout=args.timeout,
                          settle_s=args.settle)
    except (CanaryError, rolling.RollingError, StackError) as exc:
        load.stop()
        print(f"canary-deploy: {exc}", file=sys.stderr)
        return 2
    row = load.stop()
    ended = time.time()
    data = canary.judge(canary.read_lines([log_path(stack)]), name, compare, timeline["phases"],
                        classes=args.classes)
    data["settings"]["logs"] = [log_path(stack)]
    served = failed_lines(canary.read_lines([log_path(stack)]), started, ended)
    data["deploy"] = {"release": os.path.abspath(args.release), "current": current_argv(stack, name)[0],
                      "switch_s": timeline["switch_s"], "kept": timeline["kept"], "load": row, "haproxy": served}
    summary = (f"Load: {row['requests']} requests, {row['errors']} failed (Locust); HAProxy logged {served['errors']} "
               f"errors of {served['requests']}. Switches: {', '.join(f'{s:.1f} s' for s in timeline['switch_s'])}; "
               + ("the canary stays on the release (--keep)." if args.keep else
                  "the canary is back on the current build (locally nothing is promoted)."))
    folder = report_folder(args.out, "canary-deploy")
    canary_report.write(folder, data)
    with open(os.path.join(folder, "report.md"), "a", encoding="utf-8") as fp:
        fp.write(f"\n{summary}\n")
    print(canary_report.markdown(data))
    print(summary)
    print(f"report: {folder}")
    if row["errors"]:
        return EXIT_FAILED_REQUESTS
    return canary.EXIT_STATUS[data["verdict"]]

if __name__ == "__main__":
    sys.exit(main())
