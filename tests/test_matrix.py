"""The benchmark matrix (loadtests/matrix/matrix.py): its pure parts, and one real --quick run.

Unit tests: the trimmed mean (4 runs, drop highest and lowest), the plan (threads swept
only at --sweep-at connections, single-threaded servers only at 1), the randomized
interleaved order (every cell x run exactly once, round by round), resume (done runs
skipped, a cut last line ignored), the estimate, the hello ini, the aggregation and
option errors.

Integration test: ``--quick`` (pyruvate and waitress, connections 1 and 50, 1 s runs) on
the paths ``/``, ``blob`` and ``hello`` against the session stack (real ZEO, real clients,
real wrk), then ``--resume`` of the same folder, which must measure nothing new. About
3 minutes here (all five paths: about 4).
"""
import csv
import json
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from loadtests.core import stack as stack_module
from loadtests.matrix import matrix, matrix_plan, matrix_report, matrix_servers, matrix_summary
from loadtests.matrix.matrix_plan import Cell, Part

from conftest import ROOT, port_taken

SINGLE = ("bjoern", "gevent")


# -- trimmed mean ---------------------------------------------------------------------

def test_trimmed_mean_of_four_is_mean_of_middle_two():
    assert matrix_plan.trimmed_mean([10, 1, 4, 6]) == 5.0        # drops 1 and 10
    assert matrix_plan.trimmed_mean([3, 3, 3, 100]) == 3.0
    assert matrix_plan.trimmed_mean([2, 8, 5]) == 5.0            # three runs: the middle one


def test_trimmed_mean_with_few_or_missing_values():
    assert matrix_plan.trimmed_mean([4, 6]) == 5.0               # too few to trim
    assert matrix_plan.trimmed_mean([None, 7]) == 7.0
    assert matrix_plan.trimmed_mean([]) is None


# -- plan and order -------------------------------------------------------------------

def test_threads_swept_only_at_sweep_level_and_single_threaded_at_one():
    cells = matrix_plan.cells(["pyruvate", "bjoern"], ["/"], [1, 100, 1000], [1, 2, 4], 100, SINGLE)
    assert sorted(c for c in cells if c[0] == "pyruvate") == [
        Cell("pyruvate", 1, "/", 100), Cell("pyruvate", 2, "/", 1), Cell("pyruvate", 2, "/", 100),
        Cell("pyruvate", 2, "/", 1000), Cell("pyruvate", 4, "/", 100)]
    assert sorted(c for c in cells if c[0] == "bjoern") == [
        Cell("bjoern", 1, "/", 1), Cell("bjoern", 1, "/", 100), Cell("bjoern", 1, "/", 1000)]
    assert matrix_plan.parts_needed(cells) == [Part("bjoern", 1), Part("pyruvate", 1), Part("pyruvate", 2),
                                               Part("pyruvate", 4)]


def test_clients_and_sendfile_axes():
    """Through HAProxy over n clients: replicas 1..n of the part; sendfile off: the blob only;
    hello: direct only."""
    cells = matrix_plan.cells(["pyruvate"], ["/Plone", "blob", "hello"], [8], [2], None, SINGLE,
                              clients=[0, 2], sendfile=[True, False])
    assert sorted(cells) == sorted([
        Cell("pyruvate", 2, "/Plone", 8, 0, True), Cell("pyruvate", 2, "/Plone", 8, 2, True),
        Cell("pyruvate", 2, "blob", 8, 0, True), Cell("pyruvate", 2, "blob", 8, 0, False),
        Cell("pyruvate", 2, "blob", 8, 2, True), Cell("pyruvate", 2, "blob", 8, 2, False),
        Cell("pyruvate", 2, "hello", 8, 0, True)])
    assert matrix_plan.parts_needed(cells) == [Part("pyruvate", 2, False, 1), Part("pyruvate", 2, False, 2),
                                               Part("pyruvate", 2, True, 1), Part("pyruvate", 2, True, 2)]
    # without 0 among the client counts hello has no cell
    assert not [c for c in matrix_plan.cells(["pyruvate"], ["hello"], [8], [2], None, SINGLE, clients=[1, 2])]
    assert [matrix_servers.part_name(p) for p in matrix_plan.parts_needed(cells)] == [
        "m_pyruvate_t2_off", "m_pyruvate_t2_off_r2", "m_pyruvate_t2", "m_pyruvate_t2_r2"]


