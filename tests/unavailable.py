"""What a test does when this machine lacks what it needs (a tool, a permission): skip on a
developer's machine, fail in CI (``CI=true``), where every test must run. A skip there would
leave a promise untested while the run stays green."""
import os

import pytest


def in_ci():
    """True when the environment says CI (``CI=true``, as GitHub Actions and GitLab set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def unavailable(reason):
    """Skip the calling test for ``reason``; in CI fail it instead, saying so."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a test that cannot run in CI fails instead of skipping)")
    pytest.skip(reason)
