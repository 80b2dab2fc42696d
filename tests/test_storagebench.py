"""loadtests.storage.storagebench (``python -m loadtests storage``): options, plan, ports, the
variants' configs, summary, ratios and report without measuring; then one short run on real
stacks (a ZEO server and a PostgreSQL 15 of its own, ports 9750-9779) and one ``--per-request``
run on three (ports 9780-9824), which are optional: 3-5 minutes each on 2 cores, most of it
the builds, sites and Zope start-ups, so they run only with PLONEDEPLOY_STORAGEBENCH=1 (CI is
near its time limit)."""
import json
import os
import shutil
import sys

import psutil
import pytest

from conftest import ROOT, run
from loadtests.core.stack import BLOB_SIZE
from loadtests.storage import storagebench
from loadtests.storage.summary import reads_within
from loadtests.storage.variant import buildout_text


def test_options_fail_naming_the_option_and_allowed_values(capsys):
    for argv, message in ((["--variants", "relstorage"], "--variants: expected zeo and at least one of"),
                          (["--variants", "zeo,nfs"], "--variants: nfs is invalid; expected comma-separated "
                                                      "values of: zeo, relstorage, relstorage-shared, rs-explicit, rs-implicit, "
                                                      "rs-cache-100mb, rs-cache-dir, rs-blob-cache-1gb, rs-pg-tuned, "
                                                      "rs-tuned"),
                          (["--paths", "/,put"], "--paths: put is invalid"),
                          (["--connections", "0"], "--connections: expected comma-separated integers >= 1"),
                          (["--server", "apache"], "--server: invalid choice: 'apache'"),
                          (["--base-port", "80"], "--base-port: expected 1024..")):
        with pytest.raises(SystemExit) as exited:
            storagebench.parse_args(argv)
        assert exited.value.code == 2
        assert message in capsys.readouterr().err, argv
    args = storagebench.parse_args(["--variants", "relstorage,zeo", "--paths", "write,/"])
    assert args.variants == ["zeo", "relstorage"]  # zeo first: the baseline of every ratio
    assert args.paths == ["/", "write"] and args.connections == [1, 10, 100]
    assert not hasattr(args, "stack_config")  # it builds its own stacks
    # the tuning variants only when asked for: make storagebench keeps its three
    assert storagebench.parse_args([]).variants == ["zeo", "relstorage", "relstorage-shared"]
    assert storagebench.parse_args(["--variants", "rs-tuned,zeo,rs-explicit"]).variants == [
        "zeo", "rs-explicit", "rs-tuned"]


def test_plan_runs_every_cell_once_per_round_variants_adjacent_and_rotated():
    variants = ["zeo", "relstorage", "relstorage-shared"]
    todo = storagebench.plan(3, ["/", "blob", "write"], [1, 10], variants)
    assert len(todo) == 3 * 3 * 2 * 3
    for number in (1, 2, 3):
        cells = [(label, n, v) for r, label, n, v in todo if r == number]
        assert sorted(cells) == sorted((label, n, v) for label in ["/", "blob", "write"] for n in [1, 10]
                                       for v in variants)
    # the variants of one group run right after each other ...
    for start in range(0, len(todo), 3):
        group = todo[start:start + 3]
        assert len({(r, label, n) for r, label, n, _ in group}) == 1
        assert {v for *_, v in group} == set(variants)
    # ... none always first, and the groups start elsewhere from round to round
    assert {todo[start][3] for start in range(0, len(todo), 3)} == set(variants)
    assert len({todo[i][1:3] for i in (0, 18, 36)}) == 3


@pytest.mark.parametrize("variants, labels, counts", [
    (["zeo", "relstorage", "rs-explicit"], ["/", "/Plone", "@json"], [10]),
    (["zeo", "relstorage", "rs-explicit", "rs-pg-tuned", "rs-tuned"], ["/", "/Plone", "@json", "blob"], [10]),
    (["zeo", "relstorage"], ["/", "blob", "write"], [1, 10, 100]),
])
def test_plan_puts_each_variant_in_each_place_of_each_group_once_per_cycle(variants, labels, counts):
    # The storage run of 28 Nov 2026 (3 rounds, 4 groups, 5 variants) ran every group in the
    # same variant order in each round: the round's group shift cancelled the variants' rotation.
    todo = storagebench.plan(len(variants), labels, counts, variants)
    places = {}
    for r, label, n, v in todo:
        order = places.setdefault((label, n), {}).setdefault(r, [])
        order.append(v)
    for group, orders in places.items():
        for place in range(len(variants)):
            assert sorted(order[place] for order in orders.values()) == sorted(variants), (group, orders)


