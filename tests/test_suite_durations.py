"""scripts/suite_durations.py: the tables of docs/how-to/testing.md, "Where the time goes"."""
import os
import subprocess
import sys

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "suite_durations.py")

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_ansible" name="test_converge@deploy" time="481.5"/>
<testcase classname="tests.test_ansible" name="test_bad[zeoclient_clients-0]@deploy" time="212.0"/>
<testcase classname="tests.test_matrix" name="test_quick@stack" time="269.2"/>
<testcase classname="tests.test_core" name="test_unit" time="0.4"/>
</testsuite></testsuites>
"""


def durations(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_groups_modules_and_slowest_tests_from_junit_xml(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    result = durations(str(tmp_path / "junit.xml"), "--top", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # groups by their sums, largest first; a test without a group counts as "-"
    assert lines[2:5] == ["| deploy | 2 | 694 |", "| stack | 1 | 269 |", "| - | 1 | 0 |"]
    assert "| test_ansible | deploy | 694 |" in lines and "| test_core | - | 0 |" not in lines  # --top 2
    assert lines[-2:] == ["| test_ansible::test_converge | deploy | 482 |", "| test_matrix::test_quick | stack | 269 |"]


def test_a_missing_or_empty_file_is_an_error_naming_it(tmp_path):
    missing = durations(str(tmp_path / "none.xml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "none.xml" in missing.stderr
    (tmp_path / "empty.xml").write_text("<testsuites/>")
    empty = durations(str(tmp_path / "empty.xml"))
    assert empty.returncode == 2 and "holds no test case" in empty.stderr
