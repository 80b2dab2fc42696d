"""Run the A/B load test through HAProxy and write a report.

Usage (stack running, site created; see ``make start``)::

    .venv/bin/python -m loadtests ab [--users 10] [--spawn-rate 10] [--duration 60]
        [--weights root=1,plone=1,json=1,blob=1[,logged-in=1]] [--out var/reports]
        [--balance leastconn,roundrobin [--rounds 1] [--balancer-port PORT]]
        [--cpu-budget equal|off] [--slot-cpus 0.25] [--calibrate PERCENT] [--control]

Reads ``parts/stack/stack.json`` (written by bin/buildout) for the HAProxy frontend, stats
URL, backend and which WSGI server each ZEO client runs. Then:

1. checks that HAProxy reports every server UP (else exit 2, nothing run);
2. reads HAProxy's stats CSV and the CPU times of the machine and of the stack's processes;
3. runs Locust headless (``loadtests/locustfile.py``) for ``--duration`` seconds,
   printing a progress line every 5 s (elapsed, requests so far per server);
4. reads the stats again and writes ``<out>/<YYYYmmdd-HHMMSS>/`` with ``report.md``,
   ``report.json``, ``ab.png`` and Locust's own CSV/HTML;
5. prints the summary table and the report's path.

Per balance mode (``--balance leastconn,roundrobin [--rounds N] [--balancer-port P]``):
the deployed HAProxy's ``balance`` cannot change at runtime, so each mode runs through a
temporary HAProxy of its own (``loadtests.core.balancers``: the deployed config with only
``balance`` and the ports changed, checked with ``haproxy -c``, on 127.0.0.1:P and P+1,
default P = deployed frontend port + 10) in front of the same two running ZEO clients;
steps 2-4 run once per mode and round (``--duration`` seconds each; modes interleaved in
every round), each writing its full single-mode report into ``<out>/<ts>/<mode>-r<round>/``
and stopping its HAProxy by PID before the next starts. ``<out>/<ts>/`` then gets the
per-mode ``report.md``, ``report.json`` and ``modes.png`` (``loadtests.ab.modes_report``).
Without ``--balance``, or with only the deployed mode, the run is the plain one above
through the deployed HAProxy, with unchanged output.

The rounds (the default mode) run each slot's client without a CPU budget
(``--cpu-budget off``, the default); ``--cpu-budget equal`` holds each to the same quota
(``--slot-cpus`` cores each: ``loadtests.ab.budget``), which needs root and the cgroup v1
``cpu`` controller and, with 8 rounds, detects a 10 % difference (docs/results.md, 28 Nov).

Exit status: 0 when every request passed its check, 1 when some failed (the report is
written all the same), 2 when the stack is not ready, an option is invalid (e.g. a
``--balance`` mode not in ``loadtests.core.balancers.MODES``), a temporary HAProxy could
not start or the CPU budgets cannot be made (not root, no cgroup v1 ``cpu``; checked before
anything is built or started). Traffic goes only to HAProxy frontends on 127.0.0.1.

The run's stages are modules of loadtests.ab: ``plan`` (which runs, in which order),
``rounds``, ``deployed`` and ``balance`` (one module per mode), ``measure`` (one Locust run
and its measurements), ``abstats`` (statistics), ``report``, ``rounds_report`` and
``modes_report`` (the reports). This module holds the options and ``main``, which picks
the mode.
"""
import os
import signal
import sys
from datetime import datetime, timezone

from loadtests.ab import abslots, budget
from loadtests.ab.balance import run_modes
from loadtests.ab.deployed import run_deployed
from loadtests.ab.plan import can_vary, ports as plan_ports
from loadtests.ab.rounds import run_rounds
from loadtests.core import balancers, cpubudget
from loadtests.core.cli import (add_buildout_config_argument, add_run_arguments, add_stack_arguments,
                                exits_2_when_not_ready, new_parser)
from loadtests.core.stack import check_servers_up, default_buildout_config, editor_password_missing, load_stack
from loadtests.weights import DEFAULT_WEIGHTS, SHAPE_NAMES, parse_weights


