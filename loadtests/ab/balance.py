"""The A/B per balance mode: one run per mode and round, each through a temporary HAProxy
of its own (``loadtests.core.balancers``), and the per-mode report (``loadtests.ab.modes_report``).
"""
import importlib.metadata
import os
import sys

import psutil

from loadtests.ab import modes_report, report
from loadtests.ab.measure import measure
from loadtests.core import balancers, haproxy_log


def run_modes(args, config, directory, modes):
    """One run per mode and round, each through its own temporary HAProxy; returns the exit status.

    Rounds interleave the modes (round 1: all modes, round 2: all modes, ...) so that
    machine noise hits every mode alike. Each run's full single-mode report goes to
    ``<directory>/<mode>-r<round>/``; the per-mode report to ``<directory>/``.
    """
    binary = config["haproxy_binary"]
    total_s = args.duration * len(modes) * args.rounds
    print(f"A/B run per balance mode: {', '.join(modes)}; {args.rounds} round(s) x {args.duration} s "
          f"per mode (about {total_s // 60} min {total_s % 60} s of load), {args.users} users, "
          f"weights {args.weights}; temporary HAProxy on 127.0.0.1:{args.balancer_port} "
          f"(stats :{args.balancer_port + 1}) -> "
          + ", ".join(f"{n} ({config['server_kinds'][n]})" for n in config["servers"]),
          flush=True)
    runs, worst = [], 0
    for round_no in range(1, args.rounds + 1):
        for mode in modes:
            name = f"{balancers.slug(mode)}-r{round_no}"
            run_dir = os.path.join(directory, name)
            balancer = balancers.TemporaryBalancer(binary, config, mode, run_dir, args.balancer_port)
            with balancer:
                try:
                    balancer.start(config["backend"], config["servers"])
                except balancers.BalancerError as exc:
                    print(f"abtest: {exc}", file=sys.stderr)
                    return 2
                print(f"[{mode}, round {round_no}/{args.rounds}] temporary HAProxy pid {balancer.pid}, "
                      f"servers UP", flush=True)
                mode_config = dict(config, frontend_url=balancer.frontend_url,
                                   stats_url=balancer.stats_url, balance=mode)
                result = measure(args, mode_config, run_dir, f"[{mode}] ", balancer.process)
            print(f"[{mode}, round {round_no}/{args.rounds}] temporary HAProxy pid {balancer.pid} stopped",
                  flush=True)
            if result is None:
                return 2
            measurement, code = result
            data, per_server = report.build(measurement), measurement["per_server"]
            report.write(data, run_dir)
            shares = ", ".join(f"{n} {100 * (s['share'] or 0):.1f}%" for n, s in data["servers"].items()
                               if n in config["server_kinds"])
            print(f"[{mode}, round {round_no}/{args.rounds}] {data['totals']['requests']} requests, "
                  f"{data['totals']['failures']} failures, {data['totals']['rps']:.1f} req/s; share {shares}; "
                  f"foreign CPU {data['meta']['cpu']['foreign_percent']}%", flush=True)
            worst = max(worst, 0 if data["totals"]["failures"] == 0 and code == 0 else 1)
            # The log is complete now that this HAProxy has stopped.
            logged, queued = haproxy_log.queue_waits(balancer.log_path, config["backend"])
            runs.append({"mode": mode, "round": round_no, "directory": name, "report": data,
                         "per_server": per_server, "balancer_pid": balancer.pid,
                         "queue": {"logged": logged, "queued": queued}})
    meta = {
        "started": os.path.basename(directory),
        "modes": modes,
        "rounds": args.rounds,
        "deployed_balance": config.get("balance"),
        "duration_s": args.duration,
        "users": args.users,
        "spawn_rate": args.spawn_rate,
        "weights": args.weights,
        "balancer_url": f"http://127.0.0.1:{args.balancer_port}",
        "locust_version": importlib.metadata.version("locust"),
        "cores": psutil.cpu_count() or 1,
    }
    data = modes_report.build(meta, runs, {n: config["server_kinds"][n] for n in config["servers"]})
    _, md_path, png_path = modes_report.write(data, directory)
    print()
    print(modes_report.summary_table(data))
    print()
    print(f"report: {md_path}")
    print(f"plot:   {png_path}")
    return worst