def test_ports_give_each_variant_its_own_block_and_move_every_port():
    first, second = storagebench.ports(9700, 0), storagebench.ports(9700, 1)
    assert first["zeoserver"] == first["postgresql"] == 9700 and first["instance"] == 9701
    assert second["zeoserver"] == 9715 and max(second.values()) < 9730
    assert not set(first.values()) & set(second.values())
    buildout_ports = {"zeoserver", "instance", "client2", "uploads", "haproxy", "stats", "tls", "varnish",
                      "cache-fill", "instance-metrics", "client2-metrics", "uploads-metrics", "varnish-metrics"}
    assert buildout_ports <= set(first)  # buildout.cfg's [ports]: none stays on the demo's


def test_buildout_text_per_variant(tmp_path):
    zeo = buildout_text("zeo", str(tmp_path), storagebench.ports(9700, 0), "waitress")
    assert f"extends = {ROOT}/buildout.cfg" in zeo
    assert "parts = zeoserver instance haproxy stack" in zeo
    assert "wsgi-server = waitress" in zeo and "instance = 9701" in zeo and "relstorage" not in zeo
    shared = buildout_text("relstorage-shared", str(tmp_path), storagebench.ports(9700, 2), "pyruvate")
    assert f"extends = {ROOT}/relstorage.cfg" in shared
    assert "parts = postgresql instance haproxy stack" in shared
    assert "relstorage-blobs = shared-directory" in shared and "postgresql = 9730" in shared


def test_tuning_variants_set_one_thing_each_and_rs_tuned_them_together(tmp_path):
    """Issue 32's variants: each an explicit setting on relstorage.cfg with blobs in the
    database (its blob directory a cache), the PostgreSQL settings in [postgresql]; the
    plain relstorage variant sets none of them."""
    from loadtests.storage.plan import VARIANTS, blobs_in_database

    texts = {name: buildout_text(name, str(tmp_path), storagebench.ports(9700, i), "pyruvate")
             for i, name in enumerate(VARIANTS)}
    tuning = {"rs-explicit": "transaction-mode = explicit", "rs-implicit": "transaction-mode = implicit",
              "rs-cache-100mb": "relstorage-cache-local-mb = 100",
              "rs-cache-dir": "relstorage-cache-local-dir = ${buildout:directory}/var/relstorage-cache",
              "rs-blob-cache-1gb": "relstorage-blob-cache-size = 1GB",
              "rs-pg-tuned": "[postgresql]\nsettings =\n    shared_buffers = 256MB\n    work_mem = 16MB\n"
                             "    plan_cache_mode = force_generic_plan\n    jit = off\n"}
    for name, line in tuning.items():
        assert line in texts[name] and line not in texts["relstorage"], name
        assert all(line not in texts[other] for other in tuning if other != name)
        assert line in texts["rs-tuned"] or name in ("rs-blob-cache-1gb", "rs-implicit"), name
        assert f"extends = {ROOT}/relstorage.cfg" in texts[name] and blobs_in_database(name)
    assert blobs_in_database("relstorage") and not blobs_in_database("relstorage-shared")
    assert not blobs_in_database("zeo")


def _row(number, variant, path, n, rps, errors=0):
    return {"round": number, "variant": variant, "path": path, "connections": n, "rps": rps,
            "p50_ms": 10.0 * number, "p99_ms": 50.0, "client_cpu_ms": 20.0, "database_cpu_ms": 2.0 * number,
            "errors": errors}


