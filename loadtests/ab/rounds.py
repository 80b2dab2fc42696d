"""The A/B in rounds with swapped slots (and A/A control runs): the slot clients of
``loadtests.ab.abslots`` behind a temporary HAProxy, one measurement per run of the plan,
each slot's client within its CPU budget (``loadtests.ab.budget``, ``--cpu-budget equal``);
``Freezer`` stops a slot's processes for the calibration runs without budgets.
"""
import contextlib
import importlib.metadata
import os
import signal
import sys
import time

import psutil

from loadtests.ab import abslots, budget, report
from loadtests.ab.abstats import rounds_report
from loadtests.ab.measure import measure
from loadtests.ab.plan import ports as plan_ports, round_plan
from loadtests.ab.rounds_report import write_rounds_report
from loadtests.core import balancers, haproxy_log


class Freezer:
    """Slow one client by a known amount: SIGSTOP its process group for ``percent`` % of
    every ``period`` seconds, SIGCONT for the rest, in a background thread (calibration).

    A frozen Zope finishes nothing, so its capacity falls by ``percent`` %; requests HAProxy
    already sent it wait. Use as a context manager; on exit the group is always continued.
    """

    def __init__(self, pgid, percent, period=0.1):
        import threading

        self.pgid, self.stop_s, self.period = pgid, period * percent / 100.0, period
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.done.is_set():
            try:
                os.killpg(self.pgid, signal.SIGSTOP)
                time.sleep(self.stop_s)
            finally:
                os.killpg(self.pgid, signal.SIGCONT)
            self.done.wait(self.period - self.stop_s)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        os.killpg(self.pgid, signal.SIGCONT)
        return False


def calibration_text(args):
    """How ``--calibrate`` slows slot A (the run's opening line): a smaller CPU quota under
    budgets, else freezing."""
    if args.cpu_budget == "equal":
        return f"with a CPU quota {args.calibrate:g}% below B's"
    return f"frozen {args.calibrate:g}%"


def budget_text(slot_cpu):
    """The run line's account of the budgets (``loadtests.ab.budget.usage``)."""
    return "; CPU budget " + ", ".join(
        f"{slot} {u['used_cores']:.2f}/{u['cores']:.2f} cores"
        + (f" (throttled in {100 * u['throttled']:.0f}% of periods)" if u["throttled"] is not None else "")
        for slot, u in slot_cpu.items())