def test_zodb_cache_size_axis():
    """--zodb-cache-sizes: every Zope path once per size, each size its own parts (named
    _c<size>, built with that zodb-cache-size); the build's own size is cache 0, the
    default-built client; hello only with it."""
    args = matrix.parse_args(["--servers", "pyruvate", "--paths", "/Plone,hello", "--connections", "4",
                              "--threads", "2", "--zodb-cache-sizes", "1000,30000"])
    cells, parts, _ = matrix.plan(args)
    assert sorted(cells) == [Cell("pyruvate", 2, "/Plone", 4), Cell("pyruvate", 2, "/Plone", 4, cache=1000),
                             Cell("pyruvate", 2, "hello", 4)]
    assert parts == [Part("pyruvate", 2), Part("pyruvate", 2, cache=1000)]
    assert [matrix_servers.part_name(p) for p in parts] == ["m_pyruvate_t2", "m_pyruvate_t2_c1000"]
    assert [matrix_servers.has_hello(p) for p in parts] == [True, False]
    assert not matrix_plan.cells(["pyruvate"], ["hello"], [4], [2], None, SINGLE, caches=[1000])
    assert matrix_plan.cell_of({"server": "pyruvate", "threads": 2, "path": "/", "connections": 1}).cache == 0
    assert matrix_report.label({"server": "waitress", "cache": 5000, "clients": 2}) == \
        "waitress cache 5,000 ×2 via HAProxy"


@pytest.mark.parametrize("preset, cells, parts", [
    ("servers-wrk", 9, 9),              # every server once on / at 10 connections
    ("scaling", 3 * 4, 3 * 4),          # threads 1, 2, 4 x clients 1-4: replicas 1-4 per threads
    ("blob", 2 * 4 * 2 * 2, 2 * 2),     # servers x connections x clients 0, 1 x sendfile on, off
])
def test_presets_are_the_matrix_with_other_defaults(preset, cells, parts):
    args = matrix.parse_args([], preset)
    planned, needed, order = matrix.plan(args)
    assert (len(planned), len(needed), len(order)) == (cells, parts, 3 * cells)
    assert args.subcommand == preset
    # the command line overrides a preset's default
    assert matrix.parse_args(["--connections", "5"], preset).connections == [5]


def test_default_plan_size():
    args = matrix.parse_args([])
    cells, pairs, order = matrix.plan(args)
    # 7 multi-threaded servers x 5 paths x (4 levels + 2 extra threads at 100) + 2 x 5 x 4
    assert len(cells) == 7 * 5 * 6 + 2 * 5 * 4 == 250
    assert len(pairs) == 7 * 3 + 2 == 23
    assert len(order) == 3 * 250


def test_logged_in_runs_only_up_to_one_document_per_editor():
    """Locust's editors each save a document of their own up to 40 of them: the path class
    logged-in runs at the connection counts up to 40 only, the other paths at all."""
    cells = matrix_plan.cells(["pyruvate"], ["/", "logged-in"], [1, 10, 40, 100], [1, 2], 100, SINGLE)
    assert sorted(c.connections for c in cells if c.path == "logged-in") == [1, 10, 40]
    assert sorted(c.connections for c in cells if c.path == "/") == [1, 10, 40, 100, 100]
    assert not [c for c in cells if c.path == "logged-in" and c.threads == 1]   # the sweep at 100 left it out


