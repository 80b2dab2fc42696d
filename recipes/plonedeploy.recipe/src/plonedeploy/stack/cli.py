"""``bin/stack``'s command line: start, stop, restart, wait-up, status (the usage is in
:mod:`plonedeploy.stack`)."""

import argparse
import json
import os
import signal
import sys

from plonedeploy.stack import rolling
from plonedeploy.stack.balancer import all_clients, cache_state, restart_client, server_states, wait_up
from plonedeploy.stack.errors import StackError
from plonedeploy.stack.service import ROOT_WARNING
from plonedeploy.stack.supervisor import STOP_WAIT, running_pids, start_stage, stop_process, stop_processes


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
