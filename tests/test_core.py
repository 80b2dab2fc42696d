"""loadtests.core without a stack: wrk's summary (a fake wrk on PATH), percentiles, the
stack's facts, CPU and RSS accounting."""
import json
import os
import socket
import stat
import subprocess
import sys
import time

import psutil
import pytest

from loadtests.core import (cli as core_cli, haproxy_stats, procs as core_procs, reports as core_reports,
                            stack as core_stack, stats as core_stats, wrk as core_wrk)
from http_stub import answering_server

SUMMARY = {"requests": 120, "duration_us": 2_000_000, "bytes": 4096,
           "errors": {"connect": 0, "read": 1, "write": 0, "status": 2, "timeout": 0},
           "latency_us": {"mean": 1500, "stdev": 300, "max": 9000, "p50": 1200, "p90": 2500,
                          "p95": 3000, "p99": 8000, "p99.9": 9000}}


def _fake_wrk(tmp_path, monkeypatch, body):
    """A ``wrk`` first on PATH that runs ``body`` (sh); it writes its argv and the Accept
    it was given to ``wrk.args``."""
    script = tmp_path / "bin" / "wrk"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$* accept=$PLONEDEPLOY_ACCEPT" > {tmp_path}/wrk.args\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "wrk.args"


def test_run_wrk_returns_the_summary_line(tmp_path, monkeypatch):
    args = _fake_wrk(tmp_path, monkeypatch,
                     f"echo 'Running 2s test'\necho 'PLONEDEPLOY_WRK {json.dumps(SUMMARY)}'\necho done")
    summary = core_wrk.run_wrk("http://127.0.0.1:1/x", 4, 2, threads=8, timeout=7, accept="application/json")
    assert {k: summary[k] for k in SUMMARY} == SUMMARY
    assert summary["wall_s"] >= 0 and summary["cpu_s"] >= 0
    given = args.read_text().split()
    # threads never above connections (wrk refuses that); the Lua script gives the summary
    assert given[:4] == ["-t4", "-c4", "-d2s", "--timeout=7s"]
    assert given[4:6] == ["-s", core_wrk.WRK_SCRIPT] and given[6] == "http://127.0.0.1:1/x"
    assert given[7] == "accept=application/json"


@pytest.mark.parametrize("body", ["echo 'no summary here'", f"echo 'PLONEDEPLOY_WRK {json.dumps(SUMMARY)}'; exit 1"])
def test_run_wrk_raises_with_the_output(tmp_path, monkeypatch, body):
    _fake_wrk(tmp_path, monkeypatch, body)
    with pytest.raises(RuntimeError, match="exited"):
        core_wrk.run_wrk("http://127.0.0.1:1/", 1, 1)


def test_run_wrk_reports_progress(tmp_path, monkeypatch):
    _fake_wrk(tmp_path, monkeypatch, f"sleep 6; echo 'PLONEDEPLOY_WRK {json.dumps(SUMMARY)}'")
    seen = []
    core_wrk.run_wrk("http://127.0.0.1:1/", 1, 1, progress=seen.append)
    assert len(seen) == 1 and 4.5 < seen[0] < 6.5


def test_percentile_is_nearest_rank():
    values = list(range(100, 0, -1))  # 1..100, unsorted
    assert core_stats.percentile(values, 0.99) == 99
    assert core_stats.percentile(values, 0.50) == 50
    assert core_stats.percentile(values, 1.0) == 100
    assert core_stats.percentile([7.0], 0.99) == 7.0
    assert core_stats.percentile([1, 2, 3], 0.01) == 1
    assert core_stats.percentile([], 0.5) is None
    assert type(core_stats.percentile([1, 2], 0.5)) is int  # JSON-serialisable, not numpy.int64


