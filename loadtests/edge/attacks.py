"""The edge, tried as an attacker would: slow bodies, huge bodies, forged Hosts, floods.

Usage (the stack running: ``make start``)::

    .venv/bin/python -m loadtests attacks [--stack-config parts/stack/stack.json]
        [--slow-connections 8] [--slow-seconds 20] [--big-post-mib 512] [--upload-mib 200]
        [--slow-upload-mib 30] [--rate-requests 1100] [--fd-downloads 2000]

Each case is sent to the HAProxy frontend of ``stack.json`` (127.0.0.1 only; the blob case
also to each client of the page pool directly) while the RSS (MiB) of every stack process
is sampled every 0.1 s; the table (case, answer, seconds to the answer, RSS before / peak /
after per process) is printed and written to
``var/reports/attacks-<timestamp>/{report.md,report.json}``.
docs/explanation/edge.md#edge-limits embeds that table. The functions are the ones tests/test_edge.py asserts on.

Cases: slow request bodies (N connections, each trickling a 100-byte body 1 byte per
0.5 s) while ``GET /Plone`` is timed; the same with 100 MiB announced (upload lane); a POST
of ``--big-post-mib`` MiB (upload lane, spooled to disk); a body over ``max-body-size``; a
forged Host, a 10 kB Host, no Host; the per-source request rate from 127.0.0.2 (127.0.0.1 is
exempt in the demo); the ways around the path rules of loadtests.edge.bypass (the ZMI in
disguise, client-sent virtual hosting, internal headers), on the plain and the TLS listener; a
TUS upload (plone.restapi) of ``--upload-mib`` MiB stored as a blob and read back; an honest
slow upload of ``--slow-upload-mib`` MiB at 1 MiB/s; then, on each ZEO client of the page
pool directly and through the frontend, ``--fd-downloads`` whole downloads of the 5 MiB
blob (wrk, 4 connections) plus 50 aborted ones, with the open descriptors of every ZEO
client before and after and the integrity of a download (sha256 against the blob file,
``Content-Length``, a ``Range`` slice); this case needs ``wrk``.

Exit status 0, or 1 when a case with a verdict failed (the blob downloads: a descriptor
left open, a failed request or a download not equal to the blob file); 2 when stack.json
is missing or, with the blob case, wrk is not installed.

The cases are in loadtests.edge: ``wire`` (raw HTTP on a socket, the page probe),
``cases`` (bodies, floods, uploads, RSS), ``blobs`` (the blob downloads and their
descriptor check), ``bypass`` (the ways around the path rules). This module runs them
all and writes the report.
"""
import datetime
import json
import os
import sys
import time

from loadtests.core.cli import exits_2_when_not_ready, new_parser
from loadtests.core.stack import ROOT, STACK_JSON, load_stack, stack_pids
from loadtests.core.wrk import require_wrk
from loadtests.edge import bypass
from loadtests.edge.blobs import ABORTED_DOWNLOADS, blob_case, blob_targets, reference_blob, zeo_clients
from loadtests.edge.cases import RssWatch, big_post, download_sha256, rate_limit, slow_bodies, tus_upload
from loadtests.edge.wire import MIB, PageProbe, request_head, send