def parse_args(argv):
    parser = new_parser("ab", "A/B load test of the ZEO clients behind HAProxy; writes var/reports/<timestamp>/.")
    parser.add_argument("--users", type=int, default=10,
                        help="concurrent Locust users (closed loop, no think time); default 10")
    parser.add_argument("--spawn-rate", type=float, default=10.0,
                        help="users started per second; default 10")
    add_run_arguments(parser, duration=60, warmup=10.0, warmup_help=(
        "seconds of traffic at the start of every run (round and kind) left out of every figure "
        "(caches, ZODB connections, HAProxy's first picks)"))
    parser.add_argument("--processes", type=int, default=-1,
                        help="Locust processes on this machine (Locust's --processes: a master and that "
                        "many workers; -1: one per core; 1: a single process, no master); default -1")
    parser.add_argument("--remote-workers", type=int, default=0, metavar="N",
                        help="run Locust as a master on this host that waits for N workers on other "
                        "hosts (the Ansible loadgenerator role starts them) and sends no traffic itself; "
                        "needs --master-bind; default 0 (Locust's processes on this machine, --processes)")
    parser.add_argument("--master-bind", default=None, metavar="ADDRESS",
                        help="address the Locust master listens on for --remote-workers (the address "
                        "the load generator hosts reach this host at, loadgenerator_master_host)")
    parser.add_argument("--master-port", type=int, default=5557,
                        help="TCP port of the Locust master for --remote-workers "
                        "(loadgenerator_master_port); default 5557, Locust's own")
    parser.add_argument("--window", type=float, default=5.0,
                        help="seconds per time window, the unit the confidence intervals resample; default 5")
    parser.add_argument("--weights", default=DEFAULT_WEIGHTS,
                        help=f"users per traffic shape ({', '.join(SHAPE_NAMES)}); default {DEFAULT_WEIGHTS}; "
                        "logged-in (editors who log in, list, open the edit form and save; opt-in) needs "
                        "the editors' password: $PLONEDEPLOY_EDITOR_PASSWORD or var/editor-password")
    add_stack_arguments(parser)
    parser.add_argument("--balance", default=None,
                        help="comma-separated HAProxy balance modes to compare, each through its own "
                        f"temporary HAProxy; allowed: {', '.join(balancers.MODES)}; default: the "
                        "deployed HAProxy's mode only, through the deployed HAProxy (the plain A/B run)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="A/B rounds; odd rounds run pyruvate in slot a (first in HAProxy's list, "
                        "lower port) and waitress in slot b, even rounds the other way round; default 4. "
                        "With --balance: runs per mode, modes interleaved in each round; default 1 "
                        "(--duration is per mode and round)")
    parser.add_argument("--control", action="store_true",
                        help="also run every round as A/A (both slots on --control-server): its split is "
                        "the noise floor of the verdict")
    parser.add_argument("--control-server", choices=abslots.SERVERS, default=abslots.SERVERS[0],
                        help=f"the WSGI server of both slots in the A/A control; default {abslots.SERVERS[0]}")
    parser.add_argument("--calibrate", type=float, default=None, metavar="PERCENT",
                        help="instead of the A/B, run A/A rounds (both on --control-server) with slot A "
                        "PERCENT slower: with --cpu-budget equal its CPU quota PERCENT percent below B's, with off "
                        "frozen (SIGSTOP) PERCENT of every 100 ms: a known difference the verdict must "
                        "detect (sensitivity check)")
    budget.add_arguments(parser)
    parser.add_argument("--slot-port", type=int, default=None,
                        help="127.0.0.1 port of slot a; slot b uses the next one; default the deployed "
                        "frontend port + 12")
    parser.add_argument("--deployed", action="store_true",
                        help="one run through the deployed HAProxy and clients (instance: pyruvate, "
                        "client2: waitress) instead of rounds; server and slot are then confounded")
    add_buildout_config_argument(parser, "the slots' buildout var/abslots/buildout.cfg")
    parser.add_argument("--balancer-port", type=int, default=None,
                        help="with --balance: 127.0.0.1 port of the temporary HAProxy's frontend, its "
                        "stats on the next port; default the deployed frontend port + 10")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if (args.balance or args.deployed) else 4
    if args.users < 1 or args.duration < 1 or args.spawn_rate <= 0 or args.rounds < 1:
        parser.error("--users, --duration and --rounds must be >= 1 and --spawn-rate > 0")
    if args.warmup < 0 or args.window <= 0:
        parser.error("--warmup must be >= 0 and --window > 0 seconds")
    if args.remote_workers < 0 or bool(args.remote_workers) != bool(args.master_bind):
        parser.error("--remote-workers N (>= 1) and --master-bind ADDRESS go together")
    if args.master_bind in ("0.0.0.0", "*", "::", "[::]"):
        parser.error(f"--master-bind {args.master_bind}: Locust's master port has no authentication; "
                     "give the control host's private address (loadgenerator_master_host)")
    if args.remote_workers and not args.deployed:
        parser.error("--remote-workers needs --deployed: the rounds' temporary HAProxys listen on "
                     "127.0.0.1, which other hosts cannot reach")
    if not 1 <= args.master_port <= 65535:
        parser.error("--master-port must be between 1 and 65535")
    if args.calibrate is not None and not 0 < args.calibrate < 100:
        parser.error("--calibrate PERCENT must be between 0 and 100")
    budget.resolve(args, parser.error)
    if args.buildout_config is None:
        args.buildout_config = default_buildout_config()
    # Locust runs in the report folder: a relative --out would point inside it.
    args.out = os.path.abspath(args.out)
    if args.balancer_port is not None and not 1 <= args.balancer_port <= 65534:
        parser.error("--balancer-port must be between 1 and 65534 (the stats use the next port)")
    try:
        if parse_weights(args.weights)["logged-in"] and (missing := editor_password_missing()):
            raise ValueError(f"--weights {args.weights}: {missing}")
        if args.balance is not None:
            args.balance = balancers.parse_modes(args.balance)
    except ValueError as exc:
        parser.error(str(exc))
    return args


@exits_2_when_not_ready("abtest")
def main(argv=None):
    """Entry point; see the module docstring."""
    args = parse_args(argv)
    config = load_stack(args.stack_config)
    check_servers_up(config)
    modes = args.balance or [config.get("balance")]
    deployed_only = modes == [config.get("balance")]
    rounds = deployed_only and not args.deployed and not args.balance
    if rounds and not can_vary(config):
        # The Ansible role's abtest.json describes only URLs: no parts to derive slots from.
        print(f"abtest: {args.stack_config} has no haproxy_context (the deployed HAProxy's template "
              "variables): no slots can be built from it; running once through the deployed HAProxy "
              "(as --deployed)", flush=True)
        rounds = False
    if not deployed_only and not can_vary(config):
        print(f"abtest: --balance needs the deployed HAProxy's template variables (haproxy_context), and "
              f"{args.stack_config} has none (run it with a buildout's parts/stack/stack.json)",
              file=sys.stderr)
        return 2
    try:
        if rounds and args.cpu_budget == "equal":
            cpubudget.check_available(budget.OPTION)
    except cpubudget.BudgetError as exc:
        print(f"abtest: {exc}; --cpu-budget off runs the slots without budgets", file=sys.stderr)
        return 2
    started = datetime.now(timezone.utc)
    directory = os.path.join(args.out, started.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(directory, exist_ok=True)
    # A SIGTERM (e.g. from a test's timeout) must still stop the temporary HAProxys and
    # slot clients: turn it into SystemExit so that the with-blocks' cleanup runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if rounds:
        try:
            return run_rounds(args, config, directory)
        except cpubudget.BudgetError as exc:
            print(f"abtest: {exc}", file=sys.stderr)
            return 2
    if deployed_only:
        return run_deployed(args, config, directory)
    args.balancer_port, _ = plan_ports(args, config)
    return run_modes(args, config, directory, modes)


if __name__ == "__main__":
    sys.exit(main())
