"""loadtests.blobbench without measuring: options, the extra buildout, the summary rules."""
import configparser
import subprocess
import sys

import pytest

from conftest import ROOT
from loadtests import blobbench, offclients


def test_help():
    result = subprocess.run([sys.executable, "-m", "loadtests.blobbench", "--help"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0
    assert "--fd-downloads" in result.stdout and "--variants" in result.stdout


@pytest.mark.parametrize("argv", [["--variants", "nginx-on"], ["--variants", "pyruvate-maybe"],
                                  ["--connections", "0"], ["--connections", "a,b"], ["--rounds", "0"]])
def test_bad_options(argv):
    with pytest.raises(SystemExit) as exc:
        blobbench.parse_args(argv)
    assert exc.value.code == 2


def test_extra_buildout_config():
    text = offclients.buildout_config(blobbench.WORK_DIR, "/x/local.cfg", ["instance", "client2"],
                                      {"instance": 9183, "client2": 9184}, ("haproxy", 9185, 9186))
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(text)
    assert cfg["buildout"]["extends"] == "/x/local.cfg"
    assert cfg["buildout"]["directory"] == ROOT  # the stack's blob storage and logs
    assert cfg["buildout"]["installed"].startswith(blobbench.WORK_DIR)  # not the stack's .installed.cfg
    assert cfg["buildout"]["parts"].split() == ["instance-off", "client2-off", "haproxy-off"]
    assert ("[instance-off]\n<= instance\nblob-sendfile = off\nhttp-address = 127.0.0.1:9183\n"
            "metrics-address =\n") in text
    assert cfg["haproxy-off"]["backends"] == "instance-off client2-off"
    assert cfg["haproxy-off"]["bind"] == "127.0.0.1:9185"
    assert cfg["haproxy-off"]["run-directory"].startswith(blobbench.WORK_DIR)  # own admin socket


def _run(variant, req_s, foreign):
    return {"variant": variant, "server": variant.split("-")[0], "sendfile": variant.endswith("-on"),
            "connections": 2, "req_s": req_s, "gb_s": req_s * blobbench.BLOB_SIZE / 1e9, "p50_ms": 10.0,
            "p99_ms": 20.0, "server_cpu_ms_per_req": 5.0, "foreign_cores": foreign, "errors": 0}


def test_summary_uses_quiet_runs_and_ratios():
    runs = [_run("pyruvate-on", 200, 0.0), _run("pyruvate-on", 210, 0.1), _run("pyruvate-on", 60, 1.5),
            _run("pyruvate-off", 100, 1.2), _run("pyruvate-off", 80, 1.6)]
    summary = {s["variant"]: s for s in blobbench.summarize(runs, 0.5)}
    assert summary["pyruvate-on"]["req_s"] == 205.0  # the busy run is left out
    assert (summary["pyruvate-on"]["quiet_runs"], summary["pyruvate-on"]["runs"]) == (2, 3)
    assert summary["pyruvate-off"]["req_s"] == 90.0  # no quiet run: all of them
    assert summary["pyruvate-off"]["quiet_runs"] == 0
    (row,) = blobbench.ratios(list(summary.values()))
    assert row == {"connections": 2, "pyruvate on/off": round(205 / 90, 2)}
