"""Figures in README.md, docs/**/*.md and the Makefile's comments that follow from the code.

The rule (issue 30, item 4): a count that follows from the code -- pins, WSGI servers, test
cases, hosts, Prometheus targets, a plan's rounds and runs, an estimate the code computes
without running anything -- is stated in a phrase that this module finds and checks against
the code. A measured figure (a wall time, a rate, what one run saw) carries the date and the
command of its measurement instead and is not checked here; nor is a count that describes a
dated run (e.g. "downloading the 267 files pinned that day").

Each check is a file and a regular expression of the exact phrase. Whitespace is folded (line
breaks do not matter); in the Makefile only its comments are read, without their ``#``. The
phrase must be found: rewording it fails here as well, naming the file and the pattern, so that
a reworded sentence cannot hide a stale figure -- change the pattern with the sentence. Number
words (``four``) count as numbers.

Nothing is built or started: the modules are imported (the checkout and scripts/ by pytest.ini's
pythonpath, the kit's packages installed in .venv), versions.cfg is read with configparser, the parametrized case lists
are counted from the test modules' own ``parametrize`` marks, the tests per marker from this
session's collection (or, when it holds a part of the suite, a ``pytest --collect-only``). No
parts/, bin/ or eggs needed.
"""
import ast
import configparser
import functools
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

import conftest
from conftest import ROOT
from loadtests.ab import abtest
from loadtests.ab.plan import round_plan
from loadtests.matrix import matrix, matrix_plan
from loadtests.weights import SHAPE_NAMES
from plonedeploy.stack import rules

import fetch_eggs  # scripts/ (pytest.ini: pythonpath)

WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
         "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}


def value(text):
    """A matched group as a number when it is one (``4``, ``80.8``, ``four``), else the text."""
    if re.fullmatch(r"\d+", text):
        return int(text)
    if re.fullmatch(r"\d+\.\d+", text):
        return float(text)
    return WORDS.get(text.lower(), text)


def read(*path):
    """The text of a file of the checkout."""
    with open(os.path.join(ROOT, *path), encoding="utf-8") as fp:
        return fp.read()


@functools.cache
def doc(path):
    """The text of ``path`` (relative to the checkout), whitespace folded; of the Makefile
    only its comment lines, without the ``#``."""
    text = read(path)
    if path == "Makefile":
        text = "\n".join(line.strip()[1:] for line in text.splitlines() if line.strip().startswith("#"))
    return re.sub(r"\s+", " ", text)


# -- what the code says -----------------------------------------------------------------------

@functools.cache
def pins():
    """``(pins of versions.cfg, fetched by fetch_eggs, .venv-buildout's)``, counted as
    scripts/fetch_eggs.py counts them."""
    versions = fetch_eggs.read_pins(os.path.join(ROOT, "versions.cfg"))
    own = sum(1 for name in versions if fetch_eggs.canonicalize_name(name) in fetch_eggs.FROM_BUILDOUT_VENV)
    return len(versions), len(versions) - own, own


def pins_split(found):
    """pins.md's row: the total and fetched/own are counted; the split by where an egg comes
    from (buildout.cfg, the other servers, RelStorage) takes a resolution, so only its sum is
    checked: the three parts must add up to the total."""
    total, fetched, own = pins()
    _, build, servers, relstorage, _, _ = found
    assert build + servers + relstorage == total, (
        f"docs/how-to/pins.md: the split {build} + {servers} + {relstorage} of versions.cfg's pins is "
        f"{build + servers + relstorage}, not its {total} pins")
    return total, build, servers, relstorage, fetched, own