def test_summary_ratios_per_round_and_the_reads_goal():
    runs = [_row(1, "zeo", "/Plone", 10, 100), _row(2, "zeo", "/Plone", 10, 200), _row(3, "zeo", "/Plone", 10, 100),
            _row(1, "relstorage", "/Plone", 10, 95), _row(2, "relstorage", "/Plone", 10, 100),
            _row(3, "relstorage", "/Plone", 10, 120),
            _row(1, "zeo", "write", 1, 20), _row(1, "relstorage", "write", 1, 10, errors=3)]
    cells, ratios = storagebench.summarize(runs, ["zeo", "relstorage"])
    assert cells["zeo /Plone 10"]["rps"] == {"median": 100.0, "min": 100.0, "max": 200.0}
    assert cells["relstorage /Plone 10"]["p50_ms"] == 20.0 and cells["relstorage /Plone 10"]["runs"] == 3
    assert cells["relstorage write 1"]["errors"] == 3
    # per round 0.95, 0.5, 1.2: the ratio of the medians (1.0) would hide the spread
    assert ratios["relstorage/zeo /Plone 10"] == {"median": 0.95, "min": 0.5, "max": 1.2}
    assert ratios["relstorage/zeo write 1"]["median"] == 0.5
    assert "zeo/zeo /Plone 10" not in ratios
    assert reads_within(ratios) == {"relstorage": True}  # the write ratio does not count
    ratios["relstorage/zeo / 1"] = {"median": 0.89, "min": 0.8, "max": 0.9}
    assert reads_within(ratios) == {"relstorage": False}


def test_markdown_has_every_cell_ratio_and_size():
    runs = [_row(1, "zeo", "/", 1, 50), _row(1, "relstorage", "/", 1, 45), _row(1, "zeo", "write", 1, 10),
            _row(1, "relstorage", "write", 1, 5)]
    cells, ratios = storagebench.summarize(runs, ["zeo", "relstorage"])
    meta = {"started": "s", "command": "python -m loadtests storage", "rounds": 1, "warmup_s": 2, "duration_s": 5,
            "server": "pyruvate", "cores": 2, "load_before": [1.0], "load_during": [2.0], "load_after": [1.5],
            "minutes": 3.0, "variants": ["zeo", "relstorage"], "paths": ["/", "write"], "connections": [1],
            "setup": {"zeo": {"first_blob_s": 0.5}, "relstorage": {"first_blob_s": 1.8}}}
    sizes = {"zeo": {"documents": 40, "data_bytes": 3 * 2**20, "blob_bytes": 5 * 2**20, "total_bytes": 8 * 2**20,
                     "what": "Data.fs + var/blobstorage"},
             "relstorage": {"documents": 30, "data_bytes": 20 * 2**20, "blob_bytes": 5 * 2**20,
                            "total_bytes": 25 * 2**20, "what": "pg_database_size + blob cache"}}
    text = storagebench.to_markdown(meta, cells, ratios, sizes)
    assert "| / | 1 | 50.0 (50.0–50.0) | 45.0 (45.0–45.0) |" in text
    assert "| / | 1 | 0.90 (0.90–0.90) |" in text and "| write | 1 | 0.50 (0.50–0.50) |" in text
    assert "relstorage yes" in text
    assert "| relstorage | 30 | 20.0 | 5.0 | 25.0 | pg_database_size + blob cache | 1.8 |" in text
    assert "10.0 / 50.0 ms; cpu 20.0 / 2.0" in text


def test_write_answers_count_every_post_of_the_write_path_in_the_access_log(tmp_path):
    """The client's access log as the stack writes it (paste's translogger): every POST to
    the write folder by status, whoever waited for it; other requests are not counted."""
    log = tmp_path / "var" / "log"
    log.mkdir(parents=True)
    line = '127.0.0.1 - admin [27/Nov/2026:10:21:41 +0000] "{} HTTP/1.1" {} 3766 "-" "-"\n'
    (log / "instance-access.log").write_text(
        line.format("POST /Plone/bench-writes", 201) * 3 + line.format("POST /Plone/bench-writes", 500)
        + line.format("GET /Plone/bench-writes", 200) + line.format("POST /Plone", 201)
        + line.format("POST /Plone/bench-writes-2", 500), encoding="utf-8")
    variant = storagebench.Variant.__new__(storagebench.Variant)  # only its directory: no stack.json here
    variant.directory = str(tmp_path)
    assert variant.write_answers() == {"201": 3, "500": 1}
    variant.directory = str(tmp_path / "nothing")
    assert variant.write_answers() == {}


