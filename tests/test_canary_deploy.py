"""The pieces of the local canary deploy and its benchmark (loadtests.ab.canary_deploy,
loadtests.ab.canary_bench) without a stack: which client is the canary, which release fits,
the release's buildout config, the benchmark's order, detection and summary on synthetic
HAProxy logs (tests/canary_logs.py), and the background Locust against a small HTTP
server. The deploy itself runs on a real stack in ``python -m loadtests canary-bench``
(docs/explanation/canary.md#sensitivity)."""
import json
import os
import time

import pytest

from canary_logs import PHASES, RATES, SERVERS, T0, deploy_log, slower_pages
from http_stub import answering_server
from loadtests.ab import canary, canary_bench, canary_deploy
from loadtests.core.locustrun import BackgroundLocust


def stack_facts(tmp_path, kinds=(("instance", "pyruvate"), ("client2", "pyruvate"))):
    var = tmp_path / "stack" / "var"
    (var / "blobstorage").mkdir(parents=True)
    clients = {name: {"server": kind, "url": f"http://127.0.0.1:{8081 + index}"}
               for index, (name, kind) in enumerate(kinds)}
    return {"servers": [name for name, _ in kinds], "clients": clients, "zeo_address": "127.0.0.1:8100",
            "blob_storage": str(var / "blobstorage"),
            "processes": [{"name": name, "argv": [str(tmp_path / "stack" / "bin" / name), "console"]}
                          for name, _ in kinds]}


def test_the_canary_is_the_last_client_with_a_peer_of_its_server(tmp_path):
    stack = stack_facts(tmp_path, (("instance", "pyruvate"), ("client2", "waitress"), ("client3", "pyruvate")))
    assert canary_deploy.choose(stack) == ("client3", ["instance"])
    assert canary_deploy.choose(stack, "instance") == ("instance", ["client3"])
    with pytest.raises(canary_deploy.CanaryError, match=r"^--canary 'uploads' is not a client of the pool: "
                       r"instance \(pyruvate\), client2 \(waitress\), client3 \(pyruvate\)$"):
        canary_deploy.choose(stack, "uploads")
    with pytest.raises(canary_deploy.CanaryError, match="needs a comparison client of its own WSGI server"):
        canary_deploy.choose(stack, "client2")
    # the kit's default pool: pyruvate against waitress, nothing to compare a canary with
    with pytest.raises(canary_deploy.CanaryError, match=r"which has instance \(pyruvate\), client2 \(waitress\): add"):
        canary_deploy.choose(stack_facts(tmp_path / "b", (("instance", "pyruvate"), ("client2", "waitress"))))


def release(tmp_path, stack, **options):
    """A release directory as bin/buildout leaves it: bin/client2, .installed.cfg, var linked."""
    directory = tmp_path / "release"
    (directory / "bin").mkdir(parents=True)
    script = directory / "bin" / "client2"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    os.symlink(os.path.dirname(stack["blob_storage"]), directory / "var")
    recorded = {"recipe": "plonedeploy.recipe:instance", "http-address": "127.0.0.1:8082", "wsgi-server": "pyruvate",
                "zeo-address": "127.0.0.1:8100", "blob-storage": str(directory / "var" / "blobstorage"), **options}
    # zc.buildout writes [buildout] more than once: the reader must take that
    (directory / ".installed.cfg").write_text("[buildout]\nparts = client2\n\n[client2]\n" + "".join(
        f"{key} = {value}\n" for key, value in recorded.items()) + "\n[buildout]\nparts = client2\n")
    return directory


def test_a_release_fits_when_it_is_the_same_client_on_the_stacks_data(tmp_path):
    stack = stack_facts(tmp_path)
    directory = release(tmp_path, stack)
    assert canary_deploy.check_release(stack, str(directory), "client2") == [str(directory / "bin" / "client2"),
                                                                             "console"]
    (directory / "bin" / "instance").write_text("")
    (directory / "bin" / "instance").chmod(0o755)
    with pytest.raises(canary_deploy.CanaryError, match=r"has no part 'instance' installed"):
        canary_deploy.check_release(stack, str(directory), "instance")