def server_seeds():
    """The servers pins.cfg seeds in its ``[servers]`` part: the eggs of every wsgi-server
    value the demo does not use (rules.SERVERS), which must be the same."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read(os.path.join(ROOT, "pins.cfg"))
    seeded = {egg.split("[")[0] for egg in parser["servers"]["eggs"].split()}
    seeded -= {"plonedeploy.recipe", rules.RUNTIME_EGG}
    needed = {egg for server, eggs in rules.SERVERS.items() if server not in ("pyruvate", "waitress")
              for egg in eggs} - {rules.RUNTIME_EGG}
    assert seeded == needed, f"pins.cfg [servers] seeds {sorted(seeded)}, rules.SERVERS needs {sorted(needed)}"
    return len(seeded),


def server_list():
    """rules.SERVERS as prose: ``a, b, ... or z``."""
    names = list(rules.SERVERS)
    return ", ".join(names[:-1]) + " or " + names[-1],


def ansible_servers():
    """``(the recipe's servers, those the Ansible roles deploy)``: zeoclient's validate.yml
    refuses some by name."""
    validate = read("ansible", "roles", "zeoclient", "tasks", "validate.yml")
    refused = set(re.findall(r"selectattr\('wsgi_server', 'equalto', '(\w+)'\)", validate))
    assert refused <= set(rules.SERVERS), refused
    return len(rules.SERVERS), len(rules.SERVERS) - len(refused)


def entry_points():
    """``(recipes, zc.buildout entry points)`` of plonedeploy.recipe's setup.py: ``default``
    is another name of one of them."""
    tree = ast.parse(read("recipes", "plonedeploy.recipe", "setup.py"))
    [points] = [ast.literal_eval(kw.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                for kw in node.keywords if kw.arg == "entry_points"]
    targets = dict(line.replace(" ", "").split("=") for line in points["zc.buildout"])
    assert targets["default"] == targets["instance"], targets
    return len(set(targets.values())), len(targets)


def cases(module, function):
    """How many cases pytest collects from ``module.function``'s one ``parametrize``."""
    test = getattr(__import__(module), function)
    [mark] = [m for m in test.pytestmark if m.name == "parametrize"]
    return len(mark.args[1])


def multihost_hosts():
    """Network namespaces, one per host, of one tests/multihost run: ALL_HOSTS but the
    database hosts of the other storages (zeo1 or db1; app1, lb1, lg1)."""
    import multihost
    databases = {host for host, _ in multihost.STORAGES.values()}
    per_run = len(multihost.ALL_HOSTS) - len(databases) + 1
    assert per_run == len(multihost.HOSTS), (per_run, multihost.HOSTS)
    return per_run,


def prometheus_targets():
    from ansible_deploy import PROMETHEUS_TARGETS
    return len(PROMETHEUS_TARGETS),


def alert_rules():
    alerts = read("ansible", "roles", "monitoring", "templates", "alerts.yml.j2")
    return len(re.findall(r"^\s*- alert: ", alerts, re.MULTILINE)),


@functools.cache
def ab(variable):
    """``(rounds, warm-up s, measured s, runs)`` of the Makefile's AB_ARGS or DEMO_AB_ARGS,
    through abtest's own parser and round plan; every round also an A/A control."""
    args = abtest.parse_args(makefile_variable(variable).split())
    plan = round_plan(args)
    assert args.control and sorted(kind for _, kind, *_ in plan) == ["aa"] * args.rounds + ["ab"] * args.rounds, plan
    warmup = int(args.warmup) if float(args.warmup).is_integer() else args.warmup
    return args.rounds, warmup, args.duration, len(plan)


def makefile_variable(variable):
    """The default (``?=``) of a Makefile variable."""
    return re.search(rf"^{variable} \?= (.*)$", read("Makefile"), re.MULTILINE).group(1)


@functools.cache
def matrix_plan_of(*argv):
    """``(cells, runs, runs per cell, parts, servers, estimated minutes to 0.1)`` of
    ``python -m loadtests matrix ARGV``, as its ``--estimate`` prints it."""
    args = matrix.parse_args(list(argv))
    cells, pairs, order = matrix.plan(args)
    minutes = matrix_plan.estimate_seconds(order, len(pairs), args.duration, args.warmup, args.drain_max,
                                           args.requests_per_connection, args.max_duration) / 60
    return len(cells), len(order), args.runs, len(pairs), len(args.servers), round(minutes, 1)


def quick_matrix():
    args = matrix.parse_args(["--quick"])
    first, second = args.servers
    low, high = args.connections
    return first, second, low, high, matrix_plan_of("--quick")[-1]


def suite_counts():
    """conftest.marker_counts of the whole suite: of this session's collection when it is the
    whole suite (every tests/test_*.py module, nothing deselected: ``make test``), else of a
    ``pytest --collect-only`` of ``tests/`` (about 15 s)."""
    modules = {name for name in os.listdir(os.path.join(ROOT, "tests")) if re.fullmatch(r"test_.*\.py", name)}
    if not conftest.DESELECTED and {item.path.name for item in conftest.COLLECTED} == modules:
        return conftest.marker_counts(conftest.COLLECTED)
    with tempfile.NamedTemporaryFile(suffix=".json") as counts:
        subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                       cwd=ROOT, env={**os.environ, "PLONEDEPLOY_MARKER_COUNTS": counts.name},
                       check=True, capture_output=True, timeout=300)
        return json.load(counts)


