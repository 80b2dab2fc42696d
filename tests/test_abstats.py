"""The A/B statistics (loadtests.ab.abstats, scipy's bootstrap) and the round plan of abtest.

No stack: the windows are built here with known counts, so the expected shares are known.
"""
import numpy as np
import pytest

from loadtests.ab import abstats, abtest
from loadtests.core import haproxy_log
from loadtests.ab.measure import locust_generator_args
from loadtests.ab.plan import round_plan


def _run(kind, counts_a, counts_b, p50=(10, 20), round_no=1):
    """A run whose every window has ``counts_a[i]``/``counts_b[i]`` requests on /Plone."""
    windows = []
    for i, (na, nb) in enumerate(zip(counts_a, counts_b)):
        servers = {}
        if na:
            servers["s1"] = {"/Plone": {"n": na, "failures": 0, "p50_ms": p50[0], "p99_ms": 3 * p50[0]}}
        if nb:
            servers["s2"] = {"/Plone": {"n": nb, "failures": 0, "p50_ms": p50[1], "p99_ms": 3 * p50[1]}}
        for name, entry in servers.items():
            entry["all"] = entry["/Plone"]
        windows.append({"start_s": 5.0 * i, "servers": servers})
    return {"kind": kind, "round": round_no, "labels": {"A": "s1", "B": "s2"},
            "slot_names": {"a": "s1", "b": "s2"}, "windows": windows}


def test_share_interval_holds_the_known_split():
    rng = np.random.default_rng(1)
    a = rng.poisson(60, 24)
    b = rng.poisson(40, 24)
    stats = abstats.summarize([_run("ab", a, b)], "ab")
    share = stats["/Plone"]["share"]
    assert share["value"] == pytest.approx(a.sum() / (a.sum() + b.sum()))
    assert share["low"] < 0.6 < share["high"]
    assert share["high"] - share["low"] < 0.1  # 24 windows of ~100 requests: a few points
    assert stats["/Plone"]["rps_ratio"]["value"] == pytest.approx(a.sum() / b.sum())
    assert stats["/Plone"]["p50_ratio"]["value"] == pytest.approx(0.5)
    assert stats["/Plone"]["p50_ratio"]["low"] == stats["/Plone"]["p50_ratio"]["high"] == pytest.approx(0.5)


def test_verdict_uses_the_aa_floor():
    rng = np.random.default_rng(2)
    runs = [_run("ab", rng.poisson(56, 30), rng.poisson(44, 30)),
            _run("aa", rng.poisson(50, 30), rng.poisson(50, 30))]
    ab, aa = abstats.summarize(runs, "ab"), abstats.summarize(runs, "aa")
    detected, text = abstats.verdict("/Plone", ab, aa)
    assert detected, text
    assert text.startswith("pyruvate finishes 5") and "above the A/A floor of ±" in text
    # The same A/B against a wide floor (a noisy A/A) is no longer a difference.
    noisy = abstats.summarize([_run("aa", [80, 20, 75, 25, 70, 30], [20, 80, 25, 75, 30, 70])], "aa")
    detected, text = abstats.verdict("/Plone", ab, noisy)
    assert not detected and "no difference detected" in text, text
    # Without a control the floor is unknown and said so.
    detected, text = abstats.verdict("/Plone", ab, None)
    assert detected and "no A/A control run: the noise floor is unknown" in text
    # A control that finished none of the path: said so, not "no control run".
    detected, text = abstats.verdict("/Plone", ab, {"/": aa["/Plone"]})
    assert detected and "the A/A control finished no /Plone" in text, text


def test_slot_share_sees_position_not_server():
    # Server A is in slot a in round 1 and in slot b in round 2: a position effect shows in
    # slot_share, a server effect in the A/B share.
    first = _run("ab", [70] * 6, [30] * 6, round_no=1)
    second = dict(_run("ab", [70] * 6, [30] * 6, round_no=2), slot_names={"a": "s2", "b": "s1"})
    assert abstats.slot_share([first, second])["value"] == pytest.approx(0.5)
    assert abstats.summarize([first, second], "ab")["/Plone"]["share"]["value"] == pytest.approx(0.7)