def test_histogram_percentile_is_locusts_rule():
    # Locust: the bucket holding request int(total * fraction) + 1 from the fastest.
    assert core_stats.histogram_percentile({"10": 1, "20": 1}, 0.5) == 20
    assert core_stats.histogram_percentile({10: 98, 20: 1, 300: 1}, 0.99) == 300
    assert core_stats.histogram_percentile({10: 98, 20: 1, 300: 1}, 0.98) == 20
    assert core_stats.histogram_percentile({10: 98, 20: 1, 300: 1}, 0.50) == 10
    assert core_stats.histogram_percentile({5: 0, 10: 3}, 1.0) == 10
    assert core_stats.histogram_percentile({}, 0.5) is None
    assert core_stats.histogram_percentile({"7": 0}, 0.5) is None


def test_load_stack_reads_the_contract_or_says_what_to_run(tmp_path):
    path = tmp_path / "stack.json"
    with pytest.raises(core_stack.NotReady, match="not found: run bin/buildout"):
        core_stack.load_stack(str(path))
    path.write_text("{not json")
    with pytest.raises(core_stack.NotReady, match="unreadable"):
        core_stack.load_stack(str(path))
    path.write_text('{"backend": "plone"}')
    assert core_stack.load_stack(str(path)) == {"backend": "plone"}


def test_check_servers_up(monkeypatch):
    config = {"stats_url": "http://127.0.0.1:1/stats;csv", "backend": "plone"}
    rows = [{"pxname": "plone", "svname": "instance", "status": "UP"},
            {"pxname": "plone", "svname": "client2", "status": "DOWN"},
            {"pxname": "plone", "svname": "BACKEND", "status": "UP"}]
    monkeypatch.setattr(haproxy_stats, "fetch", lambda url: rows)
    with pytest.raises(core_stack.NotReady, match="not every server is UP"):
        core_stack.check_servers_up(config)
    rows[1]["status"] = "UP"
    assert core_stack.check_servers_up(config) is rows

    def refused(url):
        raise OSError("refused")
    monkeypatch.setattr(haproxy_stats, "fetch", refused)
    with pytest.raises(core_stack.NotReady, match="not answering"):
        core_stack.check_servers_up(config)


def _supervised(monkeypatch, pids):
    """What the stack's supervisord would say runs: ``{name: PID}`` (plonedeploy.stack)."""
    from plonedeploy.stack import supervisor as runtime

    monkeypatch.setattr(runtime, "running_pids", lambda config: dict(pids))


def test_stack_pids_and_cpu_seconds(tmp_path, monkeypatch):
    config = {"run_dir": str(tmp_path), "processes": [{"name": "me"}, {"name": "gone"}, {"name": "never"}]}
    assert core_stack.stack_pids(config) == {}  # no supervisord in tmp_path: nothing runs
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait(60)
    _supervised(monkeypatch, {"me": os.getpid(), "gone": gone.pid})
    procs = core_stack.stack_pids(config)
    assert list(procs) == ["me"] and procs["me"].pid == os.getpid()
    assert core_procs.cpu_seconds(procs)["me"] > 0
    assert core_procs.tree_cpu_seconds(os.getpid()) >= core_procs.cpu_seconds(procs)["me"] - 0.05
    assert core_procs.machine_busy_seconds() > 0 and core_procs.own_cpu_seconds() > 0


#: A process that burns the CPU seconds given as its argument when it reads a line, says
#: "done" and waits for the end of its stdin; with "exit" as second argument it ends instead.
BURNER = """
import sys, time
sys.stdin.readline()
start = time.process_time()
while time.process_time() - start < float(sys.argv[1]):
    pass
print("done", flush=True)
if sys.argv[2:] != ["exit"]:
    sys.stdin.read()
"""