def test_plot_draws_a_panel_per_connection_count(tmp_path):
    runs = [_row(r, v, p, n, 10 * r + n) for r in (1, 2) for v in ("zeo", "relstorage") for p in ("/", "blob")
            for n in (1, 10)]
    cells, _ = storagebench.summarize(runs, ["zeo", "relstorage"])
    path = tmp_path / "storage.png"
    storagebench.plot(cells, {"variants": ["zeo", "relstorage"], "paths": ["/", "blob"], "connections": [1, 10]},
                      str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.integration
@pytest.mark.skipif(os.environ.get("PLONEDEPLOY_STORAGEBENCH") != "1",
                    reason="optional (3-4 min): set PLONEDEPLOY_STORAGEBENCH=1")
def test_one_short_round_on_real_stacks(tmp_path):
    """ZEO and RelStorage built and started side by side on ports 9750 and up, 1 round of 3 s
    runs of /Plone and the write path at 1 connection (a POST takes 0.3-0.6 s on a busy
    2-core machine: 1 s runs could end with none): every cell has requests and no errors,
    the sizes are measured, the report written, and no process is left."""
    work = os.path.join(ROOT, "var", "storagebench-test")
    result = run([sys.executable, "-m", "loadtests", "storage", "--variants", "zeo,relstorage", "--paths",
                  "/Plone,write", "--connections", "1", "--rounds", "1", "--duration", "3", "--warmup", "1",
                  "--base-port", "9750", "--work-dir", work, "--out", str(tmp_path)], timeout=900, check=False)
    print(result.stdout[-4000:], result.stderr[-2000:])
    (folder,) = list(tmp_path.iterdir())
    data = json.loads((folder / "report.json").read_text())
    assert data["meta"]["problems"] == [] and result.returncode == 0
    assert sorted((r["variant"], r["path"]) for r in data["runs"]) == [
        ("relstorage", "/Plone"), ("relstorage", "write"), ("zeo", "/Plone"), ("zeo", "write")]
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in data["runs"]), data["runs"]
    assert {"relstorage/zeo /Plone 1", "relstorage/zeo write 1"} == set(data["ratios"])
    written = {r["variant"]: r["requests"] for r in data["runs"] if r["path"] == "write"}
    for variant in ("zeo", "relstorage"):
        # warm-up writes count too: at least the measured ones are in the folder
        assert data["sizes"][variant]["documents"] >= written[variant]
        assert data["sizes"][variant]["blob_bytes"] >= BLOB_SIZE  # the 5 MiB blob, in a file
    assert data["sizes"]["relstorage"]["data_bytes"] > BLOB_SIZE  # the blob is in PostgreSQL too
    assert (folder / "storage.png").stat().st_size > 0
    assert data["meta"]["leftovers"] == []
    assert not [p.info for p in psutil.process_iter(["cmdline"]) if work in " ".join(p.info["cmdline"] or [])]
    shutil.rmtree(work)  # two builds and databases, ~250 MB; kept above when something failed


# PostgreSQL 15's lines with log_min_duration_statement = 0, as a RelStorage client's request makes them
# (the relstorage variant's log, 28 Nov 2026), and one line that is no statement.
PG_LOG = """\
2026-11-28 20:38:52.256 UTC [27657] LOG:  duration: 0.120 ms  statement: BEGIN ISOLATION LEVEL REPEATABLE READ \
READ ONLY NOT DEFERRABLE
2026-11-28 20:38:52.256 UTC [27657] LOG:  duration: 0.370 ms  statement: EXECUTE \
rs_prep_stmt__poll_inv_query_4_2230914710576010350(291981313742483712)
2026-11-28 20:38:52.256 UTC [27657] LOG:  duration: 0.028 ms  statement: ROLLBACK
2026-11-28 20:38:52.300 UTC [27657] LOG:  duration: 0.051 ms  execute rs_load: SELECT state, tid FROM object_state \
WHERE zoid = $1
2026-11-28 20:38:53.001 UTC [27601] LOG:  checkpoint starting: time
2026-11-28 20:38:53.256 UTC [27657] LOG:  duration: 0.030 ms  statement: ROLLBACK
"""


def test_per_request_statements_counts_simple_and_prepared_statements():
    from loadtests.storage.perrequest import statements
    found = statements(PG_LOG.splitlines())
    assert sum(found.values()) == 5
    assert found["ROLLBACK"] == 2
    assert found["SELECT state, tid FROM object_state WHERE zoid = $1"] == 1
    assert found["EXECUTE rs_prep_stmt__poll_inv_query_4_2230914710576010350(291981313742483712)"] == 1


