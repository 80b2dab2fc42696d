"""The report of a rounds invocation: its statistics and verdicts (``rounds_report``, with
``loadtests.ab.abstats``), ``report.md`` (``rounds_markdown``) and the files (``write_rounds_report``).
"""
from loadtests.ab import abstats
from loadtests.core.reports import markdown_table, write_report


def rounds_report(meta, runs):
    """The report dict of a rounds invocation: ``{"meta", "runs", "stats": {"ab", "aa"},
    "slot_share", "verdicts": [{"path", "detected", "text"}], "warnings"}`` (shares as
    fractions 0..1; see loadtests.ab.abstats)."""
    ab = abstats.summarize(runs, "ab")
    aa = abstats.summarize(runs, "aa") if meta["control"] else None
    verdicts = []
    # Every path of the locustfile, also one the A/B run finished none of (a 6 s run on a
    # busy machine can miss /Plone): the report says "no requests" instead of leaving it out.
    for path in dict.fromkeys(abstats.PATHS + tuple(ab)):
        detected, text = abstats.verdict(path, ab, aa, meta["name_a"])
        verdicts.append({"path": path, "detected": detected, "text": text})
    # The same statistics over HAProxy's log: request counts and the servers' own time (Tr).
    by_log = [dict(run, windows=run["server_time_windows"]) for run in runs]
    log_paths = tuple(abstats.LOG_PATHS.values()) + ("all",)
    server_time = {"ab": abstats.summarize(by_log, "ab", log_paths),
                   "aa": abstats.summarize(by_log, "aa", log_paths) if meta["control"] else None}
    # No server-time ratio of all paths pooled: its p50 depends on the mix of paths each
    # server got in a window (the one that got more of the fast "/" looks faster), so even
    # the A/A control's interval could miss 1 (1.05-2.05 in a 2-round demo). Its request
    # counts stay, as the check of Locust's.
    for summary in server_time.values():
        if summary and "all" in summary:
            summary["all"].update(p50_ratio=None, p99_ratio=None)
    for path in abstats.LOG_PATHS.values():
        detected, text = abstats.time_verdict(path, server_time["ab"], server_time["aa"], meta["name_a"],
                                              meta["name_b"])
        verdicts.append({"path": path, "detected": detected, "text": text, "measure": "server time"})
    warnings = sorted({w for run in runs for w in run["warnings"]})
    return {"meta": meta, "runs": runs, "stats": {"ab": ab, "aa": aa}, "server_time": server_time,
            "slot_share": abstats.slot_share(runs), "verdicts": verdicts, "warnings": warnings}


def write_rounds_report(data, directory):
    """Write ``report.json``, ``report.md`` and ``ab.png`` of a rounds invocation; return the
    paths of the last two."""
    meta = data["meta"]
    summaries = {f"A/B: A = {meta['name_a']}, B = {meta['name_b']}": data["stats"]["ab"]}
    if data["stats"]["aa"]:
        summaries[f"A/A control: both {meta['control_server']}"] = data["stats"]["aa"]
    title = (f"A/B in {meta['rounds']} rounds x {meta['duration_s']} s, {meta['users']} users, "
             f"{meta['started']}")
    _, md_path, png_path = write_report(directory, data, rounds_markdown(data), [
        ("ab.png", lambda path: abstats.plot(summaries, path, title))])
    return md_path, png_path


def rounds_markdown(data):
    """report.md of a rounds invocation (``data`` as built by ``rounds_report``), a str."""
    meta = data["meta"]
    slot = data["slot_share"]
    lines = [
        f"# A/B report {meta['started']}",
        "",
        f"{meta['rounds']} rounds, {meta['runs']} runs of {meta['warmup_s']:g} s warm-up (left out of every "
        f"figure) + {meta['duration_s']} s measured, cut into {meta['window_s']:g} s windows; "
        f"{meta['users']} Locust {meta['locust_version']} users (weights {meta['weights']}), HAProxy "
        f"{meta['balance']} through a temporary HAProxy in front of two slots: a (:{meta['slot_ports']['a']}, "
        f"first in the server list) and b (:{meta['slot_ports']['b']}). A = {meta['name_a']}, "
        f"B = {meta['name_b']}; A sits in slot a in odd rounds and in slot b in even ones. "
        f"Machine: {meta['cores']} cores, load average at the start {meta['load_average_start'][0]:.2f}.",
        "",
        "## Verdict",
        "",
    ]
    lines += [f"- {v['text']}" for v in data["verdicts"]]
    if slot:
        lines += ["", f"Position check: slot a (first in HAProxy's list) finished {100 * slot['value']:.1f}% "
                  f"(95% CI {100 * slot['low']:.1f}–{100 * slot['high']:.1f}%) of the A/B requests."]
    if data["warnings"]:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in data["warnings"]]
    lines += ["", "## A/B: share, req/s and latency ratios (95% bootstrap intervals over rounds x windows)", "",
              abstats.table(data["stats"]["ab"]), ""]
    if data["stats"]["aa"]:
        lines += [f"## A/A control (both slots on {meta['control_server']}): the noise floor", "",
                  abstats.table(data["stats"]["aa"]), ""]
    lines += ["## The servers' own time (HAProxy's log)", "",
              "From the temporary HAProxy's log of each run, after the warm-up: the share column "
              "counts HAProxy's requests (a check of Locust's); the p50/p99 ratios are of `Tr`, the "
              "time from sending the request to the server until its response headers arrived: "
              "without the wait in HAProxy's queue and without the body's transfer to Locust, "
              "which set the pace of the share on this machine (docs/usage.md, Sensitivity). "
              "HAProxy logs the URL only, so /Plone as page and as JSON are one row.", "",
              "A/B:", "", abstats.table(data["server_time"]["ab"]), ""]
    if data["server_time"]["aa"]:
        lines += ["A/A:", "", abstats.table(data["server_time"]["aa"]), ""]
    lines += ["## Runs", "", markdown_table(
        ["run", "slot a", "slot b", "requests", "failures", "req/s", "warm-up requests left out",
         "Locust cores", "machine busy %", "foreign %", "report"],
        [[f"{run['kind']} r{run['round']}", run["slots"]["a"], run["slots"]["b"], run["totals"]["requests"],
          run["totals"]["failures"], round(run["totals"]["rps"], 1), sum(run["warmup_requests"].values()),
          run["cpu"]["load_generator_cores"], run["cpu"]["machine_busy_percent"], run["cpu"]["foreign_percent"],
          f"[{run['directory']}]({run['directory']}/report.md)"] for run in data["runs"]])]
    lines += ["", "![A/B with intervals](ab.png)", ""]
    return "\n".join(lines)