def test_cpu_during_counts_what_each_process_burned():
    """cpu_during around real processes that burn known CPU: each named process' seconds,
    the burner outside them in others, the machine's busy time at least all of it, one
    process ended before the end left out; cpu_ms_per_request divides by the requests."""
    seconds = {"burner": 0.6, "idler": 0.0, "outsider": 0.4, "gone": 0.0}
    children = {name: subprocess.Popen([sys.executable, "-c", BURNER, str(s)] + (["exit"] if name == "gone" else []),
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for name, s in seconds.items()}
    try:
        time.sleep(0.5)  # the interpreters' start-up is not counted
        named = {name: psutil.Process(children[name].pid) for name in ("burner", "idler", "gone")}

        def go():
            for child in children.values():
                child.stdin.write("go\n")
                child.stdin.flush()
            assert all(child.stdout.readline() == "done\n" for child in children.values())
            children["gone"].wait(30)
            return "answer"

        used = core_procs.cpu_during(named, go)
    finally:
        for child in children.values():
            child.stdin.close()
            child.wait(30)
    assert used.result == "answer" and set(used.cpu) == {"burner", "idler"}
    assert 0.55 <= used.cpu["burner"] <= 0.8 and used.cpu["idler"] < 0.05
    assert 0.35 <= used.others  # the outsider's, with whatever else the machine ran
    assert 0 <= used.kernel < used.busy
    assert used.busy >= used.cpu["burner"] + 0.35 and used.wall >= 0.55
    per_request = core_procs.cpu_ms_per_request(used.cpu, 6)
    assert 92 <= per_request["burner"] <= 134 and per_request["idler"] < 9
    assert core_procs.cpu_ms_per_request({"burner": 0.6}, 0) == {"burner": None}


def test_free_local_port_is_below_the_ephemeral_range_and_bindable(monkeypatch):
    """free_local_port draws from LOCAL_PORTS, below Linux's ephemeral ports (outgoing
    connections' source ports cannot take it), returns a port one can bind, and says so when
    every port it tries is taken."""
    low, _high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    assert core_procs.LOCAL_PORTS.stop <= low
    port = core_procs.free_local_port()
    assert port in core_procs.LOCAL_PORTS
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        monkeypatch.setattr(core_procs, "LOCAL_PORTS", range(port, port + 1))
        with pytest.raises(OSError, match=f"no free port in {port}-{port} after 3 attempts"):
            core_procs.free_local_port(attempts=3)


def test_a_locust_run_gives_its_row_or_says_why_not(tmp_path):
    """locustrun's one check of a finished Locust run (run_locust_shape's and
    BackgroundLocust's): the row of its statistics after status 0 or 1; a RuntimeError with
    the tail of its output after another status or without statistics."""
    from loadtests.core import locustrun

    output, out = tmp_path / "locust.out", tmp_path / "per_server.json"
    output.write_bytes(b"x" * 3000 + b"Traceback: the end")
    with pytest.raises(RuntimeError, match=r"^Locust against http://h exited with status 1: x+Traceback: the end$"):
        locustrun._row_after("http://h", 1, str(out), str(output))  # no statistics
    out.write_text(json.dumps({"elapsed_s": 2.0, "server_totals": {"instance": {
        "num_requests": 10, "num_failures": 1, "total_bytes": 2**21, "response_times": {"12": 10}}}}))
    with pytest.raises(RuntimeError, match="exited with status 2") as err:
        locustrun._row_after("http://h", 2, str(out), str(output))
    assert len(str(err.value)) == len("Locust against http://h exited with status 2: ") + 2000
    row = locustrun._row_after("http://h", 1, str(out), str(output))
    assert (row["requests"], row["rps"], row["mib_s"], row["errors"], row["p50_ms"]) == (10, 5.0, 1.0, 1, 12)


def test_a_site_without_the_editors_is_refused_with_the_command_that_makes_them(monkeypatch):
    """editors_refused, the headline's and the matrix's check before they build: a site whose
    login form is not there is refused with the reason and PLONEDEPLOY_EDITORS=on make site."""
    from loadtests.core import locustrun

    monkeypatch.setenv("PLONEDEPLOY_EDITOR_PASSWORD", "any")
    with answering_server(lambda request: (404, {}, b"not here")) as url:
        assert locustrun.editors_refused(url) == (
            f"the editors cannot log in at {url} ({url}/Plone/login answered 404); the site needs them: "
            "PLONEDEPLOY_EDITORS=on make site")


def _stack_config(tmp_path, storage):
    """A stack.json dict as bin/buildout writes it for ``storage`` (buildout.cfg, relstorage.cfg)."""
    first = ({"name": "zeoserver", "ready": {"tcp": ["127.0.0.1", 8100]}} if storage == "zeo" else
             {"name": "postgresql", "ready": {"tcp": ["127.0.0.1", 8432], "command": ["pg_isready"]}})
    return {"run_dir": str(tmp_path), "storage": storage, "zeoserver": "zeoserver" if storage == "zeo" else None,
            "zeo_address": "127.0.0.1:8100" if storage == "zeo" else None,
            "blob_storage": str(tmp_path / "blobstorage") if storage == "zeo" else None,
            "processes": [first, {"name": "instance", "ready": {"http": "http://127.0.0.1:8081/"}}],
            "server_kinds": {"instance": "pyruvate"}, "stats_url": "http://127.0.0.1:1/stats;csv",
            "haproxy_binary": "haproxy"}


def test_running_zeo_server_or_what_is_missing(tmp_path, monkeypatch):
    """The ZEO server's host:port when it runs; NotReady naming RelStorage on a RelStorage
    build (its PostgreSQL listens on TCP too, but is no ZEO server), naming the process when
    it does not run or stack.json has none."""
    config = _stack_config(tmp_path, "zeo")
    with pytest.raises(core_stack.NotReady, match="the stack's zeoserver is not running: make start"):
        core_stack.running_zeo_server(config)
    _supervised(monkeypatch, {"zeoserver": os.getpid()})
    assert core_stack.running_zeo_server(config) == "127.0.0.1:8100"
    del config["storage"], config["zeoserver"]  # stack.json of a build before these keys
    assert core_stack.running_zeo_server(config) == "127.0.0.1:8100"
    config = _stack_config(tmp_path, "relstorage")
    _supervised(monkeypatch, {"postgresql": os.getpid()})
    with pytest.raises(core_stack.NotReady, match=r"built for RelStorage on PostgreSQL \(relstorage.cfg\).*"
                                                  r"make build STORAGE=zeo"):
        core_stack.running_zeo_server(config)
    config["storage"] = "zeo"
    with pytest.raises(core_stack.NotReady, match="stack.json names no ZEO server and blob directory"):
        core_stack.running_zeo_server(config)


@pytest.mark.parametrize("preset", [None, "servers-wrk", "scaling", "blob"])
def test_tools_that_build_zeo_clients_refuse_a_relstorage_stack(tmp_path, monkeypatch, capsys, preset):
    """The matrix and its presets (servers-wrk, scaling, blob) exit 2 at once on a
    RelStorage build, with the message naming the storage, before they build or start
    anything (measure_all, which builds the ZEO clients, fails the test if called)."""
    from loadtests.matrix import matrix

    monkeypatch.setattr(matrix, "load_stack", lambda *args: _stack_config(tmp_path, "relstorage"))
    monkeypatch.setattr(matrix, "require_wrk", lambda: "wrk")

    def built(*args, **kwargs):
        raise AssertionError("built ZEO clients on a RelStorage stack")

    monkeypatch.setattr(matrix, "measure_all", built)
    argv = ["--runs", "1", "--out", str(tmp_path / "out"), "--build", str(tmp_path / "build")]
    assert matrix.main(argv, preset=preset) == 2
    err = capsys.readouterr().err
    assert err.startswith("matrix: the stack is built for RelStorage on PostgreSQL"), err
    assert not (tmp_path / "build").exists() and not (tmp_path / "out").exists()


def test_rss_sampler_and_idle_tree():
    sampler = core_procs.RssSampler(os.getpid(), interval=0.05)
    sampler.start()
    sampler.stop()
    assert sampler.peak >= psutil.Process().memory_info().rss // 2
    # a list of roots sums their trees (a balanced matrix cell: its clients and HAProxy)
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"
    busy = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]
    try:
        # Until each child has spun its 0.3 s of CPU by the kernel's count (psutil), not a fixed
        # wait: on a busy machine 1.5 s of wall time gave a child less than 0.25 s of CPU.
        def spun(proc):
            times = psutil.Process(proc.pid).cpu_times()
            return times.user + times.system >= 0.29
        deadline = time.monotonic() + 60
        while not all(spun(p) for p in busy) and time.monotonic() < deadline:
            time.sleep(0.1)
        each = [core_procs.tree_cpu_seconds(p.pid) for p in busy]
        assert min(each) >= 0.25, each
        assert core_procs.tree_cpu_seconds([p.pid for p in busy]) == pytest.approx(sum(each), abs=0.05)
        pair = core_procs.RssSampler([p.pid for p in busy], interval=0.05)
        pair.sample()
        assert pair.peak >= 1.5 * max(psutil.Process(p.pid).memory_info().rss for p in busy)
    finally:
        for p in busy:
            p.kill()
            p.wait(10)
    assert core_procs.tree_processes(2**22 + 1) == [] and core_procs.tree_rss(2**22 + 1) is None
    # A sleeping process tree is idle at once (one window).
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert core_procs.wait_tree_idle(sleeper.pid, max_seconds=2, window=0.1) < 1.0
    finally:
        sleeper.kill()
        sleeper.wait(10)


