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


def run(cmd, timeout, check=True, **kwargs):
    """Run ``cmd`` in the checkout; return CompletedProcess (text); fail the test on error."""
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                            check=False, **kwargs)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result
