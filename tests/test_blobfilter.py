"""Unit tests of the ``blobsendfile`` WSGI filter (``plonedeploy.runtime.blobfilter``).

Most of them need the real classes of the client's eggs (plone.namedfile's
``filestream_range_iterator``, Zope's ``filestream_iterator``, pyruvate's ``FileWrapper``,
waitress' ``ReadOnlyFileBasedBuffer``), which this venv does not have: they are the checks of
``tests/client/blobfilter_checks.py``, run once in the ZEO client's own interpreter
(``parts/instance/bin/interpreter``, so they need ``make build``; as root it runs them as the
service user), on real files, with a server ``wsgi.file_wrapper`` that records what it was
given (the standard library's ``wsgiref.util.FileWrapper``). Here, one test per check asserts
that it passed, and one that every check of ``CHECKS`` ran. Without a build they are skipped,
and fail in CI (tests/unavailable.py).

The tests that need no egg run here, with the script's helpers.
"""
import json
import os
import subprocess
import sys

import pytest

from client.blobfilter_checks import Recorder, call
from conftest import ROOT
from plonedeploy.runtime import blobfilter
from unavailable import unavailable

INTERPRETER = os.path.join(ROOT, "parts", "instance", "bin", "interpreter")
SCRIPT = os.path.join(ROOT, "tests", "client", "blobfilter_checks.py")

#: The checks of SCRIPT, every one of which must run and pass (one that disappears fails
#: ``test_every_check_ran``).
CHECKS = [
    "whole_file_reaches_the_wrapper_as_its_file",
    "iterator_returned_without_wrapper_is_handed_over",
    "if_range_and_multi_range_answers_are_whole_files",
    *(f"other_responses_take_the_normal_path[{case}]" for case in (
        "range 206", "range from 0, 206", "head", "length differs", "no length", "gzip",
        "position moved", "closed file", "error status")),
    "zope_filestream_iterator_is_left_alone",
    "bytes_bodies_and_no_file_wrapper_pass_through",
    "wrapper_called_before_start_response_is_normal",
    "middleware_that_wraps_the_iterable_gets_the_normal_path",
    "disabled_filter_and_factory",
    "pyruvate_gets_a_descriptor_only_with_the_filter",
    "pyruvate_wrapper_behind_a_wrapping_middleware_still_ends",
    "waitress_streams_the_file_only_with_the_filter",
    "no_descriptor_leak",
    "debug_log_line",
]


@pytest.fixture(scope="module")
def client_results():
    """``{check name: "ok" or its traceback}``: SCRIPT run once in the client's interpreter."""
    if not os.path.exists(INTERPRETER):
        unavailable("parts/instance/bin/interpreter missing (the checks run in the ZEO client's "
                    "interpreter, with its eggs): run 'make build'")
    command = [INTERPRETER, SCRIPT]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(command)} did not end within 120 s:\n{exc.stdout}\n{exc.stderr}")
    if result.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr}\n{result.stdout}")
    lines = result.stdout.strip().splitlines()
    try:
        results = json.loads(lines[-1])  # the last line; the checks' own output went to stderr
    except (IndexError, ValueError):
        results = None
    if not isinstance(results, dict):
        pytest.fail(f"{' '.join(command)} printed no JSON object:\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return results


def test_every_check_ran(client_results):
    assert len(set(CHECKS)) == len(CHECKS)
    assert set(client_results) == set(CHECKS)


@pytest.mark.parametrize("name", CHECKS)
def test_check_in_client(client_results, name):
    assert name in client_results, f"{SCRIPT} ran no check {name!r}"
    assert client_results[name] == "ok", f"{name} failed in the client's interpreter:\n{client_results[name]}"


# ------------------------------------------------------------------------- no egg needed

def test_start_response_exc_info_is_passed_on():
    def app(environ, start_response):
        try:
            raise ValueError("boom")
        except ValueError:
            start_response("500 Internal Server Error", [("Content-Length", "0")], sys.exc_info())
        return [b""]

    status, _, body, _ = call(blobfilter.BlobSendfile(app), Recorder())
    assert status.startswith("500") and body == b""
