"""loadtests.headline.headline: the plan, the summary and the report without measuring; the HAProxy
variants' configs checked by haproxy -c and one variant run over a stand-in server; then one
short real run against the session's stack (wrk, the off clients built and stopped)."""
import json
import os
import shutil
import sys
from urllib.parse import urlsplit

import psutil
import pytest
import requests

from conftest import ROOT, run
from http_stub import answering_server
from loadtests.core.balancers import BalancerError
from loadtests.core.procs import CpuUse
from loadtests.core.stack import PATHS, load_stack, stack_pids
from loadtests.headline import headline, variants
from stack_like import stack_like

requires_haproxy = pytest.mark.skipif(not shutil.which("haproxy"), reason="no haproxy binary")


def test_plan_covers_every_cell_once_per_round_and_rotates():
    todo = headline.plan(3, with_off=True)
    cells = {(t, p) for _, t, p in todo}
    assert cells == {(t, p) for t in headline.TARGETS + headline.OFF for p in PATHS}
    assert len(todo) == 3 * len(cells)
    firsts = [next((t, p) for n, t, p in todo if n == number) for number in (1, 2, 3)]
    assert len(set(firsts)) == 3  # a different cell opens each round
    assert {p for _, t, p in headline.plan(1, with_off=False) if t.endswith("-off")} == set()
    assert {(t, p) for _, t, p in headline.plan(2, with_off=False, variant_names=("copy",))} - {
        (t, p) for _, t, p in headline.plan(2, with_off=False)} == {(headline.COPY, "blob")}


def test_plan_measures_each_variant_on_the_blob_in_every_round():
    todo = headline.plan(2, with_off=False, variant_names=tuple(variants.VARIANTS))
    extra = [(n, t, p) for n, t, p in todo if t not in headline.TARGETS]
    assert sorted(extra) == sorted((n, f"haproxy-{v}", "blob") for n in (1, 2) for v in variants.VARIANTS)
    assert variants.targets()[0] == headline.COPY == "haproxy-copy"


@pytest.mark.parametrize("argv, chosen", [
    ([], ("copy",)),
    (["--no-copy"], ()),
    (["--variant", "nbthread-1", "--variant", "pipesize-1m"], ("copy", "same", "pipesize-1m", "nbthread-1")),
    (["--variant", "copy", "--variant", "bufs-4m", "--variant", "bufs-4m"], ("copy", "same", "bufs-4m")),
    (["--variant", "copy"], ("copy",)),  # no baseline needed: copy is compared with the stack's
    (["--variant", "same", "--no-copy"], ("same",)),
    (["--variant", "pyruvate-alone", "--no-copy"], ("pyruvate-alone",)),  # compared with pyruvate directly
    (["--variant", "all"], tuple(variants.VARIANTS)),
    (["--variant", "all", "--no-copy"], tuple(variants.VARIANTS)[1:]),
])
def test_variants_chosen_in_the_table_order(argv, chosen):
    assert headline.parse_args(argv).variants == chosen


