"""Shared fixtures: paths of this checkout, and the running stack for integration tests."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE_SRC = os.path.join(ROOT, "recipes", "plonedeploy.recipe", "src")
for path in (ROOT, RECIPE_SRC):
    if path not in sys.path:
        sys.path.insert(0, path)


def run(cmd, timeout, check=True, cwd_override=None, **kwargs):
    """Run ``cmd`` in the checkout (or ``cwd_override``); return CompletedProcess (text).

    Fails the test with the command's output when it exits non-zero and ``check`` is true.
    """
    result = subprocess.run(cmd, cwd=cwd_override or ROOT, capture_output=True, text=True,
                            timeout=timeout, check=False, **kwargs)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result
