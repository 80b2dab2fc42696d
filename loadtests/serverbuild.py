"""A buildout with one ZEO client part per wsgi-server value, for the server tests.

:func:`build_parts` builds any list of parts (name, server, port, threads); the benchmark
matrix (loadtests/matrix.py) uses it for one part per (server, threads) pair.

Used by tests/test_recipe_buildout.py (does every server render and build?),
tests/test_servers.py (does every server serve Zope?) and loadtests/servers_wrk.py (a
quick side-by-side figure per server). The parts are named
``c_<server>``, one port each from ``base_port`` on, in the order of
``options.SERVERS``; all are ZEO clients of ``zeo_address`` with a shared blob directory.
"""
import os
import pathlib
import subprocess

from plonedeploy.recipe.options import SERVERS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BUILDOUT = os.path.join(ROOT, ".venv-buildout", "bin", "buildout")

HEAD = """\
[buildout]
extends = {root}/versions.cfg
develop = {root}/recipes/plonedeploy.recipe {root}/recipes/plonedeploy.runtime
eggs-directory = {root}/eggs
newest = false
allow-picked-versions = false
parts = {parts}

[client]
recipe = plonedeploy.recipe:instance
eggs = Plone
zeo-client = on
zeo-address = {zeo_address}
shared-blob = on
blob-storage = {blob_storage}
zodb-cache-size = 30000
{client_options}"""

PART = """
[{name}]
<= client
wsgi-server = {server}
http-address = 127.0.0.1:{port}
{threads}"""


def ports(base_port):
    """``{server: port}``: consecutive ports from ``base_port`` in the order of SERVERS."""
    return {server: base_port + i for i, server in enumerate(SERVERS)}


def build(directory, base_port, zeo_address, blob_storage, timeout=600):
    """Write ``directory/buildout.cfg`` with a ``c_<server>`` part per server; run bin/buildout.

    Returns the ``subprocess.CompletedProcess`` (text; stdout and stderr captured).
    """
    parts = [(f"c_{s}", s, p, None) for s, p in ports(base_port).items()]
    return build_parts(directory, parts, zeo_address, blob_storage, timeout)


def build_parts(directory, parts, zeo_address, blob_storage, timeout=600, client_options=""):
    """Write ``directory/buildout.cfg`` with the ZEO client ``parts``; run bin/buildout.

    ``parts``: ``[(part name, wsgi-server, http port, threads or None for the default)]``.
    ``client_options``: more ``key = value`` lines (text, newline-terminated) for every
    part, e.g. a ``metrics-address`` (then build one part only: each needs its own).
    Returns the ``subprocess.CompletedProcess`` (text; stdout and stderr captured).
    """
    directory = pathlib.Path(directory)
    text = HEAD.format(root=ROOT, parts=" ".join(name for name, _, _, _ in parts),
                       zeo_address=zeo_address, blob_storage=blob_storage, client_options=client_options)
    for name, server, port, threads in parts:
        text += PART.format(name=name, server=server, port=port,
                            threads="" if threads is None else f"threads = {threads}\n")
    cfg = directory / "buildout.cfg"
    cfg.write_text(text)
    return subprocess.run([BUILDOUT, "-c", str(cfg)], cwd=directory, capture_output=True,
                          text=True, timeout=timeout, check=False)


def start(directory, server, log_path):
    """Start client ``c_<server>`` of the build in ``directory`` as bin/stack does
    (``bin/c_<server> console``, own process group, output to ``log_path``); returns Popen."""
    directory = os.path.abspath(directory)
    with open(log_path, "w") as out:
        return subprocess.Popen([os.path.join(directory, "bin", f"c_{server}"), "console"],
                                cwd=directory, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop(proc, timeout=45):
    """SIGTERM the client's process group; SIGKILL after ``timeout`` seconds.

    Returns True if it stopped on SIGTERM, False if it had to be killed.
    """
    import signal

    if proc.poll() is not None:
        return True
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        return False