@pytest.mark.parametrize("options, message", [
    ({"http-address": "127.0.0.1:9082"}, r"\[client2\] http-address of the release is '127.0.0.1:9082', the "
                                         r"stack's is '127.0.0.1:8082': the canary must be the same client"),
    ({"wsgi-server": "waitress"}, r"\[client2\] wsgi-server of the release is 'waitress', the stack's is 'pyruvate'"),
    ({"zeo-address": "127.0.0.1:9100"}, r"zeo-address of the release is '127.0.0.1:9100'"),
    ({"blob-storage": "/srv/other/blobstorage"}, r"blob-storage of the release is '/srv/other/blobstorage' .*link the "
                                                 r"release's var to the stack's var"),
])
def test_a_release_that_does_not_fit_is_refused_naming_the_option(tmp_path, options, message):
    stack = stack_facts(tmp_path)
    with pytest.raises(canary_deploy.CanaryError, match=message):
        canary_deploy.check_release(stack, str(release(tmp_path, stack, **options)), "client2")


def test_a_release_not_built_is_refused(tmp_path):
    stack = stack_facts(tmp_path)
    with pytest.raises(canary_deploy.CanaryError, match=r"bin/client2 is missing: build the release first"):
        canary_deploy.check_release(stack, str(tmp_path), "client2")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "client2").write_text("")
    (tmp_path / "bin" / "client2").chmod(0o755)
    with pytest.raises(canary_deploy.CanaryError, match=r"is no buildout that ran: no .*\.installed\.cfg"):
        canary_deploy.check_release(stack, str(tmp_path), "client2")


def test_release_config_builds_the_canary_part_alone_with_its_delay(tmp_path):
    text = canary_deploy.release_config(str(tmp_path), "client2", extends="/srv/site/local.cfg", added_delay=20,
                                        develop_eggs="/srv/site/develop-eggs", service={"user": "plonedeploy"})
    assert text.startswith("# Generated by loadtests.ab.canary_deploy: a canary release of client2 "
                           "(added-delay 20 ms)\n"
                           "[buildout]\nextends = /srv/site/local.cfg\n")
    assert "\nparts = client2\n" in text and "\ndevelop-eggs-directory = /srv/site/develop-eggs\n" in text
    assert text.endswith("\n[client2]\nadded-delay = 20\n\n[service]\nuser = plonedeploy\n")
    assert "\ndirectory =" not in text  # the release's own: its var is the link
    assert "[service]" not in canary_deploy.release_config(str(tmp_path), "client2", extends="x.cfg", service={})


def test_make_release_refuses_a_var_that_is_not_the_stacks(tmp_path):
    (tmp_path / "release" / "var").mkdir(parents=True)
    with pytest.raises(canary_deploy.CanaryError, match=r"release/var exists and is not a link to .*/stack-var$"):
        canary_deploy.make_release(str(tmp_path / "release"), "client2", var=str(tmp_path / "stack-var"))


def test_release_plan_interleaves_identical_and_slower_releases():
    assert canary_bench.release_plan([5, 10, 20, 50], 5) == [
        ("same-1", 0), ("delay-50", 50), ("same-2", 0), ("delay-20", 20), ("same-3", 0), ("delay-10", 10),
        ("same-4", 0), ("delay-5", 5), ("same-5", 0)]
    assert canary_bench.release_plan([50], 2) == [("same-1", 0), ("delay-50", 50), ("same-2", 0)]


def test_detection_finds_the_first_rollback_within_the_ab_phase(tmp_path):
    rates = {"page": RATES["page"]}
    slower = list(canary.read_lines([str(deploy_log(tmp_path / "slower.log", slower_pages, rates=rates))]))
    found = canary_bench.detection(slower, SERVERS[0], list(SERVERS[1:]), PHASES, ["page"])
    # whole windows of the A/B phase, at least the judge's minimum; the canary's 2 pages a second
    assert found["seconds"] % canary.DEFAULT_WINDOW_S == 0
    assert found["seconds"] >= canary.MIN_WINDOWS * canary.DEFAULT_WINDOW_S
    assert 0.8 * 2 * found["seconds"] < found["requests"] < 1.2 * 2 * found["seconds"]
    # the first: one window less is no rollback yet
    ab_from = PHASES["ab"][0]
    earlier = {"aa": PHASES["aa"], "ab": (ab_from, ab_from + found["seconds"] - canary.DEFAULT_WINDOW_S)}
    assert canary.judge(slower, SERVERS[0], list(SERVERS[1:]), earlier, classes=["page"])["verdict"] != canary.ROLLBACK
    same = list(canary.read_lines([str(deploy_log(tmp_path / "same.log", rates=rates))]))
    assert canary_bench.detection(same, SERVERS[0], list(SERVERS[1:]), PHASES, ["page"]) is None