def test_raise_fd_limit_never_beyond_hard():
    soft, hard = core_procs.raise_fd_limit(10**9)
    assert soft <= hard or hard == -1
    assert core_procs.raise_fd_limit(0)[0] == soft  # never lowers


FACTS = {
    "servers": ["instance", "client2"], "frontend_maxconn": 2000,
    "clients": {"instance": {"server": "pyruvate", "threads": 2, "url": "http://127.0.0.1:8081",
                             "blob_sendfile": True, "metrics_url": None},
                "client2": {"server": "waitress", "threads": 4, "url": "http://127.0.0.1:8082",
                            "blob_sendfile": False, "metrics_url": "http://127.0.0.1:8072/metrics"},
                "uploads": {"server": "waitress", "threads": 1, "url": "http://127.0.0.1:8079",
                            "blob_sendfile": True, "metrics_url": None}},
    "zeo_address": "127.0.0.1:8100", "blob_storage": "/srv/blobs",
}


def test_facts_of_the_stack_come_from_stack_json():
    assert core_stack.frontend_maxconn(FACTS) == 2000
    assert core_stack.frontend_maxconn({"servers": []}) is None  # the Ansible role's abtest.json says nothing
    assert core_stack.client_facts(FACTS, "client2")["blob_sendfile"] is False
    assert core_stack.client_urls(FACTS) == {"instance": "http://127.0.0.1:8081", "client2": "http://127.0.0.1:8082"}
    assert core_stack.client_urls(FACTS, ["uploads"]) == {"uploads": "http://127.0.0.1:8079"}
    assert core_stack.zeo_server(FACTS) == ("127.0.0.1:8100", "/srv/blobs")
    with pytest.raises(core_stack.NotReady, match="describes no client 'nope': run bin/buildout again"):
        core_stack.client_facts(FACTS, "nope")
    with pytest.raises(core_stack.NotReady, match="names no ZEO server"):
        core_stack.zeo_server(dict(FACTS, zeo_address=None))  # RelStorage


