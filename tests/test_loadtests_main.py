"""The entry point ``python -m loadtests <subcommand>``: it lists every subcommand and hands
each one its own arguments, --help included."""
import subprocess
import sys

import pytest

from conftest import ROOT
from loadtests.__main__ import SUBCOMMANDS


def _run(*args):
    return subprocess.run([sys.executable, "-m", "loadtests", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_help_lists_every_subcommand_on_one_line():
    result = _run("--help")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    names = ["ab", "connections", "fairness", "blob", "matrix", "scaling", "cache", "attacks",
             "servers-wrk", "headline", "filters", "storage", "conflicts", "canary-judge", "canary-deploy",
             "canary-bench", "soak"]
    for name in names:
        assert any(line.split()[:1] == [name] and len(line.split()) > 1 for line in lines), name
    assert set(SUBCOMMANDS) == set(names)


@pytest.mark.parametrize("args", [["no-such-tool"], []])
def test_unknown_or_missing_subcommand_exits_2(args):
    result = _run(*args)
    assert result.returncode == 2
    assert "usage: python -m loadtests" in result.stderr


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_subcommand_shows_its_modules_help(name):
    result = _run(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python -m loadtests {name} ")


def test_the_subcommand_gets_its_arguments_untouched():
    # an option of the module (not of the entry point) reaches the module's parser
    result = _run("connections", "--paths", "nowhere")
    assert result.returncode == 2
    assert "--paths: nowhere not allowed" in result.stderr


# The old module commands (docs/reference/loadtests.md, "Old names"): top-level aliases or the packages'
# __main__ since the subcommands moved into packages of their own; one option each.
OLD_NAMES = {"abtest": "--users", "connections": "--connections", "fairness": "--connections",
             "matrix": "--servers", "cachebench": "--connections", "attacks": "--slow-connections",
             "headline": "--rounds", "storagebench": "--variants", "conflicts": "--server-log"}


def test_old_module_names_still_work():
    for module, option in OLD_NAMES.items():
        result = subprocess.run([sys.executable, "-m", f"loadtests.{module}", "--help"], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and option in result.stdout, (module, result.stderr)
