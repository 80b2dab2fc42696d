"""loadtests.scaling on the real stack: extra ZEO clients, a temporary HAProxy per cell.

Checks the mechanism, not the speed: with 2 clients both get traffic, every cell answers
without errors, the report files exist, and no client or balancer is left running.
"""
import json
import sys

import psutil
import pytest

from conftest import run

pytestmark = pytest.mark.integration


def test_scaling_two_clients(stack, tmp_path):
    before = {p.pid for p in psutil.process_iter()}
    result = run([sys.executable, "-m", "loadtests.scaling", "--clients", "1,2", "--threads", "1",
                  "--duration", "4", "--connections", "8", "--build", str(tmp_path / "build"),
                  "--port", "8600", "--out", str(tmp_path / "out")], timeout=600)
    (folder,) = list((tmp_path / "out").iterdir())
    for name in ("report.json", "report.md", "scaling.png"):
        assert (folder / name).stat().st_size > 0, name
    data = json.loads((folder / "report.json").read_text())
    rows = {(r["threads"], r["clients"]): r for r in data["rows"]}
    assert set(rows) == {(1, 1), (1, 2)}
    assert all(r["errors"] == 0 and r["rps"] > 0 for r in rows.values()), rows
    assert rows[(1, 1)]["ratio_to_one_client"] == 1.0
    two = next(c for c in data["cells"] if c["clients"] == 2)
    assert set(two["share"]) == {"s1_1", "s1_2"} and min(two["share"].values()) > 0.2, two
    print("\n" + result.stdout[-800:])
    # clients and temporary HAProxys stopped by PID
    left = [p for p in psutil.process_iter(["pid", "cmdline"])
            if p.info["pid"] not in before and str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not left, left