def test_render_haproxy_replaces_only_the_given_variables(tmp_path):
    template = tmp_path / "haproxy.cfg.j2"
    template.write_text("frontend plone\n    bind {{ bind }}\nbackend b\n    balance {{ balance }}\n"
                        "{% for s in servers %}    server {{ s.name }} {{ s.host }}:{{ s.port }}\n{% endfor %}")
    config = {"haproxy_template": str(template), "haproxy_context": {
        "bind": "127.0.0.1:8080", "balance": "leastconn", "servers": [{"name": "a", "host": "h", "port": 1}]}}
    assert core_stack.render_haproxy(config, balance="first") == (
        "frontend plone\n    bind 127.0.0.1:8080\nbackend b\n    balance first\n    server a h:1\n")
    assert config["haproxy_context"]["balance"] == "leastconn"  # the stack's facts stay as they are
    with pytest.raises(KeyError, match="not a variable of .*: balanse"):
        core_stack.render_haproxy(config, balanse="first")
    with pytest.raises(core_stack.NotReady, match="no haproxy_context"):
        core_stack.render_haproxy({"servers": []})


def test_require_wrk_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no wrk there

    @core_cli.exits_2_when_not_ready("tool")
    def main(argv=None):
        core_wrk.require_wrk()
        return 0

    assert main([]) == 2
    assert capsys.readouterr().err.startswith("tool: wrk not found")
    _fake_wrk(tmp_path, monkeypatch, "true")
    assert main([]) == 0


