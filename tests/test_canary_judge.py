"""The canary's judge (loadtests.ab.canary, ``python -m loadtests canary-judge``): HAProxy log
lines of a canary and its comparison clients in an A/A and an A/B phase -> promote, rollback
or not enough data, with the A/B statistics (loadtests.ab.abstats).

The log lines are made from HAProxy's ``option httplog`` format (tests/canary_logs.py's
:data:`HTTPLOG`), the format of the kit's template (haproxy/haproxy.cfg.j2: ``option httplog``,
no header captures, ``log stdout format raw``); test_real_haproxy_logs_lines_of_that_format
renders the template, runs the installed HAProxy on free ports in front of two small HTTP
servers and checks that every line it logs is of that format, field for field.
"""
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime
from urllib.parse import urlsplit

import numpy as np
import pytest

from canary_logs import (GAP_S, PHASE_S, PHASES, RATES, SERVERS, T0, deploy_log, httplog_fields, httplog_line,
                         slower_pages)
from conftest import ROOT, stop_group
from http_stub import answering_server
from loadtests.ab import canary, canary_judge
from loadtests.core import haproxy_log
from loadtests.core.procs import free_local_port


def test_httplog_line_is_read_by_the_kits_parser(tmp_path):
    """The generator's line and the lines tests/test_abstats.py typed by hand agree, and
    loadtests.core.haproxy_log reads every field the judge uses from it."""
    typed = ('127.0.0.1:39368 [22/Nov/2026:09:51:49.917] plone zeoclients/instance 0/13/0/37/50 200 2186 - - ---- '
             '10/10/9/1/0 0/1 "GET /Plone HTTP/1.1"')
    made = httplog_line(cp=39368, tr="22/Nov/2026:09:51:49.917", s="instance", Tw=13, Tr=37, Ta=50, ac=10, fc=10,
                        bc=9, sc=1, bq=1, r="GET /Plone HTTP/1.1")
    assert made == typed
    assert httplog_fields(typed)["Tr"] == "37"
    log = tmp_path / "haproxy.log"
    log.write_text(httplog_line(tr=datetime(2026, 11, 28, 10, 0, 0, 250000), b="writes", s="client2", Tr=-1, ST=503,
                                tsc="SC--", r="POST /Plone/@@edit HTTP/1.1") + "\n")
    (line,) = haproxy_log.lines(str(log))
    assert (line["backend"], line["server"], line["Tr"], line["status"], line["termination"], line["retries"],
            line["method"], line["path"]) == ("writes", "client2", -1, 503, "SC--", "0", "POST", "/Plone/@@edit")
    assert haproxy_log.accepted_epoch(line) == datetime(2026, 11, 28, 10, 0, 0, 250000).timestamp()
    assert list(haproxy_log.lines(str(log), "zeoclients")) == []  # a backend named: others skipped


def _zope(delay):
    """The answer of a stand-in ZEO client: 200 ``OK`` after ``delay`` seconds, 500 on ``/boom``."""
    def answer(request):
        time.sleep(delay)
        return (500 if request.path == "/boom" else 200), {}, b"OK"
    return answer


def _server_lines(log):
    """The lines of HAProxy's log file ``log`` (a pathlib.Path) that name one of the kit's backends."""
    return [text for text in log.read_text().splitlines() if "zeoclients/" in text or "writes/" in text]