def test_round_plan_swaps_slots_and_interleaves_control():
    args = abtest.parse_args(["--rounds", "4", "--control"])
    plan = round_plan(args)
    ab = [(r, a, b, slot) for r, kind, a, b, slot in plan if kind == "ab"]
    assert ab == [(1, "pyruvate", "waitress", "a"), (2, "waitress", "pyruvate", "b"),
                  (3, "pyruvate", "waitress", "a"), (4, "waitress", "pyruvate", "b")]
    assert [kind for _, kind, _, _, _ in plan] == ["ab", "aa", "aa", "ab", "ab", "aa", "aa", "ab"]
    assert all(a == b == "pyruvate" for _, kind, a, b, _ in plan if kind == "aa")
    calibration = round_plan(abtest.parse_args(["--rounds", "2", "--calibrate", "25"]))
    assert [(kind, a, b) for _, kind, a, b, _ in calibration] == [("ab", "pyruvate", "pyruvate")] * 2


def test_defaults_and_option_errors(capsys):
    args = abtest.parse_args([])
    assert args.rounds >= 4 and args.warmup >= 10
    assert abtest.parse_args(["--deployed"]).rounds == 1
    for bad in (["--warmup", "-1"], ["--window", "0"], ["--calibrate", "100"]):
        with pytest.raises(SystemExit):
            abtest.parse_args(bad)
    assert "--calibrate" in capsys.readouterr().err


def test_remote_workers_make_locust_a_master(capsys):
    """--remote-workers: Locust waits as a master for the workers of the loadgenerator role
    and runs no users of its own; without it, --processes on this machine."""
    args = abtest.parse_args(["--deployed", "--remote-workers", "2", "--master-bind", "10.0.0.1",
                              "--master-port", "15557"])
    assert locust_generator_args(args) == [
        "--master", "--master-bind-host", "10.0.0.1", "--master-bind-port", "15557",
        "--expect-workers", "2", "--expect-workers-max-wait", "60"]
    local = locust_generator_args(abtest.parse_args([]))
    assert local[:4] == ["--processes", "-1", "--master-bind-host", "127.0.0.1"], local
    assert local[4] == "--master-bind-port" and local[6] == "--master-port" and local[5] == local[7]
    assert 1024 <= int(local[5]) <= 65535
    assert locust_generator_args(abtest.parse_args(["--processes", "1"])) == []
    for bad, message in ((["--deployed", "--remote-workers", "2"], "go together"),
                         (["--deployed", "--master-bind", "10.0.0.1"], "go together"),
                         (["--remote-workers", "2", "--master-bind", "10.0.0.1"], "needs --deployed"),
                         (["--deployed", "--remote-workers", "2", "--master-bind", "0.0.0.0"], "no authentication"),
                         (["--deployed", "--remote-workers", "1", "--master-bind", "h", "--master-port", "0"],
                          "--master-port")):
        with pytest.raises(SystemExit):
            abtest.parse_args(bad)
        assert message in capsys.readouterr().err, bad