def test_logged_in_is_opt_in_and_refused_without_its_editors(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("PLONEDEPLOY_EDITOR_PASSWORD", raising=False)
    monkeypatch.setattr(stack_module, "EDITOR_PASSWORD_FILE", str(tmp_path / "editor-password"))
    assert "logged-in" not in matrix.parse_args([]).paths
    with pytest.raises(SystemExit) as exc:
        matrix.parse_args(["--paths", "/,logged-in"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--paths logged-in: the logged-in shape needs the editors' password" in err
    assert "PLONEDEPLOY_EDITORS=on make site" in err
    (tmp_path / "editor-password").write_text("secret\n")
    assert matrix.parse_args(["--paths", "/,logged-in"]).paths == ["/", "logged-in"]
    assert stack_module.editor_password() == "secret"
    with pytest.raises(SystemExit):
        matrix.parse_args(["--paths", "logged-in", "--connections", "100,1000"])
    assert "--paths logged-in runs at up to 40 connections" in capsys.readouterr().err
    # a stored matrix with the path is checked again on --resume
    stored = dict(servers=["pyruvate"], paths=["logged-in"], connections=[4], threads=[2], sweep_at=None, runs=3,
                  duration=2, warmup=1, timeout=5, seed=3, noisy_pct=25.0, drain_max=20)
    (tmp_path / "options.json").write_text(json.dumps(stored))
    (tmp_path / "editor-password").unlink()
    with pytest.raises(SystemExit):
        matrix.parse_args(["--resume", str(tmp_path)])
    assert "--paths logged-in: the logged-in shape needs" in capsys.readouterr().err


def test_estimate_counts_each_locust_start_and_login():
    cell = ("pyruvate", 2, "logged-in", 4)
    runs = [(cell, i) for i in range(3)]
    expected = (3 * (2 + matrix_plan.RUN_OVERHEAD_S + matrix_plan.LOCUST_OVERHEAD_S)
                + (1 + matrix_plan.CELL_OVERHEAD_S + matrix_plan.LOCUST_OVERHEAD_S)
                + matrix_plan.STARTUP_BASE_S + matrix_plan.STARTUP_PER_PART_S)
    assert matrix_plan.estimate_seconds(runs, 1, duration=2, warmup=1) == pytest.approx(expected)


def test_order_covers_every_cell_and_run_once_round_by_round():
    cells = matrix_plan.cells(["pyruvate", "waitress"], ["/", "hello"], [1, 10], [2], None, SINGLE)
    order = matrix_plan.run_order(cells, 4, seed=7)
    assert sorted(order) == sorted((c, i) for c in cells for i in range(4))
    for index in range(4):                               # round i holds exactly the runs #i
        assert {c for c, i in order[index * len(cells):(index + 1) * len(cells)] if i == index} == set(cells)
    rounds = [[c for c, i in order if i == index] for index in range(4)]
    assert any(r != rounds[0] for r in rounds[1:])        # shuffled anew each round
    assert order == matrix_plan.run_order(cells, 4, seed=7)   # seeded: reproducible


# -- resume ---------------------------------------------------------------------------

def _record(cell, index, **extra):
    return dict(Cell(*cell)._asdict(), run=index, **extra)


def test_resume_skips_recorded_runs_and_a_cut_last_line(tmp_path):
    cells = matrix_plan.cells(["pyruvate"], ["/", "blob"], [1, 50], [2], None, SINGLE)
    order = matrix_plan.run_order(cells, 4, seed=1)
    results = tmp_path / "results.jsonl"
    done = order[:5]
    results.write_text("".join(json.dumps(_record(c, i)) + "\n" for c, i in done) + '{"server": "pyr')
    records = matrix_plan.load_results(str(results))
    assert len(records) == 5
    left = matrix_plan.remaining(order, records)
    assert left == order[5:]
    assert matrix_plan.remaining(order, [_record(c, i) for c, i in order]) == []
    assert matrix_plan.load_results(str(tmp_path / "missing.jsonl")) == []


def test_estimate():
    low, high = ("pyruvate", 2, "/", 10), ("pyruvate", 2, "/", 1000)
    hello = ("pyruvate", 2, "hello", 1000)
    runs = [(c, i) for c in (low, high, hello) for i in range(4)]
    expected = (12 * (2 + matrix_plan.RUN_OVERHEAD_S) + 4 * matrix_plan.HIGH_DRAIN_S   # only "/" at 1000
                + 3 * (1 + matrix_plan.CELL_OVERHEAD_S)
                + matrix_plan.STARTUP_BASE_S + 3 * matrix_plan.STARTUP_PER_PART_S)
    assert matrix_plan.estimate_seconds(runs, 3, duration=2, warmup=1) == pytest.approx(expected)
    assert matrix_plan.estimate_seconds([], 3, duration=2, warmup=1) == 0.0
    # Steady-state runs: "/" at 1000 connections needs 3 x 1000 / 800 -> 4 s, "/" at 10 the minimum
    # of 2 s, hello at 1000 3 x 1000 / 2000 -> 2 s (both under the 30 s cap).
    steady = (4 * (2 + 4 + 2) + 12 * matrix_plan.RUN_OVERHEAD_S + 4 * matrix_plan.HIGH_DRAIN_S
              + 3 * (1 + matrix_plan.CELL_OVERHEAD_S) + matrix_plan.STARTUP_BASE_S + 3 * matrix_plan.STARTUP_PER_PART_S)
    assert matrix_plan.estimate_seconds(runs, 3, duration=2, warmup=1, per_connection=3,
                                        max_duration=30) == pytest.approx(steady)
    args = matrix.parse_args([])
    cells, pairs, order = matrix.plan(args)
    minutes = matrix_plan.estimate_seconds(order, len(pairs), args.duration, args.warmup, args.drain_max,
                                           args.requests_per_connection, args.max_duration) / 60
    assert minutes < 90                                   # the limit for the full run


def test_run_lasts_long_enough_for_several_requests_per_connection():
    # 3 requests on each of 100 connections at 40 requests/s: 7.5 s, rounded up for wrk's -d
    assert matrix_plan.cell_duration(40.0, 100, 3, 1, 20) == 8
    assert matrix_plan.cell_duration(5000.0, 100, 3, 1, 20) == 1      # fast: the minimum
    assert matrix_plan.cell_duration(40.0, 1000, 3, 1, 20) == 20      # 75 s needed: the cap
    assert matrix_plan.cell_duration(None, 10, 3, 1, 20) == 20        # rate unknown
    assert matrix_plan.cell_duration(0.0, 10, 3, 1, 20) == 20         # nothing served yet
    assert matrix_plan.cell_duration(40.0, 100, 0, 2, 20) == 2        # fixed-length runs
    assert matrix_plan.steady(300, 100, 3) and not matrix_plan.steady(299, 100, 3)


# -- hello ini, aggregation, options --------------------------------------------------

def test_hello_servers_are_the_recipes_hello_address(tmp_path, monkeypatch):
    """Each part gets ``hello-address`` on its hello port (the recipe renders etc/hello.ini;
    tests/test_options.py and tests/test_recipe_buildout.py check what it writes), and the
    hello process serves that file."""
    built = {}
    monkeypatch.setattr(matrix_servers.serverbuild, "build_parts",
                        lambda directory, parts, zeo, blobs, part_options, service_user:
                        built.update(parts=parts, options=part_options, user=service_user) or 7.0)
    parts = [Part("pyruvate", 2), Part("waitress", 1), Part("waitress", 1, False), Part("waitress", 1, True, 2),
             Part("waitress", 1, cache=500)]
    ports = matrix_servers.assign_ports(parts, 9510)
    assert matrix_servers.build(str(tmp_path), parts, ports, "127.0.0.1:8100", "/blobs", "plonedeploy") == 7.0
    assert built["user"] == "plonedeploy"  # the parts run as the stack's service user
    assert built["parts"] == [("m_pyruvate_t2", "pyruvate", 9510, 2), ("m_waitress_t1", "waitress", 9512, 1),
                              ("m_waitress_t1_off", "waitress", 9514, 1), ("m_waitress_t1_r2", "waitress", 9516, 1),
                              ("m_waitress_t1_c500", "waitress", 9518, 1)]
    assert built["options"] == {"m_pyruvate_t2": "hello-address = 127.0.0.1:9511\n",
                                "m_waitress_t1": "hello-address = 127.0.0.1:9513\n",
                                "m_waitress_t1_off": "blob-sendfile = off\n", "m_waitress_t1_r2": "",
                                "m_waitress_t1_c500": "zodb-cache-size = 500\n"}
    config = matrix_servers.run_config(str(tmp_path), parts, ports)
    hello = next(p for p in config["processes"] if p["name"] == "m_waitress_t1-hello")
    assert hello["argv"][-1] == str(tmp_path / "parts" / "m_waitress_t1" / "etc" / "hello.ini")
    assert hello["ready"] == {"http": "http://127.0.0.1:9513/"}
    # only the default-built first client of a (server, threads) serves hello world
    assert sorted(p["name"] for p in config["processes"]) == [
        "m_pyruvate_t2", "m_pyruvate_t2-hello", "m_waitress_t1", "m_waitress_t1-hello", "m_waitress_t1_c500",
        "m_waitress_t1_off", "m_waitress_t1_r2"]


def test_aggregate_trims_sums_errors_and_flags_noisy():
    cell = ("waitress", 2, "/", 10)
    runs = [_record(cell, i, requests=100 * (i + 1), rps=rps, p50_ms=1.0, p95_ms=2.0, p99_ms=p99, max_ms=9.0,
                    cpu_ms_per_req=1.0, errors={"connect": 0, "read": i, "write": 0, "timeout": 0},
                    non_2xx=1, peak_rss_bytes=rss * 2**20, foreign_pct=foreign, drain_before_s=drain,
                    backlog=drain >= 20)
            for i, (rps, p99, rss, foreign, drain) in enumerate([(100, 5, 200, 10, 0.3), (300, 50, 210, 40, 20.1),
                                                                 (200, 7, 190, 30, 0.3), (220, 6, 205, 40, 0.5)])]
    [row] = matrix_report.aggregate(runs, noisy_pct=25)
    assert row["rps"] == 210.0 and row["p99_ms"] == 6.5
    assert row["requests"] == 1000 and row["err_read"] == 6 and row["non_2xx"] == 4
    assert row["peak_rss_mib"] == 210.0 and row["foreign_pct"] == 30.0 and row["noisy"] is True
    assert row["drain_s"] == 5.3 and row["backlog"] is True
    assert row["duration_s"] == 1.0 and row["req_per_conn"] == 10.0 and row["steady"] is True
    report = matrix_report.markdown([row], dict(started="t", cores=2, servers=["waitress"], paths=["/"], runs=4,
                                                duration_s=1, warmup_s=1, seed=1, timeout_s=5, cells_done=1,
                                                cells_planned=1, runs_done=4, runs_planned=4, estimate_s=60,
                                                noisy_pct=25, drain_max_s=20), [])
    assert "| 30.0 ! | 5.3 B | 1.0 | 10.0 | 4 |" in report


def test_cell_with_a_short_run_is_not_steady():
    cell = ("waitress", 2, "/Plone", 100)
    base = dict(rps=40.0, p50_ms=1.0, p95_ms=2.0, p99_ms=3.0, max_ms=9.0, cpu_ms_per_req=1.0,
                errors={"connect": 0, "read": 0, "write": 0, "timeout": 0}, non_2xx=0, peak_rss_bytes=2**20,
                foreign_pct=0.0)
    runs = [_record(cell, 0, requests=320, duration_s=8, **base), _record(cell, 1, requests=290, duration_s=8, **base),
            _record(cell, 2, requests=400, duration_s=11, **base)]
    [row] = matrix_report.aggregate(runs, noisy_pct=25, per_connection=3)
    assert row["duration_s"] == 9.0 and row["req_per_conn"] == 2.9 and row["steady"] is False
    meta = dict(started="t", cores=2, servers=["waitress"], paths=["/Plone"], runs=3, duration_s=1, max_duration_s=20,
                requests_per_connection=3, warmup_s=1, seed=1, timeout_s=5, cells_done=1, cells_planned=1,
                runs_done=3, runs_planned=3, estimate_s=60, noisy_pct=25, drain_max_s=20)
    report = matrix_report.markdown([row], meta, [])
    assert "| 9.0 | 2.9 U | 3 |" in report
    assert "of 1-20 s (long enough for 3 requests per connection" in report
    assert "marked `U`): 1." in report


def test_logged_in_cells_are_reported_as_editors(tmp_path):
    """A logged-in cell in the report: its own note (editors, Locust's failures as non-2xx),
    its table and its plot."""
    cell = ("pyruvate", 2, "logged-in", 4)
    runs = [_record(cell, i, requests=n, rps=n / 10, p50_ms=150.0, p95_ms=300.0, p99_ms=400.0, max_ms=500.0,
                    cpu_ms_per_req=90.0, errors={"connect": 0, "read": 0, "write": 0, "timeout": 0}, non_2xx=i,
                    peak_rss_bytes=300 * 2**20, foreign_pct=5.0, duration_s=10, wrk_threads=None)
            for i, n in enumerate([120, 130, 140])]
    meta = dict(started="t", cores=2, servers=["pyruvate"], paths=["logged-in"], runs=3, duration_s=1,
                max_duration_s=20, requests_per_connection=3, warmup_s=1, seed=1, timeout_s=5, cells_done=1,
                cells_planned=1, runs_done=3, runs_planned=3, estimate_s=60, noisy_pct=25, drain_max_s=20)
    rows = matrix_report.write_all(runs, meta, str(tmp_path), SINGLE)
    assert rows[0]["rps"] == 13.0 and rows[0]["non_2xx"] == 3
    report = (tmp_path / "report.md").read_text()
    assert "## logged-in" in report and "Locust's logged-in shape, not wrk: conns = editors" in report
    assert "| pyruvate | 2 | 4 | 13.0 |" in report
    assert (tmp_path / "matrix-logged-in.png").stat().st_size > 0


def test_summary_tables_per_connection_count_and_threads():
    """The docs' tables: default threads per connection count with errors, p99 and marks;
    the threads sweep of the multi-threaded servers only."""
    base = dict(p50_ms=1.0, p95_ms=2.0, max_ms=9.0, non_2xx=0, foreign_pct=0.0, duration_s=5)
    no_errors = {"connect": 0, "read": 0, "write": 0, "timeout": 0}
    spec = [  # (server, threads, path, connections, rps, p99, requests, read errors, rss MiB, drain)
        ("pyruvate", 2, "/", 100, 1000.0, 80.0, 15000, 0, 180, 0.1),
        ("pyruvate", 2, "hello", 100, 9000.0, 5.0, 90000, 0, 19, 0.1),
        ("pyruvate", 1, "/", 100, 600.0, 90.0, 9000, 0, 178, 0.1),
        ("pyruvate", 4, "/", 100, 900.0, 70.0, 14000, 0, 185, 0.1),
        ("bjoern", 1, "/", 100, 1100.0, 60.0, 16000, 0, 170, 0.1),
        ("bjoern", 1, "/", 1000, 50.0, 900.0, 1500, 7, 171, 25.0),
    ]
    records = []
    for server, threads, path, conns, rps, p99, requests, read, rss, drain in spec:
        records += [_record((server, threads, path, conns), i, rps=rps, p99_ms=p99, requests=requests,
                            cpu_ms_per_req=0.8, errors=dict(no_errors, read=read), peak_rss_bytes=rss * 2**20,
                            drain_before_s=drain, backlog=drain >= 20, **base) for i in range(3)]
    rows = matrix_report.aggregate(records, noisy_pct=25, per_connection=3)
    text = matrix_report.summary(rows, {"paths": ["/", "/Plone", "hello"], "servers": ["pyruvate", "bjoern"],
                                        "sweep_at": 100}, SINGLE)
    assert "### 100 connections" in text and "### 1,000 connections" in text
    assert "| pyruvate (2) | 1,000.0 / 0 / 80.0 | 9,000.0 / 0 / 5.0 | 180 / 19 | 0.8 |" in text
    # 1,000 connections: 1,500 requests, 1.5 per connection (U), a backlog run (B), 21 read errors
    assert "| bjoern (1) | 50.0 / 21 / 900.0 UB | - | 171 / - | 0.8 |" in text
    assert "`/Plone`" not in text  # no cells of it
    assert "| pyruvate | `/` | 600.0 | 1,000.0 | 900.0 | 178 / 180 / 185 |" in text
    assert "| bjoern |" not in text.split("### Threads")[1]
    assert ("1 thread against 2, over 1 server × path cells: geometric mean 0.60 (0.60–0.60); "
            "more req/s than 2 threads in 0 of 1.") in text
    assert "pyruvate / waitress" not in text  # no waitress runs: no ratio table


def test_round_ratios_pair_the_runs_of_one_round():
    """pyruvate's req/s over waitress's, run k against run k, median and range in the summary."""
    records = [_record(("pyruvate", 2, "/", 10), k, rps=rps) for k, rps in enumerate([100.0, 90.0, 120.0])]
    records += [_record(("waitress", 2, "/", 10), k, rps=rps) for k, rps in enumerate([50.0, 60.0, 40.0])]
    records += [_record(("waitress", 4, "/", 10), 0, rps=1.0)]  # not the default threads: ignored
    assert matrix_summary.round_ratios(records, "pyruvate", "waitress", SINGLE) == {("/", 10): [2.0, 1.5, 3.0]}
    base = dict(p50_ms=1.0, p95_ms=2.0, p99_ms=3.0, max_ms=9.0, cpu_ms_per_req=1.0, requests=1000, non_2xx=0,
                errors={"connect": 0, "read": 0, "write": 0, "timeout": 0}, peak_rss_bytes=2**20, foreign_pct=0.0)
    rows = matrix_report.aggregate([dict(r, **base) for r in records], noisy_pct=25)
    text = matrix_report.summary(rows, {"paths": ["/"], "servers": ["pyruvate", "waitress"], "sweep_at": None},
                                 SINGLE, records)
    assert "| `/` | 2.00 (1.50–3.00) |" in text


def test_sendfile_and_clients_summaries_pair_the_runs_of_one_round():
    base = dict(p50_ms=1.0, p95_ms=2.0, p99_ms=3.0, max_ms=9.0, cpu_ms_per_req=1.0, requests=1000, non_2xx=0,
                errors={"connect": 0, "read": 0, "write": 0, "timeout": 0}, peak_rss_bytes=2**20, foreign_pct=0.0)
    records = []
    for cell, rates in [(("pyruvate", 2, "blob", 4, 0, True), [200.0, 180.0, 210.0]),
                        (("pyruvate", 2, "blob", 4, 0, False), [100.0, 120.0, 70.0]),
                        (("pyruvate", 2, "/Plone", 8, 1, True), [40.0, 50.0, 45.0]),
                        (("pyruvate", 2, "/Plone", 8, 2, True), [60.0, 100.0, 90.0])]:
        records += [_record(cell, k, rps=rps, **base) for k, rps in enumerate(rates)]
    records[-1]["share"] = {"m_pyruvate_t2": 0.45, "m_pyruvate_t2_r2": 0.55}
    assert matrix_plan.Cell("pyruvate", 2, "blob", 4) in matrix_summary.sendfile_ratios(records)
    assert matrix_summary.sendfile_ratios(records)[Cell("pyruvate", 2, "blob", 4)] == [2.0, 1.5, 3.0]
    assert matrix_summary.client_ratios(records) == {Cell("pyruvate", 2, "/Plone", 8, 2): [1.5, 2.0, 2.0]}
    rows = matrix_report.aggregate(records, noisy_pct=25)
    text = matrix_report.summary(rows, {"paths": ["/Plone", "blob"], "servers": ["pyruvate"], "sweep_at": None},
                                 SINGLE, records)
    assert "| pyruvate (2) | direct | 4 | 200.0 | 100.0 | 2.00 (1.50–3.00) |" in text
    assert "| pyruvate (2) | `/Plone` | 8 | 45.0 | 90.0, ×2.00 (1.50–2.00), share ≥ 0.45 |" in text
    assert matrix_report.label(rows[0]) in ("pyruvate", "pyruvate ×1 via HAProxy", "pyruvate ×2 via HAProxy",
                                            "pyruvate sendfile off")


def test_cache_and_thread_ratios_pair_the_runs_of_one_round():
    base = dict(p50_ms=1.0, p95_ms=2.0, p99_ms=3.0, max_ms=9.0, cpu_ms_per_req=1.0, requests=1000, non_2xx=0,
                errors={"connect": 0, "read": 0, "write": 0, "timeout": 0}, peak_rss_bytes=2**20, foreign_pct=0.0)
    records = []
    for cell, rates in [(("pyruvate", 2, "logged-in", 4), [20.0, 18.0, 21.0]),
                        (("pyruvate", 2, "logged-in", 4, 0, True, 1000), [10.0, 18.0, 7.0]),
                        (("pyruvate", 1, "logged-in", 4), [10.0, 9.0, 42.0]),
                        (("pyruvate", 4, "logged-in", 4), [20.0, 36.0, 21.0])]:
        records += [_record(cell, k, rps=rps, **base) for k, rps in enumerate(rates)]
    assert matrix_summary.cache_ratios(records) == {Cell("pyruvate", 2, "logged-in", 4, cache=1000): [0.5, 1.0, 1/3]}
    assert matrix_summary.thread_round_ratios(records, 4, SINGLE) == {
        Cell("pyruvate", 1, "logged-in", 4): [0.5, 0.5, 2.0], Cell("pyruvate", 4, "logged-in", 4): [1.0, 2.0, 1.0]}
    rows = matrix_report.aggregate(records, noisy_pct=25)
    text = matrix_report.summary(rows, {"paths": ["logged-in"], "servers": ["pyruvate"], "sweep_at": 4},
                                 SINGLE, records)
    assert "| pyruvate (2) | `logged-in` | direct | 4 | 1,000 | 10.0 | 20.0 | 0.50 (0.33–1.00) | 1 / 1 |" in text
    assert "| pyruvate | `logged-in` | 0.50 (0.50–2.00) | 1.00 (1.00–2.00) |" in text
    assert "| server | path | 1/2 | 4/2 |" in text


@pytest.mark.parametrize("argv, needle", [
    (["--servers", "pyruvate,nginx"], "allowed: pyruvate, waitress"),
    (["--zodb-cache-sizes", "0"], "--zodb-cache-sizes: expected comma-separated integers >= 1"),
    (["--paths", "/x"], "allowed: /, /Plone, @json, blob, hello"),
    (["--connections", "0"], "--connections"),
    (["--sweep-at", "many"], "--sweep-at"),
    (["--runs", "0"], "--runs"),
    (["--duration", "5", "--max-duration", "2"], "--max-duration 2 is below --duration 5"),
    (["--requests-per-connection", "-1"], "--requests-per-connection"),
    (["--clients", "-1"], "--clients: expected comma-separated integers >= 0"),
    (["--sendfile", "maybe"], "--sendfile: maybe not allowed; allowed: on, off"),
])
def test_bad_options_name_the_option(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        matrix.parse_args(argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


# -- integration ----------------------------------------------------------------------

@pytest.mark.integration
def test_quick_matrix_against_the_stack_then_resume_measures_nothing(stack, tmp_path):
    if not shutil.which("wrk"):
        pytest.fail("wrk not installed (make system)")
    taken = [p for p in range(9510, 9514) if port_taken(p)]
    assert not taken, f"matrix ports in use: {taken}"
    out = tmp_path / "reports"
    build = tmp_path / "build"
    # Three of the five paths (Zope's root, the blob, hello) keep the test near 3 minutes.
    cmd = [sys.executable, "-m", "loadtests", "matrix", "--quick", "--paths", "/,blob,hello", "--out", str(out),
           "--build", str(build), "--seed", "42"]
    started = time.monotonic()
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    print(f"--quick wall time {wall:.0f} s")
    [folder] = list(out.iterdir())
    for name in ("results.jsonl", "options.json", "matrix.csv", "matrix.json", "report.md", "matrix-root.png",
                 "matrix-hello.png", "matrix-blob.png"):
        assert (folder / name).stat().st_size > 0, name
    records = matrix_plan.load_results(str(folder / "results.jsonl"))
    assert len(records) == 2 * 3 * 2 * 4                  # servers x paths x connections x runs
    # --quick keeps 1 s runs and says per run whether the connections got 3 requests each
    assert {r["duration_s"] for r in records} == {1}
    assert all(r["steady"] == (r["requests"] >= 3 * r["connections"]) for r in records)
    rows = {(r["server"], r["path"], int(r["connections"])): r for r in csv.DictReader(open(folder / "matrix.csv"))}
    assert len(rows) == 12
    for server in ("pyruvate", "waitress"):
        for path in ("/", "hello"):
            row = rows[(server, path, 1)]
            assert int(row["requests"]) > 0 and float(row["rps"]) > 0, row
            assert int(row["non_2xx"]) == 0, row
            assert float(row["peak_rss_mib"]) > 0, row
    cells = json.load(open(folder / "matrix.json"))["cells"]
    assert {c["path"] for c in cells} == {"/", "blob", "hello"}
    report = (folder / "report.md").read_text()
    assert "## hello" in report and "foreign CPU" in report and "| req/conn |" in report
    assert "stopped 4 servers" in first.stdout
    assert not [p for p in range(9510, 9514) if port_taken(p)], "matrix servers still listening"

    again = subprocess.run([sys.executable, "-m", "loadtests", "matrix", "--resume", str(folder),
                            "--build", str(build)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "48 runs already measured" in again.stdout
    assert "building" not in again.stdout                  # nothing left: no server started
    assert len(matrix_plan.load_results(str(folder / "results.jsonl"))) == 48


def test_resume_of_a_matrix_stored_before_steady_state_runs(tmp_path):
    """An options.json without the steady-state keys resumes with its fixed-length runs."""
    stored = dict(servers=["pyruvate"], paths=["/"], connections=[1, 50], threads=[2], sweep_at=None, runs=4,
                  duration=2, warmup=1, timeout=5, seed=3, noisy_pct=25.0, drain_max=20)
    (tmp_path / "options.json").write_text(json.dumps(stored))
    args = matrix.parse_args(["--resume", str(tmp_path)])
    assert (args.duration, args.max_duration, args.requests_per_connection) == (2, 2, 0)


@pytest.mark.integration
def test_clients_and_sendfile_axes_against_the_stack(stack, tmp_path):
    """The ``scaling`` preset with both extra axes on a small plan: /Plone and the blob,
    direct and through a temporary HAProxy over 1 and 2 ZEO clients, the blob with
    blob-sendfile on and off. Checks the mechanism, not the speed: every cell served without
    errors, both clients of a 2-client cell got traffic, the report has both summaries and
    the clients plot, and no client or HAProxy is left running."""
    taken = [p for p in range(9530, 9540) if port_taken(p)]
    assert not taken, f"matrix ports in use: {taken}"
    out, build = tmp_path / "reports", tmp_path / "build"
    before = {p.pid for p in psutil.process_iter()}
    result = subprocess.run(
        [sys.executable, "-m", "loadtests", "scaling", "--paths", "/Plone,blob", "--connections", "4",
         "--threads", "1", "--clients", "0,1,2", "--sendfile", "on,off", "--runs", "2", "--duration", "2",
         "--max-duration", "4", "--base-port", "9530", "--out", str(out), "--build", str(build)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    [folder] = list(out.iterdir())
    assert folder.name.startswith("scaling-")
    records = matrix_plan.load_results(str(folder / "results.jsonl"))
    # /Plone: 3 client counts; blob: 3 x sendfile on/off; 2 runs each
    assert len(records) == (3 + 6) * 2
    assert all(r["rps"] > 0 and r["non_2xx"] == 0 and not sum(r["errors"].values()) for r in records), records
    two = [r for r in records if r["clients"] == 2]
    # both clients got traffic; not a balance figure (a 2 s cell on a busy machine gave one
    # client less than 20 %)
    assert all(set(r["share"]) == {"m_pyruvate_t1", "m_pyruvate_t1_r2"} and min(r["share"].values()) > 0
               for r in two if r["path"] == "/Plone"), two
    assert {r["share"] and tuple(sorted(r["share"])) for r in records if r["sendfile"] is False and r["clients"] == 2} \
        == {("m_pyruvate_t1_off", "m_pyruvate_t1_off_r2")}
    assert all("share" not in r for r in records if r["clients"] == 0)
    report = (folder / "report.md").read_text()
    assert "### blob-sendfile on / off on the blob" in report
    assert "### ZEO clients behind HAProxy" in report
    assert (folder / "matrix-clients.png").stat().st_size > 0
    assert "stopped 4 servers" in result.stdout        # 4 ZEO clients; no hello: its path was not asked for
    print("\n" + result.stdout[-1500:])
    left = [p for p in psutil.process_iter(["pid", "cmdline"])
            if p.info["pid"] not in before and str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not left, left