def test_shared_arguments_and_counts(capsys):
    """add_stack_arguments gives every tool the same --stack-config and --out; parse_counts
    turns '10,100' into integers or ends with an error naming the option."""
    import argparse

    parser = argparse.ArgumentParser()
    core_cli.add_stack_arguments(parser)
    args = parser.parse_args([])
    assert args.stack_config == core_stack.STACK_JSON
    assert args.out == os.path.join(core_stack.ROOT, "var", "reports")
    assert core_cli.parse_counts(parser, "--connections", "10, 100,") == [10, 100]
    assert core_cli.parse_counts(parser, "--rounds", "0,2", minimum=0) == [0, 2]
    for text in ("", "ten", "10,0", "-5"):
        with pytest.raises(SystemExit):
            core_cli.parse_counts(parser, "--connections", text)
        assert f"--connections: expected comma-separated integers >= 1, got {text!r}" in capsys.readouterr().err


def test_default_buildout_config_follows_make_builds_record(tmp_path, monkeypatch):
    monkeypatch.setattr(core_stack, "ROOT", str(tmp_path))
    (tmp_path / "var").mkdir()
    for name in ("buildout.cfg", "relstorage.cfg", ".installed.cfg"):
        (tmp_path / name).write_text("")
    assert core_stack.default_buildout_config() == str(tmp_path / "buildout.cfg")   # no record
    record = tmp_path / "var" / "buildout-config"
    record.write_text(str(tmp_path / "relstorage.cfg") + "\n")
    os.utime(tmp_path / ".installed.cfg", (1000, 1000))
    assert core_stack.default_buildout_config() == str(tmp_path / "relstorage.cfg")
    # bin/buildout ran after make build: the record is stale, local.cfg is the guess
    (tmp_path / "local.cfg").write_text("")
    os.utime(record, (500, 500))
    assert core_stack.default_buildout_config() == str(tmp_path / "local.cfg")
    # a record naming a file that is gone is no answer either
    record.write_text(str(tmp_path / "gone.cfg"))
    assert core_stack.default_buildout_config() == str(tmp_path / "local.cfg")


def test_run_arguments_take_the_type_of_their_default():
    import argparse

    parser = argparse.ArgumentParser()
    core_cli.add_run_arguments(parser, duration=20, warmup=2.5, rounds=3, rounds_help="on/off pairs")
    args = parser.parse_args(["--duration", "7", "--warmup", "1"])
    assert (args.duration, args.warmup, args.rounds) == (7, 1.0, 3)
    assert isinstance(args.duration, int) and isinstance(args.warmup, float)
    assert "on/off pairs (default 3)" in parser.format_help()
    with pytest.raises(SystemExit):  # a whole-seconds tool refuses 2.5 s
        parser.parse_args(["--duration", "2.5"])
    bare = argparse.ArgumentParser()
    core_cli.add_run_arguments(bare, duration=5)
    assert vars(bare.parse_args([])) == {"duration": 5}


