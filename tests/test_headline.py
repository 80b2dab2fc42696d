"""loadtests.headline.headline: the plan, the summary and the report without measuring; then one
short real run against the session's stack (wrk, the off clients built and stopped)."""
import json
import os
import sys

import psutil
import pytest

from conftest import ROOT, run
from loadtests.core.stack import PATHS
from loadtests.headline import headline


def test_plan_covers_every_cell_once_per_round_and_rotates():
    todo = headline.plan(3, with_off=True)
    cells = {(t, p) for _, t, p in todo}
    assert cells == {(t, p) for t in headline.TARGETS + headline.OFF for p in PATHS}
    assert len(todo) == 3 * len(cells)
    firsts = [next((t, p) for n, t, p in todo if n == number) for number in (1, 2, 3)]
    assert len(set(firsts)) == 3  # a different cell opens each round
    assert {p for _, t, p in headline.plan(1, with_off=False) if t.endswith("-off")} == set()
    assert {(t, p) for _, t, p in headline.plan(2, with_off=False, with_copy=True)} - {
        (t, p) for _, t, p in headline.plan(2, with_off=False)} == {(headline.COPY, "blob")}


def _row(number, target, path, rps, errors=0):
    return {"round": number, "target": target, "path": path, "rps": rps, "p50_ms": 10.0 * number,
            "p99_ms": 40.0, "errors": errors}


def test_summary_medians_spreads_and_ratios_per_round():
    runs = [_row(1, "pyruvate", "/", 300), _row(2, "pyruvate", "/", 200), _row(3, "pyruvate", "/", 250),
            _row(1, "waitress", "/", 150), _row(2, "waitress", "/", 200), _row(3, "waitress", "/", 100),
            _row(1, "pyruvate", "blob", 150), _row(1, "pyruvate-off", "blob", 100, errors=2),
            _row(2, "pyruvate", "blob", 120), _row(2, "waitress", "blob", 160),
            _row(1, "haproxy", "blob", 120), _row(2, "haproxy", "blob", 200), _row(2, "haproxy-copy", "blob", 160)]
    cells, ratios = headline.summarize(runs)
    assert cells["pyruvate /"]["rps"] == {"median": 250.0, "min": 200.0, "max": 300.0}
    assert cells["pyruvate /"]["p50_ms"] == 20.0 and cells["pyruvate /"]["runs"] == 3
    assert cells["pyruvate-off blob"]["errors"] == 2
    # per round 2.0, 1.0, 2.5: the ratio of the medians (1.67) would hide the spread
    assert ratios["pyruvate/waitress /"] == {"median": 2.0, "min": 1.0, "max": 2.5}
    assert ratios["pyruvate kit/stock blob"] == {"median": 1.5, "min": 1.5, "max": 1.5}
    assert "pyruvate kit/stock /" not in ratios  # no stock run on /: no ratio
    assert ratios["pyruvate/waitress blob"] == {"median": 0.75, "min": 0.75, "max": 0.75}  # round 2 only
    assert ratios["haproxy blob splice/copy"] == {"median": 1.25, "min": 1.25, "max": 1.25}
    # round 1: 120 / pyruvate's 150 (no waitress run); round 2: 200 / waitress's 160
    assert ratios["haproxy/best direct blob"] == {"median": 1.02, "min": 0.8, "max": 1.25}
    text = headline.to_markdown({"started": "s", "command": "c", "rounds": 3, "duration_s": 8, "connections": 4,
                                 "cores": 2, "load_before": [0.1], "load_after": [0.2], "minutes": 1.0,
                                 "clients": {"pyruvate": "instance", "waitress": "client2"},
                                 "spliced_mib": {"haproxy": 1234.5, "haproxy-copy": 0.0}}, cells, ratios)
    assert "| path | pyruvate | waitress | haproxy | pyruvate-off | haproxy-copy |" in text  # targets measured only
    assert "during the runs: haproxy 1,234.5, haproxy-copy 0.0." in text
    assert "| / | 250 (200–300) | 150 (100–200) | - |" in text
    assert "| pyruvate/waitress / | 2.00 (1.00–2.50) |" in text


def test_targets_need_both_servers_in_the_pool():
    config = {"server_kinds": {"instance": "pyruvate", "client2": "waitress"}, "servers": ["instance", "client2"],
              "frontend_url": "http://127.0.0.1:8080/",
              "clients": {"instance": {"url": "http://127.0.0.1:8081"}, "client2": {"url": "http://127.0.0.1:8082"}}}
    urls, clients = headline.targets(config)
    assert urls == {"pyruvate": "http://127.0.0.1:8081", "waitress": "http://127.0.0.1:8082",
                    "haproxy": "http://127.0.0.1:8080"}
    assert clients == {"pyruvate": "instance", "waitress": "client2"}
    config["server_kinds"]["client2"] = "gunicorn"
    with pytest.raises(LookupError, match="no waitress client"):
        headline.targets(config)


@pytest.mark.integration
def test_one_short_round_on_the_stack(stack, tmp_path):
    """1 round of 1 s runs at 2 connections: every cell measured without errors, each client
    with the kit's pipeline and with Zope's stock one on every path, the blob through HAProxy
    with and without kernel splicing
    (the stack's HAProxy spliced blob bodies, its -dS copy none), the report written, the off
    clients and the copy stopped."""
    result = run([sys.executable, "-m", "loadtests", "headline", "--duration", "1", "--rounds", "1",
                  "--connections", "2", "--out", str(tmp_path)], timeout=600)
    print(result.stdout[-3000:])
    (folder,) = list(tmp_path.iterdir())
    data = json.loads((folder / "report.json").read_text())
    assert len(data["runs"]) == 5 * len(PATHS) + 1
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in data["runs"]), data["runs"]
    assert not any(r.get("short_bytes") for r in data["runs"])
    assert {f"{s} kit/stock {p}" for s in headline.SERVERS for p in PATHS} | {
            "pyruvate/waitress /", "haproxy blob splice/copy",
            "haproxy/best direct blob"} <= set(data["ratios"])
    # The bodies of the blob runs through the stack's HAProxy (5 MiB each; the first kilobytes
    # of each, read with the headers, are copied: 90 %) went through kernel pipes, besides
    # the warm-up's; none through the copy's.
    haproxy_blob_mib = sum(r["requests"] for r in data["runs"] if r["target"] == "haproxy" and r["path"] == "blob") * 5
    assert data["meta"]["spliced_mib"]["haproxy"] >= 0.9 * haproxy_blob_mib > 0, data["meta"]["spliced_mib"]
    assert data["meta"]["spliced_mib"]["haproxy-copy"] == 0
    assert (folder / "headline.png").stat().st_size > 0
    assert "Requests/s, median over the rounds" in (folder / "report.md").read_text()
    work = os.path.join(ROOT, "var", "headline")
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if any(work in a for a in p.info["cmdline"] or [])]
    # the copy's config is under var/headline too: no process left means it was stopped
    assert left == []