def run_all(config, args, password):
    """Run every case against ``config`` (stack.json); return the list of result rows."""
    host, port = config["frontend_url"].split("//")[1].split(":")
    port = int(port)
    procs = stack_pids(config)
    rows = []

    def case(name, expected, call, probe_pages=False):
        print(f"attacks: {name} ...", flush=True)
        probe = PageProbe(host, port) if probe_pages else None
        if probe:
            probe.start()
        with RssWatch(procs) as watch:
            started = time.monotonic()
            outcome = call()
            seconds = time.monotonic() - started
        if probe:
            probe.stop()
        row = {"case": name, "expected": expected, "seconds": round(seconds, 2),
               "rss_mib": {n: [round(v) for v in values] for n, values in watch.result.items()}}
        row.update(outcome)
        if probe:
            row["pages"] = probe.summary()
        rows.append(row)
        print(f"attacks: {name}: {outcome} ({seconds:.1f} s)", flush=True)

    def statuses(answers):
        return {"answers": _counts(a.status for a in answers), "answer_s": round(max(a.seconds for a in answers), 2)}

    case(f"{args.slow_connections} slow request bodies (1 byte / 0.5 s)", "408 after 10 s, /Plone answers",
         lambda: statuses(slow_bodies(host, port, args.slow_connections, args.slow_seconds)), probe_pages=True)
    case(f"{args.slow_connections} slow large bodies (100 MiB announced, 64 KiB sent, then 1 byte / 0.5 s)",
         "held by the upload lane until the client gives up, /Plone answers",
         lambda: statuses(slow_bodies(host, port, args.slow_connections, args.slow_seconds,
                                      content_length=100 * MIB, burst=64 * 1024)), probe_pages=True)
    case(f"POST of {args.big_post_mib} MiB", "upload lane, spooled to disk",
         lambda: statuses([big_post(host, port, args.big_post_mib * MIB)]))
    case("body over max-body-size (Content-Length 2 GiB)", "413 at once",
         lambda: statuses([send(host, port, request_head("POST", "/Plone", content_length=2 * 1024 ** 3), b"x")]))
    case("forged Host (evil.example)", "421", lambda: statuses(
        [send(host, port, request_head("GET", "/Plone", host="evil.example"))]))
    case("10 kB Host", "421", lambda: statuses(
        [send(host, port, request_head("GET", "/Plone", host="a" * 10000))]))
    case("HTTP/1.1 without Host", "400", lambda: statuses(
        [send(host, port, request_head("GET", "/Plone", host=None))]))
    case(f"{args.rate_requests} requests from 127.0.0.2", "429 beyond the per-source rate",
         lambda: statuses(rate_limit(host, port, args.rate_requests)))

    for name, expected, call in bypass_cases(config, host, port, password):
        case(name, expected, call)

    def upload():
        url, sent, seconds = tus_upload(host, port, password, args.upload_mib * MIB)
        path = "/" + url.split("/", 3)[3] + "/@@download/file"
        got, size = download_sha256(host, port, path)
        return {"answers": {"204": 1}, "answer_s": round(seconds, 2),
                "identical": got == sent and size == args.upload_mib * MIB}

    case(f"TUS upload of {args.upload_mib} MiB, read back", "stored as a blob, byte-identical", upload,
         probe_pages=True)

    def slow_upload():
        url, sent, seconds = tus_upload(host, port, password, args.slow_upload_mib * MIB, rate=MIB,
                                        filename="slow-upload.bin")
        path = "/" + url.split("/", 3)[3] + "/@@download/file"
        got, size = download_sha256(host, port, path)
        return {"answers": {"204": 1}, "answer_s": round(seconds, 2),
                "identical": got == sent and size == args.slow_upload_mib * MIB}

    case(f"TUS upload of {args.slow_upload_mib} MiB at 1 MiB/s", "succeeds (progress, not total time, counts)",
         slow_upload)

    if args.fd_downloads:
        # Last: the cases above leave nothing behind that this one counts, and its wrk runs
        # (2 cores shared) would slow the others' clocks if they overlapped.
        reference = reference_blob()
        clients = zeo_clients(config)
        for label, url in blob_targets(config):
            case(f"{args.fd_downloads} blob downloads + {ABORTED_DOWNLOADS} aborted via {label}: "
                 "descriptors per ZEO client",
                 "no descriptor left open, downloads equal the blob file (sha256, Range 206)",
                 lambda: blob_case(label, url, clients, args.fd_downloads, reference))
    return rows


def bypass_cases(config, host, port, password):
    """``[(name, expected, call)]``: the ways around the path rules (loadtests.edge.bypass) from
    127.0.0.6, on the plain listener and, when the stack has one, the TLS listener. Each
    call returns a row's ``answers`` (status counts), ``answer_s`` and ``ok`` (the verdict)."""
    listeners = [("plain", port, False)]
    if config.get("tls_url"):
        listeners.append(("TLS", int(config["tls_url"].rsplit(":", 1)[1]), True))
    cases = []
    for label, listen_port, tls in listeners:
        def zmi(listen_port=listen_port, tls=tls):
            started = time.monotonic()
            result = bypass.zmi_case(host, listen_port, auth=("admin", password), tls=tls)
            statuses = [status for _, _, status in result["zmi"]]
            return {"answers": _counts(statuses), "answer_s": round(time.monotonic() - started, 2),
                    "ok": all(s in (400, 403) for s in statuses)
                    and all(s not in (400, 403) for _, s in result["not_zmi"])}

        def virtual_hosting(listen_port=listen_port, tls=tls):
            started = time.monotonic()
            rows = bypass.virtual_host_case(host, listen_port, tls=tls)
            return {"answers": _counts([status for _, status, _ in rows]),
                    "answer_s": round(time.monotonic() - started, 2),
                    "ok": all(status == 400 and not leaked for _, status, leaked in rows)}

        def headers(listen_port=listen_port, tls=tls):
            started = time.monotonic()
            found = bypass.internal_headers(host, listen_port, ["/Plone", "/Plone/@@ok"], tls=tls)
            names = sorted({name for values in found.values() for name in values})
            return {"answers": {f"internal headers: {', '.join(names) or 'none'}": len(found)},
                    "answer_s": round(time.monotonic() - started, 2), "ok": not names}

        cases += [
            (f"the ZMI in {len(bypass.ZMI_PATHS)} disguises ({label}, from {bypass.OUTSIDER}, admin's credentials)",
             "403 each (400 when undecodable); managers-guide reaches Zope", zmi),
            (f"client-sent virtual hosting, {len(bypass.VIRTUAL_HOST_PATHS)} paths ({label})",
             f"400 each, {bypass.FOREIGN_HOST} in no answer", virtual_hosting),
            (f"internal headers to a visitor ({label})", "none", headers),
        ]
    return cases


