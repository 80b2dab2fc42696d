"""A running ZEO client loads no build-time code: no module file of zc.buildout, Jinja2,
psutil or plonedeploy.recipe is opened by the process that serves Zope.

No mock: a buildout in a temporary directory (loadtests/matrix/serverbuild.py, this checkout's
eggs) with one ZEO client made by ``plonedeploy.recipe:instance`` (Plone on pyruvate,
blobsendfile and metrics filters on, as the stack's ``instance``) and a real ZEO server
(ZEO's runzeo), on ports 9850-9852. The client is started the way bin/stack starts
it, ``bin/client console``, under ``strace -f -e trace=openat,execve``: every file the
process and its threads open is recorded, whatever imports it (an ``import`` statement,
``importlib.import_module`` behind PasteDeploy's entry points, a C extension). A module
is loaded only if its ``.py``, ``.pyc`` or ``.so`` file was opened; a distribution's
metadata (``zc.buildout-*.dist-info``, read when entry points are looked up) is not a
module and does not count. ``console`` (plone.recipe.zope2instance's ctl) replaces itself
by ``execve`` with Zope's runwsgi (``Zope2/Startup/serve.py``), which keeps the pid and
serves; only what is opened after that execve counts. The test asks the client for a page
and its metrics first, so the imports of a request are recorded too.

Why not ``PYTHONPROFILEIMPORTTIME``: it logs only imports made through ``__import__``
(the ``import`` statement); modules loaded with ``importlib.import_module``, as entry
points are, are missing from its log (pyruvate and plonedeploy.runtime.* were, here).

The scan is checked against what must be there (Zope, ZEO, pyruvate, the runtime filters,
prometheus_client): a trace that lost its lines fails instead of passing empty.
"""
import re
import shutil
import subprocess
import time

import pytest
import requests

from conftest import port_taken, setup_budget, stop_group
from loadtests.matrix import serverbuild
from unavailable import unavailable

pytestmark = pytest.mark.buildout

ZEO_PORT, HTTP_PORT, METRICS_PORT = 9850, 9851, 9852
STARTED_WITHIN = 180  # seconds for Zope to start on a busy 2-core machine

#: A ZEO server for the client: FileStorage and blobs in the build's var/, run by ZEO's
#: own runzeo from the client's interpreter (ZEO is on its path).
ZEO_CONF = """\
<zeo>
  address 127.0.0.1:{port}
</zeo>
<blobstorage 1>
  blob-dir {var}/blobstorage
  <filestorage>
    path {var}/Data.fs
  </filestorage>
</blobstorage>
"""

#: Module directories of the build (plonedeploy.recipe itself and its install_requires
#: that Plone does not need) that a client must not load from.
BUILD_PACKAGES = ("/zc/buildout/", "/jinja2/", "/psutil/", "/plonedeploy/recipe/", "/plonedeploy/stack/")
#: Module directories the serving process must have loaded from: proof that the trace
#: sees its imports.
RUNTIME_PACKAGES = ("/Zope2/", "/ZEO/", "/pyruvate/", "/plonedeploy/runtime/", "/prometheus_client/")
MODULE_SUFFIXES = (".py", ".pyc", ".so")
_OPENED = re.compile(r'^\d+\s+openat\([^,]+, "([^"]+)"')


def module_files(trace_text):
    """``(before, after)``: the module files (``MODULE_SUFFIXES``) opened before and after
    the execve of Zope's ``serve.py``, from ``strace -f -e trace=openat,execve`` output
    (``-e status=successful``, so failed lookups along sys.path are not in it)."""
    before, after = [], []
    current = before
    for line in trace_text.splitlines():
        if "execve(" in line and "serve.py" in line:
            current = after
            continue
        match = _OPENED.match(line)
        if match and match.group(1).endswith(MODULE_SUFFIXES):
            current.append(match.group(1))
    return before, after


@pytest.fixture(scope="module")
@setup_budget(600)  # one client part's bin/buildout: not timed here, so the builder's own limit (serverbuild: 600 s)
def client_build(tmp_path_factory):
    """One pyruvate client ``c_pyruvate`` (loadtests/matrix/serverbuild.py: Plone, ZEO client,
    shared blobs, blobsendfile on) with metrics, and its ZEO server's config."""
    for port in (ZEO_PORT, HTTP_PORT, METRICS_PORT):
        if port_taken(port):
            pytest.skip(f"port {port} is in use")
    directory = tmp_path_factory.mktemp("client-imports")
    var = directory / "var"
    var.mkdir()
    (directory / "zeo.conf").write_text(ZEO_CONF.format(port=ZEO_PORT, var=var))
    # raises RuntimeError with buildout's output when the build fails
    serverbuild.build_parts(directory, [("c_pyruvate", "pyruvate", HTTP_PORT, None)],
                            f"127.0.0.1:{ZEO_PORT}", str(var / "blobstorage"),
                            client_options=f"metrics-address = 127.0.0.1:{METRICS_PORT}\n")
    return directory


def test_running_zeo_client_loads_no_build_module(client_build):
    if shutil.which("strace") is None:
        unavailable("strace not installed (scripts/install-system.sh installs it)")
    directory = client_build
    trace, log = directory / "client.strace", directory / "client.log"
    # -c, not -m ZEO.runzeo: the part's interpreter script would take runzeo's -C as its own.
    zeo = subprocess.Popen([str(directory / "parts" / "c_pyruvate" / "bin" / "interpreter"), "-c",
                            f"from ZEO.runzeo import main; main(['-C', {str(directory / 'zeo.conf')!r}])"],
                           cwd=directory,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    with open(log, "w") as out:
        client = subprocess.Popen(
            ["strace", "-f", "--seccomp-bpf", "-s", "4096", "-e", "trace=openat,execve", "-e", "status=successful",
             "-o", str(trace), str(directory / "bin" / "c_pyruvate"), "console"],
            cwd=directory, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        deadline = time.monotonic() + STARTED_WITHIN
        while True:
            assert client.poll() is None, f"client exited {client.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no answer within {STARTED_WITHIN} s"
            try:
                if requests.get(f"http://127.0.0.1:{HTTP_PORT}/", timeout=10).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        metrics = requests.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10)
        assert metrics.status_code == 200 and "zope_http_requests_total" in metrics.text
    finally:
        stop_group(client)
        stop_group(zeo)
    before, after = module_files(trace.read_text())
    assert before, "no ctl imports traced before the execve of serve.py"
    for package in RUNTIME_PACKAGES:
        assert any(package in path for path in after), f"nothing of {package} traced: the scan is broken"
    assert [path for path in after if any(package in path for package in BUILD_PACKAGES)] == []