def test_markdown_table_aligns_figures_right_and_text_left():
    text = core_reports.markdown_table(["path", "requests", "share", "p99 s", "note"],
                                       [["/", 12345, "49.9%", 0.25, "x"], ["@json", 7, "-", None, ""]])
    assert text.splitlines() == [
        "| path | requests | share | p99 s | note |",
        "|---|---:|---:|---:|---|",
        "| / | 12,345 | 49.9% | 0.25 | x |",
        "| @json | 7 | - | - |  |",
    ]
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        core_reports.markdown_table(["a", "b", "c"], [[1, 2]])


def test_report_folder_and_write_report(tmp_path):
    import datetime

    folder = core_reports.report_folder(str(tmp_path), "connections", datetime.datetime(2026, 11, 24, 10, 5, 9))
    assert folder == str(tmp_path / "connections-20261124-100509") and os.path.isdir(folder)
    drawn = []
    paths = core_reports.write_report(folder, {"b": 1, "a": [2]}, "# title\n",
                                      [("x.png", lambda path: drawn.append(path) or open(path, "wb").close())])
    assert paths == [os.path.join(folder, name) for name in ("report.json", "report.md", "x.png")]
    assert open(paths[0]).read() == json.dumps({"b": 1, "a": [2]}, indent=2)  # order kept
    assert open(paths[1]).read() == "# title\n" and drawn == [paths[2]]


def test_new_and_saved_figure_is_a_png(tmp_path):
    fig, axes = core_reports.new_figure(1, 2, figsize=(4, 2))
    axes[0].plot([1, 2], [3, 4])
    core_reports.save_figure(fig, str(tmp_path / "p.png"), dpi=50)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.pyplot as plt

    assert fig.number not in plt.get_fignums()  # closed


def test_run_wrk_with_another_script_and_environment(tmp_path, monkeypatch):
    """A script of its own (the write path's) and variables for it: on wrk's command line
    the script only, the variables in its environment (a password stays off argv)."""
    script = tmp_path / "bin" / "wrk"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$* auth=$PLONEDEPLOY_AUTH" > {tmp_path}/wrk.args\n'
                      f"echo 'PLONEDEPLOY_WRK {json.dumps(SUMMARY)}'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    core_wrk.run_wrk("http://127.0.0.1:1/f", 1, 1, script=core_wrk.WRK_POST_SCRIPT,
                     env={"PLONEDEPLOY_AUTH": "Basic s3cret"})
    argv, environment = (tmp_path / "wrk.args").read_text().strip().split(" auth=")
    assert argv.split()[argv.split().index("-s") + 1] == core_wrk.WRK_POST_SCRIPT
    assert environment == "Basic s3cret" and "s3cret" not in argv


def test_add_stack_arguments_without_the_stack_config():
    import argparse

    parser = argparse.ArgumentParser()
    core_cli.add_stack_arguments(parser, stack_config=False)
    args = parser.parse_args([])
    assert not hasattr(args, "stack_config") and args.out.endswith(os.path.join("var", "reports"))


def test_spread_format_and_bars(tmp_path):
    assert core_stats.spread([3, 1, 2.5]) == {"median": 2.5, "min": 1.0, "max": 3.0} and core_stats.spread([]) is None
    assert core_stats.format_spread({"median": 1234.5, "min": 1000, "max": 2000.25}, 1) == "1,234.5 (1,000.0–2,000.2)"
    assert core_stats.format_spread(None) == "-"
    fig, ax = core_reports.new_figure()
    core_reports.spread_bars(ax, ["/", "blob"], [
        ("a", {"/": core_stats.spread([1, 2, 3]), "blob": None}),
        ("b", {"/": core_stats.spread([4]), "blob": core_stats.spread([5, 6])})])
    heights = sorted(bar.get_height() for bar in ax.patches)
    assert heights == [2.0, 4.0, 5.5]  # the medians; the missing one a gap
    assert [t.get_text() for t in ax.get_xticklabels()] == ["/", "blob"]
    core_reports.save_figure(fig, str(tmp_path / "b.png"))