@pytest.mark.skipif(not shutil.which("haproxy"), reason="no haproxy binary")
def test_real_haproxy_logs_lines_of_that_format(tmp_path):
    """The kit's template rendered with two servers (``canary`` 100 ms slower than ``other``),
    the installed HAProxy on free ports for a few seconds, one request of each class and a
    500: every line it logged is of :data:`HTTPLOG`, :func:`httplog_line` writes it again
    byte for byte from its fields, and the judge reads server, class, Tr and errors from it."""
    from plonedeploy.recipe import edge, options, tls

    assert "capture " not in open(os.path.join(ROOT, "haproxy", "haproxy.cfg.j2")).read()  # %hr, %hs empty
    stand_ins = contextlib.ExitStack()
    backends = {name: stand_ins.enter_context(answering_server(_zope(delay)))
                for name, delay in (("canary", 0.1), ("other", 0.0))}
    frontend, stats = free_local_port(), free_local_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(options.render_template(os.path.join(ROOT, "haproxy", "haproxy.cfg.j2"), dict(
        part="canary-test", servers=[{"name": name, "host": "127.0.0.1", "port": urlsplit(url).port,
                                      "maxconn": 2, "wsgi_server": "waitress"} for name, url in backends.items()],
        bind=f"127.0.0.1:{frontend}", stats_bind=f"127.0.0.1:{stats}", balance="roundrobin",
        health_check="/Plone/@@ok", timeout_queue=5, max_body_size=1024, maxconn=100, fd_limit=1000,
        manage_networks=[], run_directory=str(tmp_path),
        **edge.template_context(["127.0.0.1"]), **tls.template_context("", "", False, 0))))
    log = tmp_path / "haproxy.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    requests = [("GET", "/Plone"), ("GET", "/Plone/front-page"), ("GET", "/Plone/++api++"),
                ("GET", "/Plone/@search?SearchableText=x"), ("GET", "/Plone/blob-5mb/@@download/file"),
                ("GET", "/Plone/image/@@images/image/preview"), ("POST", "/Plone/@@edit"), ("GET", "/boom")]
    try:
        deadline = time.monotonic() + 15
        while True:  # until HAProxy listens and sends to a server
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{frontend}/Plone/@@ok", timeout=5).read()
                break
            except (OSError, urllib.error.HTTPError):
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        statuses = []
        for _ in range(2):  # roundrobin: each request once on each server
            for method, path in requests:
                req = urllib.request.Request(f"http://127.0.0.1:{frontend}{path}", method=method,
                                             data=b"title=x" if method == "POST" else None)
                try:
                    statuses.append(urllib.request.urlopen(req, timeout=10).status)
                except urllib.error.HTTPError as exc:
                    statuses.append(exc.code)
        # HAProxy logs a stream when it ends, which may be after the client has read the answer:
        # wait for the last line before stopping it (CI once read 16 of the 17 lines).
        deadline = time.monotonic() + 10
        while len(_server_lines(log)) < 1 + 2 * len(requests) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop_group(proc, timeout=10)
        stand_ins.close()
    assert statuses == [200] * 7 + [500] + [200] * 7 + [500]
    logged = _server_lines(log)
    assert len(logged) == 1 + 2 * len(requests), log.read_text()  # the @@ok of the wait, then the requests
    for text in logged:
        fields = httplog_fields(text)
        assert fields, f"not of option httplog's format: {text}"
        assert httplog_line(**dict(fields, Tr=int(fields["Tr"]))) == text
    lines = [line for line in haproxy_log.lines(str(log)) if line["server"] in backends][1:]
    classes = [canary.path_class(line["method"], line["path"]) for line in lines]
    assert classes == 2 * ["page", "page", "json", "json", "blob", "blob", "write", "page"]
    # the write lane: POSTs go to the backend writes, on its first server
    assert {(line["backend"], line["server"]) for line in lines if line["method"] == "POST"} == {("writes", "canary")}
    assert [canary.is_error(line) for line in lines] == 2 * ([False] * 7 + [True])
    by_server = {name: [line["Tr"] for line in lines if line["server"] == name and line["method"] == "GET"]
                 for name in backends}
    # Tr is the server's own time: the canary's sleep is in every one of its lines
    assert min(by_server["canary"]) >= 100 and sum(by_server["other"]) < sum(by_server["canary"]), by_server


# -- the judge on synthetic logs of a canary deploy (canary_logs.deploy_log) ----------------------

def judge_log(path, **kwargs):
    return canary.judge(canary.read_lines([str(path)]), "instance", ["client2", "client3"], PHASES, **kwargs)


def test_identical_release_is_promoted(tmp_path):
    data = judge_log(deploy_log(tmp_path / "haproxy.log"))
    assert data["verdict"] == canary.PROMOTE, data["reasons"]
    assert [entry["verdict"] for entry in data["classes"].values()] == ["pass"] * 4
    assert len(data["reasons"]) == 4 and all("within the limits" in reason for reason in data["reasons"])
    # every request of the three servers in either phase is judged; the canary's restart between
    # the phases (its 503s) and the stats page's line are not
    lines = (tmp_path / "haproxy.log").read_text().splitlines()
    assert data["judged_requests"] + sum(data["left_out"].values()) == len(lines)
    assert data["left_out"]["other servers"] == 1 and data["left_out"]["outside both phases"] > 3 * GAP_S
    assert set(data["servers"]["ab"]) == set(SERVERS) and data["warnings"] == []
    # a typo in a server name is said (and its requests are not the comparison's)
    typo = canary.judge(canary.read_lines([str(tmp_path / "haproxy.log")]), "instance", ["client2", "clinet3"],
                        PHASES, classes=["page"])
    assert typo["warnings"] == ["no line of server clinet3 in either phase: is the name right? (HAProxy's server "
                                "name, as in its log's backend/server)"]
    assert typo["servers"]["ab"].keys() == {"instance", "client2"}
    page = data["classes"]["page"]["stats"]
    assert page["ab"]["counts"]["canary"]["errors"] == 0 and page["ab"]["p50_ratio"]["n"] == PHASE_S // 10
    assert 1 < data["classes"]["page"]["limits"]["p50_ratio"] < 1.3  # the A/A's upper end + 10 %