def test_summary_counts_false_rollbacks_and_the_smallest_delay_rolled_back():
    rows = [{"delay_ms": 0, "verdict": "promote", "detected": None},
            {"delay_ms": 5, "verdict": "not enough data", "detected": None},
            {"delay_ms": 0, "verdict": "rollback", "detected": {"seconds": 100.0, "requests": 900}},
            {"delay_ms": 50, "verdict": "rollback", "detected": {"seconds": 100.0, "requests": 800}},
            {"delay_ms": 20, "verdict": "rollback", "detected": {"seconds": 130.0, "requests": 1100}},
            {"delay_ms": 0, "verdict": "not enough data", "detected": None}]
    assert canary_bench.summarize(rows) == {
        "identical": 3, "false_rollbacks": 1, "false_rollback_rate": 1 / 3,
        "identical_verdicts": {"promote": 1, "rollback": 1, "not enough data": 1},
        "smallest_detected_ms": 20, "detected_after": {"seconds": 130.0, "requests": 1100}, "missed_ms": [5]}


def test_analysis_and_report_of_one_slower_release(tmp_path):
    log = deploy_log(tmp_path / "slower.log", slower_pages, rates={"page": RATES["page"]})
    timelines = [{"phases": PHASES, "switch_s": [14.5, 12.0], "kept": False}]
    (row,) = canary_bench.analyse(canary.read_lines([str(log)]), SERVERS[0], list(SERVERS[1:]), [("delay-50", 50)],
                                  timelines, ["page"])
    assert (row["name"], row["delay_ms"], row["verdict"]) == ("delay-50", 50, canary.ROLLBACK)
    assert row["reasons"][0].startswith("page Tr p50 of the canary is ") and row["page_p50"]["low"] > row["page_limit"]
    # the synthetic canary answers 2 pages a second: its A/B pages, within every judged line of both phases
    ab_s = PHASES["ab"][1] - PHASES["ab"][0]
    assert 0.8 * 2 * ab_s < row["canary_ab_pages"] < 1.2 * 2 * ab_s < row["judged_requests"]
    report = {"started": "2026-11-28 15:00 UTC", "load_after": "1.00 1.00 1.00", "releases": [row],
              "haproxy": canary_deploy.failed_lines(canary.read_lines([str(log)]), PHASES["aa"][0], float("inf")),
              "summary": canary_bench.summarize([row]), "load": {"requests": 1000, "errors": 0},
              "switch_s": [14.5, 12.0],
              "settings": {"canary": SERVERS[0], "compare": list(SERVERS[1:]), "phase_s": 300.0, "users": 6,
                           "weights": "root=1", "classes": ["page"], "load_before": "0.50 0.50 0.50"}}
    text = canary_bench.markdown(report)
    assert f"| delay-50 | 50 ms | rollback | {row['page_p50']['value']:.2f}× (" in text
    assert f"× | {row['judged_requests']:,} | {row['canary_ab_pages']:,} | {row['detected']['requests']} page" in text
    assert (f"Smallest added delay rolled back: 50 ms, after {row['detected']['requests']} of the canary's page "
            f"requests ({row['detected']['seconds']:g} s of its A/B phase).") in text
    assert "False rollbacks: 0 of 0 identical releases ()." in text and "switches 12.0–14.5 s." in text
    # the synthetic log's canary restart between the phases: 503s HAProxy answered
    assert f"HAProxy logged {report['haproxy']['errors']} errors of " in text and report["haproxy"]["errors"] > 0


def test_failed_lines_counts_every_server_in_the_load_window(tmp_path):
    lines = list(canary.read_lines([str(deploy_log(tmp_path / "h.log", rates={"page": 1.0}))]))
    # the synthetic canary's restart between the phases: refused connections, 503
    window = canary_deploy.failed_lines(lines, PHASES["aa"][1], PHASES["ab"][0])
    assert window["requests"] > 0 and window["errors"] > 0
    assert canary_deploy.failed_lines(lines, T0, PHASES["aa"][1])["errors"] == 0


def test_background_locust_counts_the_requests_it_made_until_stopped(tmp_path):
    answered = []

    def answer(request):  # a stand-in client: 200 OK, counting the GETs it answered
        answered.append(request.path)
        return 200, {}, b"OK"

    with answering_server(answer) as url:
        load = BackgroundLocust(url, "root=1", 2, directory=str(tmp_path)).start()
        # Locust's SIGTERM handler exists once it runs its users: on a busy machine that takes seconds
        deadline = time.monotonic() + 60
        while len(answered) < 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert load.running()
        row = load.stop()
    assert not load.running() and row["requests"] > 0 and row["errors"] == 0


