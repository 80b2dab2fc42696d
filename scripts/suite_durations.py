"""Where a test run's time went: seconds per xdist group, per module and the slowest tests.

Reads the JUnit XML file pytest writes with ``--junitxml`` and prints three Markdown tables
(the ones in docs/how-to/testing.md, "Where the time goes")::

    make test PYTEST_ARGS="--junitxml=var/junit.xml"
    .venv/bin/python scripts/suite_durations.py var/junit.xml [--top 15]

A test case's ``time`` is pytest's default ``junit_duration_report = total``: setup, call and
teardown, in seconds, so a session fixture's setup (``stack``, ``deployed``) counts in the
first test that uses it. The group is the ``@stack``/``@deploy`` suffix pytest-xdist's
``--dist loadgroup`` gives a node id (tests/conftest.py's ``xdist_group``; "-" without one).
The groups run side by side, so the run's wall time is about the longer group's sum, not
the sum of both. Exit status 2 with a message when the file is missing or holds no test
case.
"""
import argparse
import collections
import sys
import xml.etree.ElementTree as ET


def cases(path):
    """``[(seconds, group, module, test name)]`` of every test case in the JUnit XML ``path``.

    Raises OSError for an unreadable file and ``xml.etree.ElementTree.ParseError`` for one
    that is not XML."""
    found = []
    for case in ET.parse(path).iter("testcase"):
        name = case.get("name", "")
        test, _, group = name.rpartition("@") if "@" in name else (name, "", "-")
        module = case.get("classname", "").rpartition(".")[2]
        found.append((float(case.get("time") or 0.0), group, module, test))
    return found


def tables(found, top=15):
    """The three Markdown tables (a str) of ``found`` (:func:`cases`' list)."""
    groups, modules = collections.Counter(), collections.Counter()
    counts = collections.Counter()
    for seconds, group, module, _ in found:
        groups[group] += seconds
        modules[(group, module)] += seconds
        counts[group] += 1
    lines = ["| group | tests | seconds |", "|---|---:|---:|"]
    lines += [f"| {group} | {counts[group]} | {seconds:,.0f} |" for group, seconds in groups.most_common()]
    lines += ["", "| module | group | seconds |", "|---|---|---:|"]
    lines += [f"| {module} | {group} | {seconds:,.0f} |" for (group, module), seconds in modules.most_common(top)]
    lines += ["", "| test | group | seconds |", "|---|---|---:|"]
    lines += [f"| {module}::{test} | {group} | {seconds:,.0f} |"
              for seconds, group, module, test in sorted(found, reverse=True)[:top]]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", help="the JUnit XML file of a pytest run (--junitxml)")
    parser.add_argument("--top", type=int, default=15, help="modules and tests listed (default 15)")
    args = parser.parse_args(argv)
    try:
        found = cases(args.junit)
    except (OSError, ET.ParseError) as exc:
        parser.exit(2, f"suite_durations: cannot read {args.junit}: {exc}\n")
    if not found:
        parser.exit(2, f"suite_durations: {args.junit} holds no test case\n")
    print(tables(found, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