@pytest.mark.parametrize("argv, message", [
    (["--variant", "pipesize-2m"], "--variant 'pipesize-2m' is unknown: expected one of copy, same, pipesize-512k, "
                                   "pipesize-1m, bufs-1m, bufs-4m, nbthread-1, nbthread-1-copy, pyruvate-alone, "
                                   "pyruvate-alone-nbthread-1, pyruvate-alone-cpu1, maxconn-4, "
                                   "pyruvate-alone-maxconn-4, nbthread-1-maxconn-4, or all"),
    (["--variant", "copy", "--no-copy"], "--variant copy and --no-copy contradict each other"),
])
def test_bad_variant_is_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        headline.parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_paths_choose_what_runs(monkeypatch, capsys):
    """--paths: only the labels named, in table order; logged-in among them is --logged-in;
    without the blob no HAProxy variant (they differ from the stack's on the blob only)."""
    monkeypatch.setenv("PLONEDEPLOY_EDITOR_PASSWORD", "secret")
    args = headline.parse_args(["--paths", "logged-in"])
    assert (args.paths, args.logged_in, args.variants) == (["logged-in"], True, [])
    todo = headline.plan(2, True, args.variants, paths=args.paths)
    assert {p for _, _, p in todo} == {"logged-in"} and len(todo) == 2 * len(headline.TARGETS + headline.OFF)
    args = headline.parse_args(["--paths", "blob,/", "--logged-in"])
    assert (args.paths, args.variants) == (["/", "blob", "logged-in"], ("copy",))
    assert headline.parse_args([]).paths == list(PATHS)
    for argv, message in [(["--paths", "/x"], "--paths: /x not allowed; allowed: /, /Plone, @json, blob, logged-in"),
                          (["--paths", "/", "--variant", "bufs-1m"], "--variant: the HAProxy variants run on the "
                                                                     "blob only, and --paths / leaves it out"),
                          (["--paths", "/Plone", "--cache"], "--cache: the cache tier is measured on the blob only, "
                                                             "and --paths /Plone leaves it out")]:
        with pytest.raises(SystemExit) as exit_:
            headline.parse_args(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_cache_tier_on_the_blob_against_the_best_client_directly():
    """--cache adds varnish and the HTTPS frontend on the blob in every round, each compared
    with the faster client directly in its round, and named in the report's legend."""
    todo = headline.plan(2, False, (), paths=["/", "blob"], with_cache=True)
    assert sorted((n, t) for n, t, p in todo if t in headline.CACHE_TARGETS) == [
        (n, t) for n in (1, 2) for t in sorted(headline.CACHE_TARGETS)]
    assert {p for _, t, p in todo if t in headline.CACHE_TARGETS} == {"blob"}
    assert not any(t in headline.CACHE_TARGETS for _, t, _ in headline.plan(1, False, (), paths=["/"], with_cache=True))
    runs = [_row(1, "pyruvate", "blob", 200), _row(1, "waitress", "blob", 100), _row(1, "varnish", "blob", 500),
            _row(1, "haproxy-tls", "blob", 150), _row(2, "pyruvate", "blob", 100), _row(2, "waitress", "blob", 120),
            _row(2, "varnish", "blob", 360), _row(2, "haproxy-tls", "blob", 240)]
    cells, ratios = headline.summarize(runs)
    assert ratios["varnish/best direct blob"] == {"median": 2.75, "min": 2.5, "max": 3.0}
    assert ratios["haproxy-tls/best direct blob"] == {"median": 1.38, "min": 0.75, "max": 2.0}
    assert "haproxy/best direct blob" not in ratios  # the pool not measured
    text = headline.to_markdown({"started": "s", "command": "c", "rounds": 2, "duration_s": 8, "connections": 4,
                                 "cores": 2, "load_before": [0.1], "load_after": [0.2], "minutes": 1.0,
                                 "clients": {"pyruvate": "instance", "waitress": "client2"}}, cells, ratios)
    assert "| path | pyruvate | waitress | varnish | haproxy-tls |" in text
    assert "varnish = the stack's varnish directly (plain HTTP), haproxy-tls = the stack's HTTPS frontend" in text
    _, ratios = headline.summarize(runs + [_row(1, "haproxy-maxconn-4", "blob", 300),
                                           _row(2, "haproxy-nbthread-1-maxconn-4", "blob", 60)])
    assert ratios["haproxy-maxconn-4/best direct blob"] == {"median": 1.5, "min": 1.5, "max": 1.5}
    assert ratios["haproxy-nbthread-1-maxconn-4/best direct blob"] == {"median": 0.5, "min": 0.5, "max": 0.5}


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
    assert not any(name.startswith("haproxy-") for name in ratios)  # no other variant measured
    text = headline.to_markdown({"started": "s", "command": "c", "rounds": 3, "duration_s": 8, "connections": 4,
                                 "cores": 2, "load_before": [0.1], "load_after": [0.2], "minutes": 1.0,
                                 "clients": {"pyruvate": "instance", "waitress": "client2"},
                                 "spliced_mib": {"haproxy": 1234.5, "haproxy-copy": 0.0}}, cells, ratios)
    assert "| path | pyruvate | waitress | haproxy | pyruvate-off | haproxy-copy |" in text  # targets measured only
    assert "during the runs: haproxy 1,234.5, haproxy-copy 0.0." in text
    assert "| / | 250 (200–300) | 150 (100–200) | - |" in text
    assert "| pyruvate/waitress / | 2.00 (1.00–2.50) |" in text


def test_variant_ratios_against_the_unchanged_config_in_the_same_round():
    """Each variant over ``same`` (the unchanged config, also temporary) of its round, same
    over the stack's HAProxy, copy the other way round (the figure the docs quote), and the
    report's columns and legend name the variants measured."""
    runs = [_row(1, "haproxy", "blob", 240), _row(2, "haproxy", "blob", 100),
            _row(1, "haproxy-same", "blob", 120), _row(2, "haproxy-same", "blob", 100),
            _row(1, "haproxy-copy", "blob", 200), _row(2, "haproxy-copy", "blob", 80),
            _row(1, "haproxy-nbthread-1", "blob", 60), _row(2, "haproxy-nbthread-1", "blob", 110),
            _row(1, "haproxy-bufs-4m", "blob", 90),
            _row(1, "pyruvate", "blob", 300), _row(2, "pyruvate", "blob", 200),
            _row(1, "haproxy-pyruvate-alone", "blob", 270), _row(2, "haproxy-pyruvate-alone", "blob", 200)]
    cells, ratios = headline.summarize(runs)
    assert ratios["haproxy blob splice/copy"] == {"median": 1.23, "min": 1.2, "max": 1.25}
    assert ratios["haproxy-same/haproxy blob"] == {"median": 0.75, "min": 0.5, "max": 1.0}
    assert ratios["haproxy-nbthread-1/haproxy-same blob"] == {"median": 0.8, "min": 0.5, "max": 1.1}
    assert ratios["haproxy-bufs-4m/haproxy-same blob"] == {"median": 0.75, "min": 0.75, "max": 0.75}  # round 1
    assert "haproxy-pipesize-1m/haproxy-same blob" not in ratios  # not measured
    # the balancer over pyruvate alone against pyruvate directly, per round (0.9, 1.0)
    assert ratios["haproxy-pyruvate-alone/pyruvate blob"] == {"median": 0.95, "min": 0.9, "max": 1.0}
    assert [variants.ratio(name)[0] for name in ("copy", "same", "nbthread-1-copy")] == [
        "haproxy blob splice/copy", "haproxy-same/haproxy blob", "haproxy-nbthread-1-copy/haproxy-same blob"]
    text = headline.to_markdown({"started": "s", "command": "c", "rounds": 2, "duration_s": 8, "connections": 4,
                                 "cores": 2, "load_before": [0.1], "load_after": [0.2], "minutes": 1.0,
                                 "clients": {"pyruvate": "instance", "waitress": "client2"}}, cells, ratios)
    assert ("| path | pyruvate | haproxy | haproxy-copy | haproxy-same | haproxy-bufs-4m | haproxy-nbthread-1 "
            "| haproxy-pyruvate-alone |") in text  # order
    assert ("haproxy-copy = the stack's HAProxy config with `haproxy -dS` (no kernel splicing); haproxy-same = "
            "the stack's HAProxy config unchanged; haproxy-bufs-4m = "
            "the stack's HAProxy config with `global tune.rcvbuf.server 4194304, tune.sndbuf.client 4194304`; "
            "haproxy-nbthread-1 = the stack's HAProxy config with `global nbthread 1`; haproxy-pyruvate-alone = "
            "the stack's HAProxy config with `only its pyruvate client as server`.") in text
    assert "| haproxy-nbthread-1/haproxy-same blob | 0.80 (0.50–1.10) |" in text


def test_cpu_per_request_of_each_run_and_its_table():
    """cpu_figures: each process' CPU ms per request, wrk's, the other processes', the rest of
    the machine's busy time and all of it, the busy cores; a Locust run has no wrk figure;
    the summary's medians per cell and the report's table of them."""
    used = CpuUse({"requests": 100}, {"haproxy": 0.2, "instance": 0.5}, 0.1, 0.05, 1.25, 2.0)
    assert headline.cpu_figures(100, used, wrk_cpu=0.3) == {
        "cpu_ms": {"haproxy": 2.0, "instance": 5.0, "wrk": 3.0, "kernel": 0.5, "others": 1.0, "rest": 1.0,
                   "machine": 12.5}, "busy_cores": 0.62}
    locust = headline.cpu_figures(0, CpuUse({}, {"haproxy": 0.1}, 0.5, 0.0, 0.4, 1.0))
    assert locust == {"cpu_ms": {"haproxy": None, "kernel": None, "others": None, "rest": None, "machine": None},
                      "busy_cores": 0.4}
    runs = [dict(_row(n, "haproxy", "blob", 100), **headline.cpu_figures(
        100, CpuUse({}, {"haproxy": 0.1 * n, "instance": 0.5}, 0.0, 0.1, 1.6, 1.0), wrk_cpu=0.2)) for n in (1, 2, 3)]
    cells, ratios = headline.summarize(runs + [_row(1, "pyruvate", "blob", 150)])
    assert cells["haproxy blob"]["cpu_ms"] == {"haproxy": 2.0, "instance": 5.0, "wrk": 2.0, "kernel": 1.0,
                                               "others": 0.0, "rest": 6.0, "machine": 16.0}
    assert cells["haproxy blob"]["busy_cores"] == 1.6 and "cpu_ms" not in cells["pyruvate blob"]
    text = headline.to_markdown({"started": "s", "command": "c", "rounds": 3, "duration_s": 8, "connections": 4,
                                 "cores": 2, "load_before": [0.1], "load_after": [0.2], "minutes": 1.0,
                                 "clients": {"pyruvate": "instance", "waitress": "client2"}}, cells, ratios)
    assert ("| target path | haproxy | instance | wrk | kernel | others | rest | machine | busy cores |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
            "| haproxy blob | 2.00 | 5.00 | 2.00 | 1.00 | 0.00 | 6.00 | 16.00 | 1.6 |") in text


@requires_haproxy
@pytest.mark.parametrize("name", list(variants.VARIANTS))
def test_every_variant_config_passes_haproxy_check(name, tmp_path):
    """haproxy -c accepts the template's config with the variant's extra.cfg as a second -f
    (its global lines merged into the template's global section)."""
    balancer = variants.balancer(name, stack_like(tmp_path, [1]), str(tmp_path))
    with balancer:
        balancer.write_config()  # haproxy -c, else BalancerError
        extra, lines = tmp_path / f"haproxy-{name}" / "extra.cfg", variants.VARIANTS[name].globals
        if lines:
            assert extra.read_text() == "global\n" + "".join(f"    {line}\n" for line in lines)
            assert balancer.config_files()[-2:] == ["-f", str(extra)]
        else:
            assert not extra.exists() and balancer.config_files() == ["-f", balancer.config_path]
        assert balancer.haproxy_options == variants.VARIANTS[name].options


@requires_haproxy
def test_refused_variant_names_itself(tmp_path, monkeypatch):
    monkeypatch.setitem(variants.VARIANTS, "bogus", variants.Variant((), ("tune.bogus 1",)))
    with pytest.raises(BalancerError, match=r"(?s)HAProxy variant bogus \(global tune.bogus 1\): haproxy -c rejected "
                       r".*haproxy-bogus/haproxy.cfg \+ .*haproxy-bogus/extra.cfg:.*unknown keyword 'tune.bogus'"):
        variants.start("bogus", stack_like(tmp_path, [1]), str(tmp_path))
    balancer = variants.balancer("bogus", stack_like(tmp_path, [1]), str(tmp_path))
    with pytest.raises(BalancerError, match="unknown keyword 'tune.bogus'"):
        balancer.start("zeoclients", ["instance"])
    assert balancer.run_directory and not os.path.exists(balancer.run_directory)  # not left in /tmp


def _ok(_request):
    """200 to every GET: the pool's one client and its health check."""
    return 200, {}, b"OK"


@requires_haproxy
def test_variant_global_lines_take_effect(tmp_path):
    """nbthread-1 started as headline starts it (haproxy -db -f haproxy.cfg -f extra.cfg) runs
    one thread, where the template alone lets HAProxy run one per core: the second file's
    global section is in effect. Stopped at the end."""
    with answering_server(_ok) as client:
        balancer = variants.start("nbthread-1", stack_like(tmp_path, [urlsplit(client).port]), str(tmp_path))
        with balancer:
            metrics = requests.get(balancer.metrics_url, timeout=5).text
            assert "\nhaproxy_process_nbthread 1\n" in metrics
            assert balancer.process.cmdline()[-4:] == ["-f", balancer.config_path, "-f", balancer.extra_path]
        assert balancer.child.poll() is not None  # stopped


def test_a_variant_with_one_server_alone_renders_only_that_client(tmp_path):
    """pyruvate-alone's HAProxy has the pool's pyruvate client as its only server (waitress
    left out), waits for that one alone, and a pool without pyruvate is refused by name."""
    config = stack_like(tmp_path, [1])
    waitress = dict(config["haproxy_context"]["servers"][0], name="client2", port=2, wsgi_server="waitress")
    config["haproxy_context"]["servers"].append(waitress)
    config["servers"].append("client2")
    assert [s["name"] for s in variants.servers("pyruvate-alone", config)] == ["instance"]
    assert [s["name"] for s in variants.servers("same", config)] == ["instance", "client2"]
    text = variants.balancer("pyruvate-alone", config, str(tmp_path)).config_text()
    assert "server instance 127.0.0.1:1" in text and "server client2" not in text
    assert variants.legend("pyruvate-alone") == (
        "haproxy-pyruvate-alone = the stack's HAProxy config with `only its pyruvate client as server`")
    # maxconn-4: every server of the pool (or the one alone) takes 4 requests, the pool's entries unchanged
    assert [(s["name"], s["maxconn"]) for s in variants.servers("maxconn-4", config)] == [
        ("instance", 4), ("client2", 4)]
    assert [(s["name"], s["maxconn"]) for s in variants.servers("pyruvate-alone-maxconn-4", config)] == [
        ("instance", 4)]
    assert [s["maxconn"] for s in config["haproxy_context"]["servers"]] != [4, 4]
    text = variants.balancer("maxconn-4", config, str(tmp_path)).config_text()
    assert "server instance 127.0.0.1:1 maxconn 4 " in text and "server client2 127.0.0.1:2 maxconn 4 " in text
    assert variants.describe("pyruvate-alone-maxconn-4") == "only its pyruvate client as server + server maxconn 4"
    config["haproxy_context"]["servers"] = [waitress]
    with pytest.raises(BalancerError, match="pyruvate-alone: the stack's pool has no pyruvate client"):
        variants.servers("pyruvate-alone", config)


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
    with and without kernel splicing and through one more variant (nbthread-1, which splices)
    (the stack's HAProxy spliced blob bodies, its -dS copy none), the report written, the off
    clients and the variants stopped; the stack's two compared clients were restarted first
    (new PIDs), so that both sides started alike."""
    config = load_stack()
    _, clients = headline.targets(config)
    before = {name: proc.pid for name, proc in stack_pids(config).items() if name in clients.values()}
    result = run([sys.executable, "-m", "loadtests", "headline", "--duration", "1", "--rounds", "1",
                  "--connections", "2", "--variant", "nbthread-1", "--cache", "--out", str(tmp_path)], timeout=600)
    print(result.stdout[-3000:])
    (folder,) = list(tmp_path.iterdir())
    data = json.loads((folder / "report.json").read_text())
    assert len(data["runs"]) == 5 * len(PATHS) + 5  # + copy, same, nbthread-1, varnish, haproxy-tls on the blob
    assert sorted(data["meta"]["restarted_clients"]) == sorted(before) == sorted(clients.values())
    after = stack_pids(config)
    assert all(name in after and after[name].pid != pid for name, pid in before.items()), (before, after)
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in data["runs"]), data["runs"]
    assert not any(r.get("short_bytes") for r in data["runs"])
    # CPU per request of every run: the HAProxy that served it and the client behind it burned
    # some, and the machine at least what the named processes did, but for the counters' ticks
    # (10 ms a process: one each, spread over the run's requests).
    for r in data["runs"]:
        cpu = r["cpu_ms"]
        assert {"haproxy", "haproxy-nbthread-1", "varnish", *clients.values(), "zeoserver", "wrk",
                "machine"} <= set(cpu), r
        named = [v for n, v in cpu.items() if n not in ("machine", "rest")]
        assert cpu["machine"] >= sum(named) - 10.0 * len(named) / r["requests"], r
        if r["target"] in ("haproxy", "haproxy-nbthread-1", "varnish"):
            assert cpu[r["target"]] > 0, r
        if r["target"] == "haproxy-tls":  # TLS in HAProxy, the body from varnish's cache
            assert cpu["haproxy"] > 0 and cpu["varnish"] > 0, r
        if r["target"] in headline.SERVERS:
            assert cpu[clients[r["target"]]] > 0, r
    assert "CPU milliseconds per request" in (folder / "report.md").read_text()
    assert {f"{s} kit/stock {p}" for s in headline.SERVERS for p in PATHS} | {
            "pyruvate/waitress /", "haproxy blob splice/copy", "haproxy-same/haproxy blob",
            "haproxy-nbthread-1/haproxy-same blob", "varnish/best direct blob", "haproxy-tls/best direct blob",
            "haproxy/best direct blob"} <= set(data["ratios"])
    # The bodies of the blob runs through the stack's HAProxy (5 MiB each; the first kilobytes
    # of each, read with the headers, are copied: 90 %) went through kernel pipes, besides
    # the warm-up's; none through the copy's.
    haproxy_blob_mib = sum(r["requests"] for r in data["runs"] if r["target"] == "haproxy" and r["path"] == "blob") * 5
    assert data["meta"]["spliced_mib"]["haproxy"] >= 0.9 * haproxy_blob_mib > 0, data["meta"]["spliced_mib"]
    assert data["meta"]["spliced_mib"]["haproxy-copy"] == 0
    assert data["meta"]["spliced_mib"]["haproxy-nbthread-1"] > 0
    assert (folder / "headline.png").stat().st_size > 0
    assert "Requests/s, median over the rounds" in (folder / "report.md").read_text()
    work = os.path.join(ROOT, "var", "headline")
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if any(work in a for a in p.info["cmdline"] or [])]
    # the variants' configs are under var/headline too: no process left means they were stopped
    assert left == []