def test_canary_50_ms_slower_on_pages_is_rolled_back_naming_page(tmp_path):
    data = judge_log(deploy_log(tmp_path / "haproxy.log", slower_pages))
    assert data["verdict"] == canary.ROLLBACK
    assert data["reasons"] and all(reason.startswith("page Tr p") for reason in data["reasons"]), data["reasons"]
    page = data["classes"]["page"]
    assert page["verdict"] == "worse"
    assert page["stats"]["ab"]["p50_ratio"]["low"] > page["limits"]["p50_ratio"]  # the whole interval above
    assert 1.4 < page["stats"]["ab"]["p50_ratio"]["value"] < 2.0  # 80 ms + 50 ms over 80 ms
    assert [data["classes"][cls]["verdict"] for cls in ("json", "blob", "write")] == ["pass"] * 3


def test_5xx_on_the_canary_is_rolled_back(tmp_path):
    def errors(phase, server, cls, tr, rng):
        failed = phase == "ab" and server == "instance" and cls == "page" and rng.random() < 0.05
        return tr, 500 if failed else 200

    data = judge_log(deploy_log(tmp_path / "haproxy.log", errors))
    assert data["verdict"] == canary.ROLLBACK
    (reason,) = data["reasons"]
    assert reason.startswith("page errors: ") and " on the canary, 0 of " in reason, reason
    page = data["classes"]["page"]
    assert page["stats"]["ab"]["error_excess"]["low"] > page["limits"]["error_excess"] == pytest.approx(0.001)
    # the failed requests' times are not server times of the page: the Tr ratios pass
    assert page["stats"]["ab"]["p50_ratio"]["high"] < page["limits"]["p50_ratio"]


def test_few_requests_is_not_enough_data_never_a_promote(tmp_path):
    data = judge_log(deploy_log(tmp_path / "haproxy.log", rates=dict(RATES, json=0.3)))
    assert data["verdict"] == canary.NOT_ENOUGH
    assert data["classes"]["json"]["verdict"] == canary.NOT_ENOUGH
    assert all(reason.startswith("json: ") and "(at least 200 needed per side and phase)" in reason
               for reason in data["reasons"]), data["reasons"]
    assert any(reason.startswith("json: the canary got ") for reason in data["reasons"])
    assert [data["classes"][cls]["verdict"] for cls in ("page", "blob", "write")] == ["pass"] * 3
    # the same log with phases cut in 60 s windows: 5 a phase, too few for an interval
    data = judge_log(tmp_path / "haproxy.log", window_s=60, classes=["page"])
    assert data["verdict"] == canary.NOT_ENOUGH
    assert [re.sub(r"\d+ windows", "N windows", reason) for reason in data["reasons"]] == [
        f"page: N windows in the {phase} phase in which both sides answered it (at least 10 needed: a longer phase, "
        "or a shorter --window)" for phase in ("A/A", "A/B")]
    assert all(int(reason.split()[1]) in (5, 6) for reason in data["reasons"])  # 300 s from a minute or not


def test_no_traffic_at_all_is_not_enough_data(tmp_path):
    data = judge_log(deploy_log(tmp_path / "haproxy.log", rates={"page": 2.0}), classes=["json", "blob"])
    assert data["verdict"] == canary.NOT_ENOUGH
    assert data["reasons"] == ["no class had requests in both phases: nothing was judged"]
    assert [entry["verdict"] for entry in data["classes"].values()] == ["no traffic"] * 2
    assert data["left_out"]["class page not judged"] > 0


