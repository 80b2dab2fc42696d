"""loadtests.headline.filtercost (``python -m loadtests filters``): the summary and report from
given seconds, then one short real run in the built client's interpreter (needs ``make build``'s
parts/instance; no stack)."""
import json
import sys

from conftest import run
from loadtests.headline import filtercost


def test_costs_are_differences_per_round_not_of_medians():
    seconds = {"app": [1e-6, 2e-6, 1e-6], "metrics": [11e-6, 14e-6, 16e-6], "stock": [50e-6, 60e-6, 55e-6],
               "kit": [70e-6, 90e-6, 70e-6]}
    chains, costs = filtercost.summarize(seconds)
    assert chains["metrics"] == {"median": 14.0, "min": 11.0, "max": 16.0}
    # per round 10, 12, 15 (the medians' difference would be 14 - 1 = 13)
    assert costs["metrics"] == {"median": 12.0, "min": 10.0, "max": 15.0}
    assert costs["kit - stock"] == {"median": 20.0, "min": 15.0, "max": 30.0}
    assert "translogger" not in costs  # not measured: no cost
    text = filtercost.to_markdown({"started": "s", "command": "c", "client": "instance", "python": "3.11.2",
                                   "requests": 20000, "rounds": 3, "cores": 2, "load_before": [0.1],
                                   "load_after": [0.2]}, chains, costs)
    assert "| metrics | 12.0 (10.0–15.0) |" in text and "| kit - stock | 20.0 (15.0–30.0) |" in text
    assert "20,000 requests per chain and round, 3 rounds" in text


def test_a_pairs_cost_beyond_its_parts_per_round():
    """Each PAIRS chain's cost beyond its two parts, (pair - app) - (outer - app) - (inner - app) in
    each round; the controls' costs like the filters'."""
    seconds = {"app": [1e-6, 1e-6], "noop": [2e-6, 3e-6], "translogger": [30e-6, 40e-6],
               "noop+translogger": [41e-6, 44e-6]}
    chains, costs = filtercost.summarize(seconds)
    assert costs["noop"] == {"median": 1.5, "min": 1.0, "max": 2.0}
    assert costs["noop+translogger"] == {"median": 41.5, "min": 40.0, "max": 43.0}
    # per round 41 - 2 - 30 + 1 = 10 and 44 - 3 - 40 + 1 = 2
    assert costs["noop+translogger - noop - translogger"] == {"median": 6.0, "min": 2.0, "max": 10.0}
    assert "metrics+translogger - metrics - translogger" not in costs  # its chains not measured


def test_short_run_in_the_clients_interpreter(tmp_path):
    """Every chain timed in every round (the controls and pairs too), each filter's, control's
    and pair's cost, each pair's beyond its parts and kit - stock reported; a client that is not
    built exits 2 naming make build."""
    result = run([sys.executable, "-m", "loadtests", "filters", "--requests", "300", "--rounds", "2",
                  "--out", str(tmp_path)], timeout=300)
    (folder,) = list(tmp_path.iterdir())
    data = json.loads((folder / "report.json").read_text())
    chains = {"app", *filtercost.FILTERS, *filtercost.CONTROLS, *filtercost.PAIRS, *filtercost.PIPELINES}
    assert set(data["seconds"]) == chains and all(len(v) == 2 and min(v) > 0 for v in data["seconds"].values())
    assert {"noop", "translogger(log off)", "noop+translogger", "metrics+translogger(log off)"} <= chains
    beyond = {"metrics+translogger - metrics - translogger", "noop+translogger - noop - translogger",
              "metrics+translogger(log off) - metrics - translogger(log off)"}
    assert set(data["costs"]) == {*filtercost.FILTERS, *filtercost.CONTROLS, *filtercost.PAIRS, *beyond,
                                  "kit - stock"}
    assert "µs each filter adds" in result.stdout and "| noop+translogger - noop - translogger |" in result.stdout
    missing = run([sys.executable, "-m", "loadtests", "filters", "--client", "no-such-part", "--out", str(tmp_path)],
                  timeout=60, check=False)
    assert missing.returncode == 2 and "make build" in missing.stderr
