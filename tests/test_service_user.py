"""[stack] service-user: bin/stack started as root runs the ZEO server and the ZEO clients
as an unprivileged user (docs/operations.md, "Users"); without it, as root, it warns.

The session's stack is built without the option for now (make build's SERVICE_USER is
empty: a ZEO client run as root, create_site's bin/instance run, writes blobs the ZEO
server run as the service user cannot chmod; issue 26), so the checks of the running
processes are not here yet; the ACL grant is tested in tests/test_options.py and
tests/test_runners.py, the refused values in tests/test_recipe_buildout.py (BAD).
"""
import json
import os
import subprocess

import pytest

from conftest import ROOT


def test_root_without_service_user_is_warned(tmp_path):
    """bin/stack start as root on a build without service-user says so on stderr, naming
    the option (a stack of no processes: nothing is started)."""
    from plonedeploy.recipe import stack as stack_module

    if os.geteuid() != 0:
        pytest.fail("runs as root only (the warning is root's)")
    config = tmp_path / "stack.json"
    config.write_text(json.dumps({"part": "stack", "processes": [], "service": None}))
    result = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "python"), "-c",
         "import sys; from plonedeploy.recipe.stack import main; sys.exit(main(sys.argv[1], ['start', '--no-wait-up']))",
         str(config)], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(
            os.path.join(ROOT, "recipes", name, "src") for name in ("plonedeploy.recipe", "plonedeploy.runtime"))))
    assert result.returncode == 0, result.stderr
    assert "[stack] service-user" in result.stderr and "run as root" in result.stderr, result.stderr
    assert stack_module.ROOT_WARNING.format(part="stack") in result.stderr