def test_the_command_refuses_before_anything_starts(tmp_path, capsys):
    """The kit's default pool has no pair of one WSGI server, and a release must fit: exit 2
    with the reason, no load started, nothing switched (the stack here does not even run)."""
    config = tmp_path / "stack.json"
    config.write_text(json.dumps(stack_facts(tmp_path, (("instance", "pyruvate"), ("client2", "waitress")))))
    assert canary_deploy.main([str(tmp_path), "--stack-config", str(config)]) == 2
    assert "canary-deploy: the canary needs a comparison client of its own WSGI server" in capsys.readouterr().err
    config.write_text(json.dumps(stack_facts(tmp_path / "pair")))
    assert canary_deploy.main([str(tmp_path / "nothing"), "--stack-config", str(config)]) == 2
    assert "nothing/bin/client2 is missing: build the release first" in capsys.readouterr().err


def test_a_stopped_run_is_judged_again_from_its_deploys_json(tmp_path, capsys):
    log = deploy_log(tmp_path / "slower.log", slower_pages, rates={"page": RATES["page"]})
    settings = {"canary": SERVERS[0], "compare": list(SERVERS[1:]), "phase_s": 300.0, "users": 6, "weights": "root=1",
                "classes": ["page"], "load_before": "0.50 0.50 0.50"}
    (tmp_path / "deploys.json").write_text(json.dumps({
        "settings": settings, "plan": [["delay-50", 50]], "log": str(log), "started": "2026-11-28 15:00 UTC",
        "timelines": [{"phases": PHASES, "switch_s": [14.5, 12.0], "kept": False}]}))
    assert canary_bench.main(["--analyse", str(tmp_path / "deploys.json")]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert [row["verdict"] for row in report["releases"]] == [canary.ROLLBACK]
    assert report["summary"]["smallest_detected_ms"] == 50 and report["load"] == {"requests": None, "errors": None}
    assert (tmp_path / "report.md").read_text() in capsys.readouterr().out


def test_a_finished_run_is_judged_again_with_its_loads_figures(tmp_path):
    log = deploy_log(tmp_path / "slower.log", slower_pages, rates={"page": RATES["page"]})
    settings = {"canary": SERVERS[0], "compare": list(SERVERS[1:]), "phase_s": 300.0, "users": 6, "weights": "root=1",
                "classes": ["page"], "load_before": "0.50 0.50 0.50"}
    timelines = [{"phases": PHASES, "switch_s": [14.5, 12.0], "kept": False}]
    canary_bench.record(str(tmp_path), settings, [("delay-50", 50)], timelines, str(log), "2026-11-28 15:00 UTC",
                        {"requests": 1234, "errors": 0})
    assert canary_bench.main(["--analyse", str(tmp_path / "deploys.json")]) == 0
    assert json.loads((tmp_path / "report.json").read_text())["load"] == {"requests": 1234, "errors": 0}
    assert "Load: 1234 requests, 0 failed (Locust)" in (tmp_path / "report.md").read_text()


def test_each_phase_starts_after_the_canary_settled(monkeypatch):
    """deploy(): settle, A/A, switch to the release, settle, A/B, switch back; the waits are
    in neither phase (a client just restarted is cold: canary-bench of 28 Nov 2026)."""
    clock, steps = [1000.0], []
    monkeypatch.setattr(canary_deploy.time, "time", lambda: clock[0])

    def sleep(seconds):
        steps.append(("sleep", seconds))
        clock[0] += seconds

    def switch(stack, name, argv, timeout):
        steps.append(("switch", argv[0]))
        clock[0] += 40
        return 40.0

    monkeypatch.setattr(canary_deploy, "switch", switch)
    stack = {"processes": [{"name": "client2", "argv": ["/site/bin/client2", "console"]}]}
    timeline = canary_deploy.deploy(stack, "client2", ["/next/bin/client2", "console"], 100, sleep=sleep, settle_s=60)
    assert steps == [("sleep", 60), ("sleep", 100), ("switch", "/next/bin/client2"), ("sleep", 60), ("sleep", 100),
                     ("switch", "/site/bin/client2")]
    assert timeline == {"phases": {"aa": (1060.0, 1160.0), "ab": (1260.0, 1360.0)}, "switch_s": [40.0, 40.0],
                        "kept": False}