def run_rounds(args, config, directory):
    """Rounds with swapped slots (and A/A control runs); returns the exit status.

    Builds the slot clients once (``loadtests.ab.abslots``), then per run starts the pair it
    needs (stopping the one it replaces), a temporary HAProxy with the pair in slot order
    (``loadtests.core.balancers``, the deployed balance mode), measures, and stops that HAProxy.
    Writes each run's single report into ``<directory>/<kind>-r<round>/`` and the verdict
    report (``loadtests.ab.abstats``) into ``<directory>/``. With ``--cpu-budget equal`` each
    run's slot clients go into the slots' groups (``loadtests.ab.budget.SlotBudgets``), made
    once and removed at the end after the clients stopped (``abtest.main`` checked that this
    machine can make them); raises ``loadtests.core.cpubudget.BudgetError`` when a group
    cannot be made or written after all.
    """
    binary, haproxy_name = config["haproxy_binary"], config["haproxy_context"]["part"]
    args.balancer_port, ports = plan_ports(args, config)
    plan = round_plan(args)
    per_run = args.warmup + args.duration
    print(f"A/B in {args.rounds} round(s) with swapped slots: {len(plan)} runs of {args.warmup:g} s warm-up + "
          f"{args.duration} s measured (about {len(plan) * per_run / 60:.1f} min of load plus client "
          f"restarts), {args.users} users, weights {args.weights}; slots a :{ports['a']} (first in HAProxy's "
          f"list) and b :{ports['b']}; temporary HAProxy :{args.balancer_port}"
          + (f"; A/A control on {args.control_server}" if args.control else "")
          + (f"; calibration: A {calibration_text(args)}" if args.calibrate is not None else "")
          + (f"; CPU budget {args.slot_cpus:g} cores per slot client" if args.cpu_budget == "equal"
             else "; no CPU budgets (--cpu-budget off)"), flush=True)
    took = abslots.build(args.buildout_config, config["servers"][0], haproxy_name, config["part"], ports)
    print(f"slot buildout {abslots.WORK_DIR}/buildout.cfg: {took:.0f} s", flush=True)
    runs, worst = [], 0
    # Groups entered first, left last: the clients stop first and leave them empty.
    budgets = budget.SlotBudgets(args.slot_cpus, args.calibrate) if args.cpu_budget == "equal" else None
    with budgets or contextlib.nullcontext(), abslots.Slots(ports, config["log_dir"]) as slots:
        for round_no, kind, server_a, server_b, slot_a in plan:
            label = f"[{kind} r{round_no}/{args.rounds}: a={server_a} b={server_b}] "
            name = f"{kind}-r{round_no}"
            run_dir = os.path.join(directory, name)
            os.makedirs(run_dir, exist_ok=True)
            restart_s = slots.ensure(server_a, server_b)
            names = {"a": abslots.part("a", server_a), "b": abslots.part("b", server_b)}
            roles = {"A": names[slot_a], "B": names["b" if slot_a == "a" else "a"]}
            kinds = {names["a"]: server_a, names["b"]: server_b}
            balancer = balancers.TemporaryBalancer(binary, abslots.pair_config(server_a, server_b),
                                                   config.get("balance", "leastconn"), run_dir,
                                                   args.balancer_port)
            pids = slots.pids()
            with balancer:
                try:
                    balancer.start(config["backend"], list(names.values()))
                except balancers.BalancerError as exc:
                    print(f"abtest: {exc}", file=sys.stderr)
                    return 2
                run_config = dict(config, frontend_url=balancer.frontend_url, stats_url=balancer.stats_url,
                                  servers=list(names.values()), server_kinds=kinds)
                extra = {n: psutil.Process(pid) for n, pid in pids.items() if pid}
                if budgets:
                    cores = budgets.apply({slot: pids[n] for slot, n in names.items()}, kind, slot_a)
                    stat_before = budgets.stat()
                if kind == "ab" and args.calibrate is not None and not budgets:
                    with Freezer(pids[roles["A"]], args.calibrate):
                        result = measure(args, run_config, run_dir, label, balancer.process, extra)
                else:
                    result = measure(args, run_config, run_dir, label, balancer.process, extra)
                slot_cpu = (budget.usage(cores, stat_before, budgets.stat(), {
                    slot: result[0]["meta"]["cpu"]["stack_cpu_s"].get(n, 0.0) for slot, n in names.items()},
                    result[0]["meta"]["wall_s"]) if budgets and result else None)
            if result is None:
                return 2
            measurement, code = result
            data, per_server = report.build(measurement), measurement["per_server"]
            report.write(data, run_dir)
            # The log is complete now that this HAProxy has stopped; its windows start where
            # Locust's do (the locustfile's warm_at, epoch seconds).
            server_windows = haproxy_log.server_time_windows(balancer.log_path, config["backend"],
                                                             per_server["warm_at"], args.window)
            warnings = list(data["meta"]["warnings"])
            if not server_windows:
                warnings.append(f"{name}: {balancer.log_path} has no answered GET after the warm-up mark: "
                                "no server times from this run")
            counts = {role: data["servers"].get(n, {}).get("requests", 0) for role, n in roles.items()}
            share = counts["A"] / max(sum(counts.values()), 1)
            print(f"{label}{data['totals']['requests']} requests, {data['totals']['failures']} failures, "
                  f"{data['totals']['rps']:.1f} req/s; A ({roles['A']}) {100 * share:.1f}%; Locust "
                  f"{data['meta']['cpu']['load_generator_cores']} cores, machine "
                  f"{data['meta']['cpu']['machine_busy_percent']}% busy, foreign "
                  f"{data['meta']['cpu']['foreign_percent']}%; clients (re)started and warmed in {restart_s:.0f} s"
                  + (budget_text(slot_cpu) if slot_cpu else ""), flush=True)
            worst = max(worst, 0 if data["totals"]["failures"] == 0 and code == 0 else 1)
            runs.append({"kind": kind, "round": round_no, "directory": name, "slots": {"a": server_a, "b": server_b},
                         "slot_names": names, "labels": roles, "windows": per_server.get("windows", []),
                         "server_time_windows": server_windows,
                         "totals": data["totals"], "cpu": data["meta"]["cpu"], "warnings": warnings,
                         "warmup_requests": data["meta"]["warmup_requests"], "restart_s": round(restart_s, 1),
                         "slot_cpu": slot_cpu})
    first, second = abslots.SERVERS
    name_a = first
    if args.calibrate is not None:  # the verdicts' subject: "pyruvate (CPU quota -10%) finishes ..."
        name_a = (f"{args.control_server} (CPU quota -{args.calibrate:g}%)" if args.cpu_budget == "equal"
                  else f"{args.control_server} frozen {args.calibrate:g}%")
    name_b = args.control_server if args.calibrate is not None else second
    meta = {
        "started": os.path.basename(directory), "rounds": args.rounds, "runs": len(runs),
        "duration_s": args.duration, "warmup_s": args.warmup, "window_s": args.window,
        "users": args.users, "spawn_rate": args.spawn_rate, "weights": args.weights,
        "balance": config.get("balance"), "control": args.control, "control_server": args.control_server,
        "calibrate_percent": args.calibrate, "name_a": name_a, "name_b": name_b,
        "cpu_budget": args.cpu_budget, "slot_cpus": args.slot_cpus if args.cpu_budget == "equal" else None,
        "slot_ports": ports, "balancer_url": f"http://127.0.0.1:{args.balancer_port}",
        "locust_version": importlib.metadata.version("locust"), "scipy_version": importlib.metadata.version("scipy"),
        "cores": psutil.cpu_count() or 1, "load_average_start": os.getloadavg(),
    }
    data = rounds_report(meta, runs)
    md_path, png_path = write_rounds_report(data, directory)
    print()
    for line in data["verdicts"]:
        print(line["text"])
    for text in data["warnings"]:
        print(f"warning: {text}")
    print()
    print(f"report: {md_path}")
    print(f"plot:   {png_path}")
    return worst