def test_aa_floor_widens_the_tolerance(tmp_path):
    """A canary on a host 25 % slower than its comparison's: its A/A phase shows it, so the same
    25 % in the A/B phase is not the release's (promote); without that A/A (the host as fast
    in A/A), the same A/B phase is a rollback."""
    def slow_host(phase, server, cls, tr, rng):
        return (tr * 1.25 if server == "instance" else tr), 200

    def slow_release(phase, server, cls, tr, rng):
        return (tr * 1.25 if server == "instance" and phase == "ab" else tr), 200

    floor = judge_log(deploy_log(tmp_path / "host.log", slow_host))
    plain = judge_log(deploy_log(tmp_path / "release.log", slow_release))
    assert floor["verdict"] == canary.PROMOTE, floor["reasons"]
    assert plain["verdict"] == canary.ROLLBACK
    assert any(reason.startswith("page Tr p50 ") for reason in plain["reasons"]), plain["reasons"]
    for data in (floor, plain):  # the A/B phases are alike ...
        assert 1.15 < data["classes"]["page"]["stats"]["ab"]["p50_ratio"]["value"] < 1.35
    # ... the limits are not: the A/A interval's upper end x 1.1
    assert floor["classes"]["page"]["limits"]["p50_ratio"] > 1.35 > 1.25 > plain["classes"]["page"]["limits"][
        "p50_ratio"]
    assert floor["classes"]["page"]["limits"]["p50_ratio"] == pytest.approx(
        floor["classes"]["page"]["stats"]["aa"]["p50_ratio"]["high"] * 1.1)


def test_write_lane_sends_writes_to_one_client_only(tmp_path):
    """The kit's write lane sends every write to the first client: with the canary first, the
    comparison clients get none, and the write class cannot be judged until it is left out."""
    log = deploy_log(tmp_path / "haproxy.log", write_to="instance")
    data = judge_log(log)
    assert data["verdict"] == canary.NOT_ENOUGH
    assert data["reasons"][0] == ("write: the comparison clients got 0 requests in the A/A phase (at least 200 "
                                  "needed per side and phase)")
    assert judge_log(log, classes=["page", "json", "blob"])["verdict"] == canary.PROMOTE


def test_default_min_requests_is_where_the_interval_is_as_wide_as_the_tolerance(tmp_path):
    """DEFAULT_MIN_REQUESTS' reason: at 200 requests a side and phase, the 95 % interval of the
    p50 ratio of two identical servers is about ±12 %, wider than the 10 % tolerance."""
    assert canary.DEFAULT_MIN_REQUESTS == 200 and canary.DEFAULT_MAX_SLOWDOWN == 0.10
    widths = []
    for seed in (1, 2, 3):
        log = deploy_log(tmp_path / f"{seed}.log", seed=seed, rates={"page": 200 / PHASE_S},
                         servers=("instance", "client2"))
        data = canary.judge(canary.read_lines([str(log)]), "instance", ["client2"], PHASES, classes=["page"],
                            min_requests=150)
        for phase in ("aa", "ab"):
            ratio = data["classes"]["page"]["stats"][phase]["p50_ratio"]
            widths.append((ratio["high"] - ratio["low"]) / 2 / ratio["value"])
    assert 0.10 < float(np.median(widths)) < 0.16, widths


@pytest.mark.parametrize("method, target, cls", [
    ("GET", "/Plone", "page"),
    ("HEAD", "/Plone/news/event-1?x=1", "page"),
    ("GET", "/", "page"),
    ("GET", "/Plone/++plone++static/plone.js", "page"),
    ("GET", "/Plone/images/logo", "page"),  # a folder named images is not the images view
    ("GET", "/Plone/manual.pdf/@@download/file", "blob"),
    ("GET", "/Plone/photo/@@images/image/preview", "blob"),
    ("GET", "/Plone/photo/@@images/4b1c.jpeg", "blob"),
    ("GET", "/Plone/manual.pdf/@@display-file/file", "blob"),
    ("GET", "/Plone/++api++/manual.pdf/@@download/file", "blob"),
    ("GET", "/Plone/++api++", "json"),
    ("GET", "/Plone/++api++/news?expand=breadcrumbs", "json"),
    ("GET", "/Plone/@search?SearchableText=plone", "json"),
    ("GET", "/Plone/news/@navigation", "json"),
    ("GET", "https://www.example.org/Plone/@search", "json"),  # HTTP/2: an absolute target
    ("GET", "/Plone/@@search?SearchableText=x", "page"),  # the classic view, two @
    ("POST", "/Plone/@login", "write"),
    ("PATCH", "/Plone/++api++/news", "write"),
    ("DELETE", "/Plone/news", "write"),
    ("PUT", "/Plone/manual.pdf/@@download/file", "write"),
    (None, None, None),  # <BADREQ>: no request line
])
def test_path_class(method, target, cls):
    assert canary.path_class(method, target) == cls


@pytest.mark.parametrize("status, termination, error", [
    (200, "----", False), (404, "----", False), (302, "----", False),
    (500, "----", True), (502, "SH--", True), (503, "SC--", True), (504, "sH--", True),
    (200, "SD--", True),  # the server cut the body after its 200's headers
    (200, "CD--", False),  # the client went away: not the server's doing
    (-1, "CR--", False),
])
def test_is_error(status, termination, error):
    assert canary.is_error({"status": status, "termination": termination}) is error