# -- the phrases --------------------------------------------------------------------------------

#: ``(file, pattern, truth)``: every match of ``pattern`` in ``file`` must have groups equal to
#: ``truth()`` (a tuple), or to ``truth(found)`` when it takes the found values.
CLAIMS = [
    # Pins: scripts/fetch_eggs.py counts versions.cfg's pins, those of .venv-buildout apart.
    ("docs/tutorial/first-deploy.md", r"all (\d+) pins of `versions.cfg`; fetch_eggs fetches (\d+) of them, "
     r"the other (\d+) run buildout itself from `.venv-buildout`", pins),
    ("docs/how-to/pins.md", r"\| `versions.cfg` \| (\d+) pins in `\[versions\]`: every egg of `buildout.cfg` "
     r"\((\d+):[^|]*?\((\d+) more: \[reference/servers.md\][^|]*?\((\d+) more: \[how-to/relstorage.md\][^|]*?"
     r"`scripts/fetch_eggs.py` fetches (\d+) of them, the other (\d+) run buildout itself from `.venv-buildout`",
     pins_split),
    ("docs/how-to/pins.md", r"`pins.cfg` seeds the (\w+) servers and resolves them in its `\[servers\]` part",
     server_seeds),
    # The recipe's WSGI servers (rules.SERVERS) and its entry points.
    ("README.md", r"ZEO client on ((?:\w+, )+\w+ or \w+);", server_list),
    ("docs/reference/recipe.md", r"wsgi-server = 'tornado' is invalid: expected one of: ((?:\w+, )+\w+)\b",
     lambda: (", ".join(rules.SERVERS),)),
    ("docs/how-to/ansible.md", r"must be one of: ((?:\w+, )+\w+), got: tornado", lambda: (", ".join(rules.SERVERS),)),
    ("docs/how-to/ansible.md", r"any of the recipe's (\w+) but mod_wsgi, (\w+) \(", ansible_servers),
    ("docs/how-to/benchmarks.md", r"With mod_wsgi, (\d+) servers: (\d+) cells, (\d+) runs, (\d+\.\d) minutes estimated",
     lambda: (matrix_plan_of()[4], *matrix_plan_of()[:2], matrix_plan_of()[5])),
    ("docs/reference/recipe.md", r"with (\w+) recipes \((\w+) `zc.buildout` entry points: `default` is `instance`\)",
     entry_points),
    # The cases of "bad configuration is refused" (docs/how-to/operate.md, promise 6).
    ("docs/how-to/operate.md", r"tests/test_recipe_buildout.py \(`BAD`, (\d+) cases\)",
     lambda: (cases("test_recipe_buildout", "test_bad_option_fails_buildout_with_named_error"),)),
    ("docs/how-to/operate.md", r"tests/test_ansible.py \(`BAD`, (\d+) cases; `DATABASE_BAD`, (\d+) cases; "
     r"`LOADGENERATOR_BAD`, (\d+) cases\)",
     lambda: tuple(len(getattr(__import__("test_ansible"), name))
                   for name in ("BAD", "DATABASE_BAD", "LOADGENERATOR_BAD"))),
    # make multihost: the hosts of tests/multihost (common.py), one network namespace each.
    ("Makefile", r"multihost \(Ansible over SSH into (\w+) network namespaces\)", multihost_hosts),
    ("docs/tutorial/first-deploy.md", r"Ansible over SSH into (\w+) network namespaces", multihost_hosts),
    ("docs/how-to/ansible.md", r"creates a bridge and (\w+) network namespaces", multihost_hosts),
    # The Ansible converge's monitoring (tests/ansible_deploy.py, the monitoring role).
    ("docs/how-to/ansible.md", r"Prometheus \(18190\) reports its (\w+) targets up", prometheus_targets),
    ("docs/how-to/ansible.md", r"has loaded the (\w+) alert rules", alert_rules),
    # The A/B of make demo (DEMO_AB_ARGS) and make ab (AB_ARGS), through abtest's parser.
    ("Makefile", r"A/B load test \(DEMO_AB_ARGS: (\d+) rounds, each an A/B and an A/A control run of (\d+) s "
     r"warm-up \+ (\d+) s measured\)", lambda: ab("DEMO_AB_ARGS")[:3]),
    ("Makefile", r"make demo: (\d+) rounds of (\d+) s", lambda: (ab("DEMO_AB_ARGS")[0], ab("DEMO_AB_ARGS")[2])),
    ("Makefile", r"make ab: (\d+) rounds with swapped slots, each also as A/A control", lambda: ab("AB_ARGS")[:1]),
    ("README.md", r"make demo # the main job: [^#]*?A/B in (\d+) rounds", lambda: ab("DEMO_AB_ARGS")[:1]),
    ("docs/tutorial/first-deploy.md", r"make demo # the main job: [^#]*?A/B in (\d+) rounds",
     lambda: ab("DEMO_AB_ARGS")[:1]),
    ("docs/tutorial/first-deploy.md", r"(\d+) rounds in which pyruvate and waitress swap ZEO client slots "
     r"\(port and place in HAProxy's list\), each also as an A/A control, (\d+) s warm-up \+ (\d+) s measured per run",
     lambda: ab("DEMO_AB_ARGS")[:3]),
    ("docs/tutorial/first-deploy.md", r"make ab # the A/B: (\d+) rounds with swapped slots \+ A/A control",
     lambda: ab("AB_ARGS")[:1]),
    ("docs/tutorial/ab-report.md", r"make ab # (\d+) rounds with swapped slots \+ A/A control",
     lambda: ab("AB_ARGS")[:1]),
    ("docs/tutorial/ab-report.md", r"runs `DEMO_AB_ARGS` \((\d+) rounds of (\d+) s with control",
     lambda: (ab("DEMO_AB_ARGS")[0], ab("DEMO_AB_ARGS")[2])),
    ("docs/tutorial/ab-report.md", r"runs `AB_ARGS` \((\d+) rounds of (\d+) s with control",
     lambda: (ab("AB_ARGS")[0], ab("AB_ARGS")[2])),
    ("docs/results.md", r"The default `make ab` \(`([^`]+)`, (\d+) runs,",
     lambda: (makefile_variable("AB_ARGS"), ab("AB_ARGS")[3])),
    # The benchmark matrix's plan and estimate (loadtests.matrix.matrix, matrix_plan; no run needed).
    ("docs/tutorial/first-deploy.md",
     r"make matrix # [^#]*?\(estimated (\d+\.\d) min; MATRIX_ARGS=--quick: (\d+\.\d) min\)",
     lambda: (matrix_plan_of()[5], matrix_plan_of("--quick")[5])),
    ("docs/how-to/benchmarks.md", r"make matrix # full run \(estimated (\d+\.\d) min\)", lambda: matrix_plan_of()[5:]),
    ("docs/how-to/benchmarks.md",
     r"matrix --quick # CI: (\w+), (\w+), (\d+) and (\d+) connections \(estimated (\d+\.\d) min\)", quick_matrix),
    ("docs/how-to/benchmarks.md",
     r"Default: (\d+) cells, (\d+) runs \((\d+) per cell\), (\d+) parts \((\d+) servers since mod_wsgi",
     lambda: matrix_plan_of()[:5]),
    ("docs/reference/loadtests.md", r"The (\w+) subcommands are the matrix with other defaults",
     lambda: (len(matrix.PRESETS),)),
    # The Locust traffic shapes.
    ("README.md", r"`locustfile.py` \((\w+) traffic shapes\)", lambda: (len(SHAPE_NAMES),)),
    # The suite's tests by marker (tests/conftest.py's SUITE_MARKERS).
    ("docs/how-to/testing.md", r"\| tests \(of (\d+)\) \|" + r"".join(
        rf".*?\| {name} \|[^|]*\|[^|]*\| (\d+) \|"
        for name in (r"\*\(none\)\*", *(f"`{marker}`" for marker in conftest.SUITE_MARKERS))),
     lambda: tuple(suite_counts()[key] for key in ("total", "none", *conftest.SUITE_MARKERS))),
]


@pytest.mark.parametrize("path, pattern, truth", CLAIMS, ids=[f"{p}:{i}" for i, (p, _, _) in enumerate(CLAIMS)])
def test_figure_follows_the_code(path, pattern, truth):
    matches = list(re.finditer(pattern, doc(path)))
    assert matches, (f"{path}: no phrase matches {pattern!r}. If the sentence was reworded, change the "
                     "pattern in tests/test_doc_figures.py with it; if it was removed, remove the check.")
    for match in matches:
        found = tuple(value(group) for group in match.groups())
        true = truth(found) if inspect.signature(truth).parameters else truth()
        assert found == tuple(true), (f"{path}: {match.group(0)!r} states {found}; the code says {tuple(true)} "
                                      f"(pattern {pattern!r})")
