"""loadtests.cache.cachebench: its argument checks and its summary, without a stack (the
benchmark itself is run by hand: docs/explanation/edge.md, "Cache")."""
import pytest

from loadtests.cache import cachebench


def run(round_, connections, cache, rps):
    return {"round": round_, "connections": connections, "cache": cache, "rps": rps}


def test_summary_is_the_median_and_range_of_the_per_round_ratios():
    runs = [run(1, 10, "on", 1000.0), run(1, 10, "off", 10.0),
            run(2, 10, "off", 20.0), run(2, 10, "on", 1000.0),
            run(3, 10, "on", 3000.0), run(3, 10, "off", 10.0)]
    summary = cachebench.summarize(runs, [10])[10]
    # ratios per round: 100, 50, 300
    assert summary == {"rps_on": 1000.0, "rps_off": 10.0, "ratio_median": 100.0,
                       "ratio_min": 50.0, "ratio_max": 300.0}


@pytest.mark.parametrize("argv, message", [
    (["--connections", "ten"], "--connections: expected comma-separated integers >= 1"),
    (["--connections", "1", "--threads", "2"], "each count must be at least --threads"),
    (["--rounds", "0"], "--rounds must be a positive integer"),
    (["--path", "Plone"], "--path must start with /"),
])
def test_bad_arguments_exit_2_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        cachebench.parse_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_markdown_lists_every_run_and_the_ratio():
    runs = [dict(run(1, 10, "on", 500.0), p50_ms=1.0, p99_ms=2.0, hit_ratio=1.0, errors=0,
                 cpu_ms_per_request={"haproxy": 0.1}, other_cpu_ms_per_request=0.2),
            dict(run(1, 10, "off", 5.0), p50_ms=100.0, p99_ms=200.0, hit_ratio=None, errors=0,
                 cpu_ms_per_request={"haproxy": 1.0}, other_cpu_ms_per_request=3.0)]
    meta = {"path": "/Plone", "started": "now", "command": "x", "rounds": 1, "duration_s": 1,
            "warmup_s": 0, "threads": 1, "cores": 2, "load_before": "0.1"}
    text = cachebench.markdown(meta, runs, cachebench.summarize(runs, [10]))
    assert "| 10 | 500.0 | 5.0 | 100.0× (100.0–100.0) |" in text
    assert "| 1 | 10 | off | 5.0 | 100.0 | 200.0 | - | 0 | 1.0 | 3.0 |" in text
