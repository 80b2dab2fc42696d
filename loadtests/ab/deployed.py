"""The A/B's single mode: one run through the deployed HAProxy, its report and summary."""
from loadtests.ab import report
from loadtests.ab.measure import measure


def run_deployed(args, config, directory):
    """The single-mode A/B run through the deployed HAProxy; returns the exit status."""
    print(f"A/B run: {args.users} users, {args.duration} s, weights {args.weights}, "
          f"through {config['frontend_url']} -> "
          + ", ".join(f"{n} ({config['server_kinds'][n]})" for n in config["servers"]),
          flush=True)
    result = measure(args, config, directory)
    if result is None:
        return 2
    measurement, code = result
    data = report.build(measurement)
    _, md_path, png_path = report.write(data, directory)
    print()
    print(report.summary_table(data))
    print()
    totals = data["totals"]
    print(f"total {totals['requests']} requests, {totals['failures']} failures, "
          f"{totals['rps']:.1f} req/s")
    print(f"report: {md_path}")
    print(f"plot:   {png_path}")
    return 0 if totals["failures"] == 0 and code == 0 else 1