def test_finish_report_writes_prints_and_gives_the_status(tmp_path, capsys):
    assert core_reports.finish_report(str(tmp_path), {"a": 1}, "# t\n") == 0
    assert capsys.readouterr().out == f"# t\n\nreport: {tmp_path}\n"
    assert core_reports.finish_report(str(tmp_path), {"a": 1}, "# t\n", problems=["run 3: 2 errors"]) == 1
    assert "problem: run 3: 2 errors\n" in capsys.readouterr().out
    assert json.loads((tmp_path / "report.json").read_text()) == {"a": 1}


def test_littles_law_mean_and_p99_over_it():
    # 200 connections at 40 req/s: each must wait 5 s on average if all are served in turn
    assert core_stats.littles_law(200, 40.0, 6.5) == {"littles_law_mean_s": 5.0, "p99_over_littles_mean": 1.3}
    assert core_stats.littles_law(200, 0.0, None) == {"littles_law_mean_s": None, "p99_over_littles_mean": None}
    assert core_stats.littles_law(10, 5.0, None) == {"littles_law_mean_s": 2.0, "p99_over_littles_mean": None}


def test_listen_overflows_reads_the_kernels_counter():
    value = core_procs.listen_overflows()
    assert isinstance(value, int) and value >= 0
    with open("/proc/net/netstat", encoding="ascii") as fp:
        lines = fp.read().splitlines()
    names, values = next((n, v) for n, v in zip(lines[::2], lines[1::2]) if n.startswith("TcpExt:"))
    # the counter only grows: what was read first is at most what the file says now
    assert value <= int(dict(zip(names.split()[1:], values.split()[1:]))["ListenOverflows"])


def test_frontend_5xx_counts_every_frontend_but_the_stats_listener():
    rows = [{"pxname": "http-in", "svname": "FRONTEND", "hrsp_5xx": "3"},
            {"pxname": "https-in", "svname": "FRONTEND", "hrsp_5xx": ""},
            {"pxname": "stats", "svname": "FRONTEND", "hrsp_5xx": "9"},
            {"pxname": "plone", "svname": "BACKEND", "hrsp_5xx": "2"},
            {"pxname": "plone", "svname": "instance", "hrsp_5xx": "2"}]
    assert haproxy_stats.frontend_5xx(rows) == 3


def test_exits_2_passes_keyword_arguments_through():
    @core_cli.exits_2_when_not_ready("tool")
    def main(argv=None, prog="tool"):
        return (argv, prog)

    assert main(["-x"], prog="alias") == (["-x"], "alias")



def test_editor_password_missing_agrees_with_editor_password(tmp_path, monkeypatch):
    """The headline's, the matrix's and the A/B's check before they build refuses what the
    load test could not log in with: no variable and no file, or an empty file (bin/stack
    hands a service user an empty one to fill)."""
    path = tmp_path / "editor-password"
    monkeypatch.setattr(core_stack, "EDITOR_PASSWORD_FILE", str(path))
    monkeypatch.delenv(core_stack.EDITOR_PASSWORD_ENV, raising=False)
    assert core_stack.editor_password() is None and "neither is there" in core_stack.editor_password_missing()
    path.write_text("\n")
    assert core_stack.editor_password() is None and "the file is empty" in core_stack.editor_password_missing()
    path.write_text("s3cret\n")
    assert (core_stack.editor_password(), core_stack.editor_password_missing()) == ("s3cret", None)
    path.unlink()
    monkeypatch.setenv(core_stack.EDITOR_PASSWORD_ENV, "from-env")
    assert (core_stack.editor_password(), core_stack.editor_password_missing()) == ("from-env", None)
