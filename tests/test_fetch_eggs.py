"""scripts/fetch_eggs.py installs wheels with ``installer`` in-process instead of one ``pip
install -t`` process per wheel (buildout 6's way): the eggs must be the ones pip makes.

Runs buildout's own wheel-to-egg step (``zc.buildout.easy_install._move_to_eggs_dir_and_compile``)
with and without the in-process hook in .venv-buildout's Python, like ``make build``, on
wheels of this checkout's download cache (``make build`` fills it).
"""
import glob
import os
import subprocess
import sys

import pytest

import fetch_eggs  # scripts/ (pytest.ini: pythonpath)
from conftest import ROOT

DIST = os.path.join(ROOT, "var", "download-cache", "dist")
BUILDOUT_PYTHON = os.path.join(ROOT, ".venv-buildout", "bin", "python")
#: pip's record of how it was asked (REQUESTED, direct_url.json) and the file list with
#: hashes (RECORD, whose order and script paths differ), not part of the package.
PIP_ONLY = {"REQUESTED", "direct_url.json", "RECORD"}
#: A platform wheel with C headers (persistent), one with console scripts (ZEO), a
#: native namespace package (plone.app.layout).
WHEELS = ("persistent-6.9-*.whl", "zeo-6.2-*.whl", "plone_app_layout-6.0.2-*.whl")

#: argv: eggs directory, "hook" or "pip", wheels...; prints each egg's path.
TO_EGGS = """
import os, sys
import fetch_eggs
import zc.buildout.easy_install as ez
from zc.buildout._package_index import distros_for_location
dest, mode, wheels = sys.argv[1], sys.argv[2], sys.argv[3:]
if mode == "hook":
    ran = []
    def no_subprocess(args, **kw):
        ran.append(args)
        return ""
    ez.get_subprocess_output = fetch_eggs._pip_wheel_installs_in_process(no_subprocess)
for wheel in wheels:
    (dist,) = distros_for_location(wheel, os.path.basename(wheel))
    print(ez._move_to_eggs_dir_and_compile(dist, dest).location)
if mode == "hook":
    assert ran == [], ran
"""


def _tree(root):
    """``{relative path: bytes}`` of the files under root; bytecode by name only (it
    embeds the source's mtime), pip's own metadata left out."""
    files = {}
    for directory, _, names in os.walk(root):
        for name in names:
            if name in PIP_ONLY:
                continue
            path = os.path.join(directory, name)
            files[os.path.relpath(path, root)] = b"" if name.endswith(".pyc") else open(path, "rb").read()
    return files


def _to_eggs(dest, mode, wheels):
    # scripts/fetch_eggs.py importable by that Python: through its environment, not its code
    result = subprocess.run([BUILDOUT_PYTHON, "-c", TO_EGGS, str(dest), mode, *wheels],
                            env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "scripts")),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.split()


def test_eggs_from_installer_are_the_eggs_from_pip(tmp_path):
    wheels = []
    for pattern in WHEELS:
        found = glob.glob(os.path.join(DIST, pattern))
        if not found:
            pytest.fail(f"{pattern} not in {DIST}: run make build first")
        wheels.append(found[0])
    # Several wheels in one process: buildout appends --no-python-version-warning after
    # the wheel from its second pip call on; the hook must still take it.
    by_pip = _to_eggs(tmp_path / "pip", "pip", wheels)
    by_hook = _to_eggs(tmp_path / "hook", "hook", wheels)
    assert [os.path.basename(p) for p in by_hook] == [os.path.basename(p) for p in by_pip]
    for pip_egg, hook_egg in zip(by_pip, by_hook):
        pip_tree, hook_tree = _tree(pip_egg), _tree(hook_egg)
        assert sorted(hook_tree) == sorted(pip_tree), os.path.basename(pip_egg)
        assert [rel for rel in pip_tree if pip_tree[rel] != hook_tree[rel]] == []


def test_sdists_and_editable_installs_still_go_to_pip(tmp_path):
    calls = []
    hook = fetch_eggs._pip_wheel_installs_in_process(lambda args, **kw: calls.append(args) or "pip")
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "-t", str(tmp_path), "-q"]
    sdist, editable = pip + ["x-1.0.tar.gz"], pip + ["-e", "file:///src/x-1.0-py3-none-any.whl"]
    other = [sys.executable, "setup.py", "x-1.0-py3-none-any.whl"]
    assert [hook(sdist), hook(editable), hook(other)] == ["pip"] * 3
    assert calls == [sdist, editable, other]