def _counts(statuses):
    counts = {}
    for status in statuses:
        counts[str(status)] = counts.get(str(status), 0) + 1
    return counts


#: How :func:`markdown` shows the keys of a row's ``answers`` that are not HTTP statuses.
ANSWER_LABELS = {"-1": "no answer (client gave up)", "aborted": "aborted after 64 KiB (RST)",
                 "status": "non-2xx/3xx", "connect": "connect errors", "read": "read errors",
                 "write": "write errors", "timeout": "timeouts (30 s)"}


def markdown(rows):
    """The report table (one row per case) as Markdown text."""
    names = list(rows[0]["rss_mib"]) if rows else []
    lines = ["| case | expected | answers | s to answer | /Plone during (p99 s, failures) | "
             + " | ".join(f"{n} RSS MiB before/peak/after" for n in names) + " |",
             "|" + "---|" * (5 + len(names))]
    for row in rows:
        pages = row.get("pages")
        probe = (f"{pages['p99_s']:.2f}, {pages['failures']} of {pages['requests'] + pages['failures']}"
                 if pages else "-")
        answers = ", ".join(f"{n}x {ANSWER_LABELS.get(s, s)}" for s, n in row["answers"].items())
        if "identical" in row:
            answers += ", identical" if row["identical"] else ", DIFFERENT"
        if row.get("integrity_problems"):
            answers += " (" + "; ".join(row["integrity_problems"]) + ")"
        if "descriptors" in row:  # the blob case: before → after of every ZEO client
            answers += "; descriptors " + ", ".join(f"{n} {b} → {a}" for n, (b, a) in row["descriptors"].items())
            if not row["ok"]:
                answers += " — NOT OK"
        elif row.get("ok") is False:
            answers += " — NOT OK"
        rss = " | ".join("/".join(str(v) for v in row["rss_mib"][n]) for n in names)
        lines.append(f"| {row['case']} | {row['expected']} | {answers} | {row['answer_s']} | {probe} | {rss} |")
    return "\n".join(lines) + "\n"


@exits_2_when_not_ready("attacks")
def main(argv=None):
    parser = new_parser("attacks", __doc__.split("\n\n")[0])
    parser.add_argument("--stack-config", default=STACK_JSON)
    parser.add_argument("--slow-connections", type=int, default=8,
                        help="slow-body connections at once (default 8, twice the 4 page slots)")
    parser.add_argument("--slow-seconds", type=float, default=20.0,
                        help="seconds each slow body may trickle (default 20)")
    parser.add_argument("--big-post-mib", type=int, default=512, help="MiB of the big POST (default 512)")
    parser.add_argument("--upload-mib", type=int, default=200, help="MiB of the TUS upload (default 200)")
    parser.add_argument("--slow-upload-mib", type=int, default=30,
                        help="MiB of the honest slow upload at 1 MiB/s (default 30: 30 s)")
    parser.add_argument("--rate-requests", type=int, default=1100,
                        help="requests from 127.0.0.2 (default 1100: the default limit is 1000 per 10 s)")
    parser.add_argument("--fd-downloads", type=int, default=2000, metavar="N",
                        help="whole 5 MiB blob downloads per target (each ZEO client directly, then "
                             "HAProxy) before the 50 aborted ones and the descriptor count; 0 skips "
                             "the case (default 2000, about 15 s per target; the former loadtests.blobbench "
                             "did 10,000)")
    args = parser.parse_args(argv)
    if args.fd_downloads < 0:
        parser.error("--fd-downloads must be >= 0 (0 skips the blob case)")
    if args.fd_downloads:
        require_wrk()
    config = load_stack(args.stack_config)
    with open(os.path.join(ROOT, "var", "admin-password"), encoding="utf-8") as fp:
        password = fp.read().strip()
    rows = run_all(config, args, password)
    directory = os.path.join(ROOT, "var", "reports",
                             "attacks-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "report.json"), "w", encoding="utf-8") as fp:
        json.dump(rows, fp, indent=2)
    table = markdown(rows)
    with open(os.path.join(directory, "report.md"), "w", encoding="utf-8") as fp:
        fp.write(table)
    print(table)
    print(f"attacks: report in {directory}")
    failed = [row["case"] for row in rows if row.get("ok") is False]
    for name in failed:
        print(f"attacks: FAILED: {name}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
