"""What one request costs each variant of the storage benchmark, counted rather than timed
(``python -m loadtests storage --per-request N``; docs/how-to/relstorage.md#tuning).

Throughput on a shared 2-core machine moves by ±25 % between runs; statements and loads per
request do not, and CPU per request moves less. Per round, path and variant (in :func:`loadtests.storage.plan.plan`'s order), ``N``
requests one after the other (each on a new connection: pyruvate closes every one) after
:data:`WARMUP` uncounted ones, and per request:

- ``statements``: SQL statements the variant's PostgreSQL ran (its log with
  ``log_min_duration_statement = 0``, set by ``ALTER SYSTEM`` and ``pg_reload_conf()`` over
  the superuser's socket for the run and reset after it; 0 on ``zeo``), and ``top``: the same
  per statement text (whitespace folded, cut at 90 characters);
- ``client_cpu_ms`` / ``database_cpu_ms``: CPU milliseconds of the client's process tree and
  of the database's (:func:`loadtests.core.procs.tree_cpu_seconds`; the kernel counts in
  10 ms ticks, so N = 100 resolves 0.1 ms);
- ``loads``: objects the client loaded from its storage (``zodb_loads_total`` of its metrics
  filter: ZODB object-cache misses);
- ``ms``: wall milliseconds per request, the client's latency plus this process's.

Logging every statement costs PostgreSQL CPU: ``database_cpu_ms`` here is above the wrk
runs' figure for the same variant.
"""
import collections
import os
import re
import statistics
import subprocess
import time

import requests

from loadtests.core.procs import tree_cpu_seconds, wait_tree_idle
from loadtests.core.stack import PATHS
from loadtests.storage.plan import BASELINE, plan

#: Uncounted requests before each count: the client's caches warm for the path.
WARMUP = 10
#: A logged statement in PostgreSQL 15's log with ``log_min_duration_statement = 0``: simple
#: queries (``statement:``) and RelStorage's prepared ones (``execute <name>:``).
STATEMENT = re.compile(r"duration: [\d.]+ ms {2}(?:statement|execute [^:]*): (.*)")


def metric_total(text, name):
    """Sum over every series of the Prometheus counter ``name`` in the exposition ``text``;
    raises LookupError when there is none."""
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)]
    if not values:
        raise LookupError(f"no {name} in the metrics")
    return sum(values)


def statements(lines):
    """``Counter`` of the statements among PostgreSQL log ``lines`` (see :data:`STATEMENT`)."""
    found = (STATEMENT.search(line) for line in lines)
    return collections.Counter(re.sub(r"\s+", " ", m.group(1)).strip()[:90] for m in found if m)


def log_statements(variant, on):
    """Make ``variant``'s PostgreSQL log every statement (``on``) or reset the setting, for
    its existing sessions too (``pg_reload_conf``). Raises subprocess.CalledProcessError."""
    setting = ("ALTER SYSTEM SET log_min_duration_statement = 0" if on
               else "ALTER SYSTEM RESET log_min_duration_statement")
    for sql in (setting, "SELECT pg_reload_conf()"):
        subprocess.run([os.path.join(variant.directory, "bin", "postgresql"), "psql", "-At", "-c", sql],
                       cwd=variant.directory, capture_output=True, text=True, timeout=60, check=True)


def database_log(variant):
    """PostgreSQL's log of ``variant`` (its stdout, as bin/stack starts it)."""
    return os.path.join(variant.directory, "var", "log", "postgresql.stdout.log")