def test_per_request_metric_total_adds_every_series_and_names_a_missing_one():
    from loadtests.storage.perrequest import metric_total
    text = ('# HELP zodb_loads_total Objects loaded\n# TYPE zodb_loads_total counter\n'
            'zodb_loads_total{database="main"} 12.0\nzodb_loads_total{database="temp"} 3.0\n'
            'zodb_loads_created{database="main"} 1.7e9\nzodb_stores_total{database="main"} 4.0\n')
    assert metric_total(text, "zodb_loads_total") == 15.0
    with pytest.raises(LookupError, match="no zope_http_requests_total"):
        metric_total(text, "zope_http_requests_total")


def test_per_request_summary_medians_ranges_and_markdown():
    from loadtests.storage import perrequest
    rows = [{"round": r, "variant": v, "path": "@json", "requests": 50, "ms": ms, "client_cpu_ms": cpu,
             "database_cpu_ms": 0.5, "loads": 0.0, "statements": st, "top": {"ROLLBACK": st / 3}, "load1": 1.0}
            for r, v, ms, cpu, st in [(1, "relstorage", 20.0, 8.0, 9.0), (2, "relstorage", 30.0, 7.0, 9.02),
                                      (3, "relstorage", 25.0, 9.5, 9.0), (1, "rs-explicit", 18.0, 7.5, 3.0),
                                      (2, "rs-explicit", 19.0, 6.5, 3.0), (3, "rs-explicit", 40.0, 6.0, 3.04)]]
    cells = perrequest.summarize(rows)
    assert [(c["variant"], c["rounds"]) for c in cells] == [("relstorage", 3), ("rs-explicit", 3)]
    assert cells[0]["client_cpu_ms"] == 8.0 and cells[0]["client_cpu_ms_range"] == [7.0, 9.5]
    assert cells[1]["statements"] == 3.0 and cells[1]["ms_range"] == [18.0, 40.0]
    meta = {"started": "2026-11-28 21:00 UTC", "command": "python -m loadtests storage --per-request 50",
            "load_before": [1.0], "load_after": [2.0], "requests": 50, "rounds": 3}
    text = perrequest.to_markdown(meta, cells, rows)
    assert "| @json | rs-explicit | 3.0 (3.0–3.04) | 0.0 (0.0–0.0) | 6.5 (6.0–7.5) |" in text
    assert "- @json relstorage: 3.0 × `ROLLBACK`" in text


def test_per_request_refuses_the_write_path_and_a_negative_count(capsys):
    for argv in (["--per-request", "-1"], ["--per-request", "20", "--paths", "/,write"]):
        with pytest.raises(SystemExit) as stop:
            storagebench.parse_args(argv)
        assert stop.value.code == 2
        assert "--per-request: expected a count >= 0 of requests on read paths only" in capsys.readouterr().err
    assert storagebench.parse_args(["--per-request", "20", "--paths", "@json"]).per_request == 20


@pytest.mark.integration
@pytest.mark.skipif(os.environ.get("PLONEDEPLOY_STORAGEBENCH") != "1",
                    reason="optional (4-5 min): set PLONEDEPLOY_STORAGEBENCH=1")
def test_per_request_counts_on_real_stacks(tmp_path):
    """zeo, rs-implicit and relstorage on ports 9780-9824, 20 requests of @json counted per
    request: ZEO sends PostgreSQL nothing; implicit RelStorage polls three times per request
    (BEGIN, the poll, ROLLBACK each), the kit's RelStorage default (explicit) once; warm
    caches load no object."""
    work = os.path.join(ROOT, "var", "storagebench-perrequest-test")
    result = run([sys.executable, "-m", "loadtests", "storage", "--variants", "zeo,rs-implicit,relstorage",
                  "--paths", "@json", "--per-request", "20", "--rounds", "1", "--base-port", "9780",
                  "--work-dir", work, "--out", str(tmp_path)], timeout=900, check=False)
    print(result.stdout[-4000:], result.stderr[-2000:])
    (folder,) = list(tmp_path.iterdir())
    data = json.loads((folder / "report.json").read_text())
    assert data["meta"]["problems"] == [] and result.returncode == 0
    cells = {c["variant"]: c for c in data["cells"]}
    assert cells["zeo"]["statements"] == 0
    # a health check's statements may fall into a count: not exactly 9 and 3
    assert 9 <= cells["rs-implicit"]["statements"] < 10 and 3 <= cells["relstorage"]["statements"] < 4
    assert all(c["loads"] < 1 for c in cells.values())
    assert data["meta"]["leftovers"] == []
    shutil.rmtree(work)