def test_times_and_phases():
    local = datetime(2026, 11, 28, 10, 0, 0).timestamp()
    assert canary.parse_time("2026-11-28T10:00:00") == local
    assert canary.parse_time("28/Nov/2026:10:00:00") == local == canary.parse_time("28/Nov/2026:10:00:00.000")
    assert canary.parse_time(str(local)) == local
    assert canary.parse_time("2026-11-28T10:00:00+00:00") == datetime.fromisoformat("2026-11-28T10:00:00+00:00"
                                                                                  ).timestamp()
    with pytest.raises(canary.JudgeError, match="'noon' is not a time"):
        canary.parse_time("noon")
    assert canary.phase_of(T0, PHASES) == "aa" and canary.phase_of(T0 + PHASE_S, PHASES) is None
    assert canary.phase_of(T0 + PHASE_S + GAP_S, PHASES) == "ab" and canary.phase_of(T0 - 1, PHASES) is None
    for phases, message in (({"aa": (None, None), "ab": (T0, None)}, "needs an end"),
                            ({"aa": (T0, T0 - 1), "ab": (T0, None)}, "starts at or after its end"),
                            ({"aa": (None, T0), "ab": (T0 - 1, None)}, "must start at or after the end")):
        with pytest.raises(canary.JudgeError, match=message):
            canary.check_phases(phases)
    with pytest.raises(canary.JudgeError, match="'instance' is also one of its comparison servers"):
        canary.judge([], "instance", ["instance", "client2"], PHASES)
    with pytest.raises(canary.JudgeError, match="classes must be some of page, json, blob, write, got html"):
        canary.judge([], "instance", ["client2"], PHASES, classes=["html"])


def test_command_writes_the_report_and_exits_by_verdict(tmp_path, capsys):
    from loadtests.ab import canary_report

    aa_until = datetime.fromtimestamp(T0 + PHASE_S).isoformat()
    args = ["--canary", "instance", "--compare", "client2,client3", "--aa-from", str(T0), "--aa-until", aa_until,
            "--ab-from", str(T0 + PHASE_S + GAP_S), "--ab-until", str(T0 + 2 * PHASE_S + GAP_S), "--classes", "page"]
    pages = {"page": RATES["page"]}  # one class: the statistics of four are the tests above
    same = deploy_log(tmp_path / "same.log", rates=pages)
    slower = deploy_log(tmp_path / "slower.log", slower_pages, rates=pages)
    assert canary_judge.main(["--log", str(same), *args, "--out", str(tmp_path / "promote")]) == 0
    (folder,) = (tmp_path / "promote").iterdir()
    assert folder.name.startswith("canary-judge-")
    assert (folder / "canary.png").stat().st_size > 0
    report = json.loads((folder / "report.json").read_text())
    assert report["verdict"] == "promote" and report["settings"]["logs"] == [str(same)]
    markdown = (folder / "report.md").read_text()
    assert markdown.startswith("# Canary instance: promote\n") and markdown == canary_report.markdown(report)
    assert f"Judged {report['judged_requests']:,} requests" in markdown
    assert "| page | pass | " in markdown and "| instance | canary | " in markdown and "| json |" not in markdown
    assert capsys.readouterr().out.endswith(f"report: {folder}\n")
    # not enough data: the same log with more requests needed than it has
    assert canary_judge.main(["--log", str(same), *args, "--min-requests", "5000", "--out", str(tmp_path / "few")]) == 3
    assert "- page: the canary got " in capsys.readouterr().out
    # a log that cannot be read: 2, nothing written
    assert canary_judge.main(["--log", str(tmp_path / "missing.log"), *args, "--out", str(tmp_path / "none")]) == 2
    assert "canary-judge: cannot read " in capsys.readouterr().err and not (tmp_path / "none").exists()
    # through the entry point, as Ansible and bin/stack call it: rollback exits 1
    result = subprocess.run([sys.executable, "-m", "loadtests", "canary-judge", "--log", str(slower), *args,
                             "--out", str(tmp_path / "rollback")], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("# Canary instance: rollback\n\n- page Tr p50 of the canary is ")


@pytest.mark.parametrize("bad, message", [
    (["--aa-until", "noon"], "'noon' is not a time"),
    (["--aa-until", "2026-11-28T10:00:00", "--ab-from", "2026-11-28T09:00:00"], "must start at or after the end"),
])
def test_command_refuses_bad_times(bad, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        canary_judge.parse_args(["--canary", "a", "--compare", "b", *bad])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