def count(variant, label, n, number):
    """``n`` sequential GETs of ``label`` (a key of ``loadtests.core.stack.PATHS``) to
    ``variant``'s client, statement logging on (RelStorage); the row of the module docstring.
    Raises requests.HTTPError on an answer other than 2xx."""
    path, accept = PATHS[label]
    session = requests.Session()
    session.headers["Accept"] = accept or "*/*"
    url = variant.url + path

    def get():
        session.get(url, timeout=60).raise_for_status()

    client, database = variant.pid("instance"), variant.pid(variant.database)
    for _ in range(WARMUP):
        get()
    wait_tree_idle(client)
    log = database_log(variant) if variant.name != BASELINE else None
    offset = os.path.getsize(log) if log else 0
    loads = metric_total(requests.get(variant.metrics_url, timeout=5).text, "zodb_loads_total")
    cpu = tree_cpu_seconds(client), tree_cpu_seconds(database)
    started = time.monotonic()
    for _ in range(n):
        get()
    wall = time.monotonic() - started
    wait_tree_idle(client)
    cpu = tree_cpu_seconds(client) - cpu[0], tree_cpu_seconds(database) - cpu[1]
    # ZODB counts a connection's loads when it closes, after the answer went out.
    time.sleep(0.2)
    loads = metric_total(requests.get(variant.metrics_url, timeout=5).text, "zodb_loads_total") - loads
    found = collections.Counter()
    if log:
        time.sleep(0.3)  # the server's log lines after its last answer
        with open(log, encoding="utf-8", errors="replace") as fp:
            fp.seek(offset)
            found = statements(fp)
    return {"round": number, "variant": variant.name, "path": label, "requests": n,
            "ms": round(1000 * wall / n, 2), "client_cpu_ms": round(1000 * cpu[0] / n, 2),
            "database_cpu_ms": round(1000 * cpu[1] / n, 2), "loads": round(loads / n, 2),
            "statements": round(sum(found.values()) / n, 2),
            "top": {text: round(c / n, 2) for text, c in found.most_common(8)},
            "load1": round(os.getloadavg()[0], 2)}


def run(variants, rounds, labels, n, rows):
    """Count ``n`` requests of each of ``labels`` on each of ``variants`` (started
    :class:`loadtests.storage.variant.Variant` objects, the baseline first) per round, in
    :func:`loadtests.storage.plan.plan`'s order, appending each row to ``rows`` (so a caller
    keeps what was counted when a step fails) and printing it. Statement logging is on for
    the run and reset after it, also after an error."""
    by_name = {v.name: v for v in variants}
    logged = [v for v in variants if v.name != BASELINE]
    try:
        for variant in logged:
            log_statements(variant, True)
        for number, label, _, name in plan(rounds, labels, [1], list(by_name)):
            row = count(by_name[name], label, n, number)
            rows.append(row)
            print(f"round {number} {label:6} {name:17} per request: {row['statements']} statements, "
                  f"{row['loads']} loads, client {row['client_cpu_ms']} ms CPU, database "
                  f"{row['database_cpu_ms']} ms CPU, {row['ms']} ms", flush=True)
    finally:
        for variant in logged:
            try:
                log_statements(variant, False)
            except (subprocess.SubprocessError, OSError) as exc:
                print(f"{variant.name}: statement logging not reset: {exc!r}", flush=True)


def summarize(rows):
    """``[{variant, path, rounds, <figure>: median, <figure>_range: [min, max]}]`` over the
    rounds, per (path, variant) in the order met."""
    keys = ("ms", "client_cpu_ms", "database_cpu_ms", "loads", "statements")
    cells = {}
    for row in rows:
        cells.setdefault((row["path"], row["variant"]), []).append(row)
    out = []
    for (path, variant), group in cells.items():
        cell = {"path": path, "variant": variant, "rounds": len(group)}
        for key in keys:
            values = [r[key] for r in group]
            cell[key] = round(statistics.median(values), 2)
            cell[f"{key}_range"] = [min(values), max(values)]
        out.append(cell)
    return out


def to_markdown(meta, cells, rows):
    """report.md of a ``--per-request`` run: the command, loads, and per path and variant the
    medians (min–max) over the rounds; then the statements of each variant's last count."""
    lines = [f"# Storage per request, {meta['started']}", "", f"`{meta['command']}`", "",
             f"Load average before {meta['load_before']}, after {meta['load_after']}; "
             f"{meta['requests']} requests per count, {meta['rounds']} rounds.", "",
             "| path | variant | SQL statements | ZODB loads | client CPU ms | database CPU ms | ms |",
             "|---|---|---|---|---|---|---|"]
    for c in cells:
        figures = [f"{c[k]} ({c[k + '_range'][0]}–{c[k + '_range'][1]})"
                   for k in ("statements", "loads", "client_cpu_ms", "database_cpu_ms", "ms")]
        lines.append(f"| {c['path']} | {c['variant']} | " + " | ".join(figures) + " |")
    lines += ["", "Statements per request (last round):", ""]
    last = {(r["path"], r["variant"]): r for r in rows}
    for (path, variant), row in last.items():
        for text, per in row["top"].items():
            lines.append(f"- {path} {variant}: {per} × `{text}`")
    return "\n".join(lines) + "\n"