LOG = "".join(line + "\n" for line in (
    '127.0.0.1:1 [23/Nov/2026:12:00:00.500] plone zeoclients/s1 0/0/0/900/930 200 5243262 - - ---- 4/4/3/1/0 0/0 '
    '"GET /Plone/blob-5mb/@@download/file HTTP/1.1"',
    '127.0.0.1:2 [23/Nov/2026:12:00:01.100] plone zeoclients/s1 0/0/0/10/12 200 100 - - ---- 4/4/3/1/0 0/0 '
    '"GET / HTTP/1.1"',
    '127.0.0.1:3 [23/Nov/2026:12:00:01.200] plone zeoclients/s2 0/5/0/30/40 200 100 - - ---- 4/4/3/1/0 0/0 '
    '"GET / HTTP/1.1"',
    '127.0.0.1:4 [23/Nov/2026:12:00:03.300] plone zeoclients/s2 0/0/0/70/90 200 900 - - ---- 4/4/3/1/0 0/0 '
    '"GET /Plone HTTP/1.1"',
    '127.0.0.1:5 [23/Nov/2026:12:00:03.400] stats stats/<STATS> 0/0/0/0/0 200 3409 - - LR-- 1/1/0/0/0 0/0 '
    '"GET /stats;csv HTTP/1.1"',
    '127.0.0.1:6 [23/Nov/2026:12:00:03.500] plone zeoclients/s1 0/0/0/20/25 503 0 - - ---- 4/4/3/1/0 0/0 '
    '"GET / HTTP/1.1"'))


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Tokyo"])
def test_server_time_windows_from_haproxy_log(tmp_path, monkeypatch, zone):
    """HAProxy writes its local time: the windows are the same in any zone, also one behind
    UTC (where reading the log as UTC put every line before the warm-up mark)."""
    import time
    from datetime import datetime

    log = tmp_path / "haproxy.log"
    log.write_text(LOG)
    with monkeypatch.context() as patch:
        patch.setenv("TZ", zone)
        time.tzset()
        try:
            warm = datetime(2026, 11, 23, 12, 0, 1).timestamp()  # 12:00:01 local, as the log's clock
            windows = haproxy_log.server_time_windows(str(log), "zeoclients", warm, 2.0)
        finally:
            patch.undo()
            time.tzset()  # the rest of this process back in the machine's zone
    # the warm-up line, the stats line and the 503 are left out
    assert windows == [
        {"start_s": 0.0, "servers": {"s1": {"/": {"n": 1, "p50_ms": 10.0, "p99_ms": 10.0},
                                            "all": {"n": 1, "p50_ms": 10.0, "p99_ms": 10.0}},
                                     "s2": {"/": {"n": 1, "p50_ms": 30.0, "p99_ms": 30.0},
                                            "all": {"n": 1, "p50_ms": 30.0, "p99_ms": 30.0}}}},
        {"start_s": 2.0, "servers": {"s2": {"/Plone + @json": {"n": 1, "p50_ms": 70.0, "p99_ms": 70.0},
                                            "all": {"n": 1, "p50_ms": 70.0, "p99_ms": 70.0}}}},
    ]
    run = {"kind": "ab", "labels": {"A": "s1", "B": "s2"}, "windows": windows}
    ab = abstats.summarize([run], "ab", ("/", "all"))
    assert ab["/"]["p50_ratio"]["value"] == pytest.approx(10 / 30)
    detected, text = abstats.time_verdict("/", ab, None)
    assert not detected and "0.33× waitress's" in text  # one window: no interval, nothing detected
    assert "; no A/A control)" in text
    # A control run whose windows never had both servers on the path: said, not hidden
    aa = abstats.summarize([dict(run, kind="aa")], "aa", ("/Plone + @json", "all"))
    assert aa["/Plone + @json"]["p50_ratio"] is None
    detected, text = abstats.time_verdict("/Plone + @json", aa, aa)
    assert not detected and text == "/Plone + @json: no server times (no window in which both servers answered it)"
    detected, text = abstats.time_verdict("/", ab, aa)
    assert not detected and "the A/A control has no window in which both answered it" in text


def test_interval_narrows_with_rounds():
    rng = np.random.default_rng(3)
    runs = [_run("ab", rng.poisson(55, 6), rng.poisson(45, 6), round_no=r) for r in range(1, 5)]
    widths = abstats.widths_by_rounds(runs, 4)
    assert widths[4]["ab"]["/Plone"] < widths[1]["ab"]["/Plone"]
    assert widths[1]["aa"] == {}  # no A/A runs: nothing to report


def test_warm_requests_every_locust_path_once_and_names_a_failing_one():
    """abslots.warm: each path of the Locust tests once, with its Accept header, directly
    on the slot's port; a path answered with an error stops it with StackError naming it."""
    from http_stub import answering_server
    from loadtests.ab import abslots
    from loadtests.core.stack import PATHS
    from plonedeploy.stack.errors import StackError

    seen, failing = [], set()

    def answer(request):
        seen.append((request.path, request.headers.get("Accept", "")))
        return (404 if request.path in failing else 200), {}, b"ok"

    with answering_server(answer, keep_alive=True) as url:
        port = int(url.rsplit(":", 1)[1])
        assert abslots.warm(port, timeout=10) >= 0
        assert seen == list(PATHS.values())  # e.g. ("/Plone", "application/json") for @json
        failing.add("/Plone/blob-5mb/@@download/file")
        with pytest.raises(StackError, match=r"warming blob \(http://127.0.0.1:\d+/Plone/blob-5mb"):
            abslots.warm(port, timeout=10)
