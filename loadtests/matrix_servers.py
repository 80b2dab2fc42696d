"""The servers under test of the benchmark matrix: build, start, wait for, stop.

One ZEO client part ``m_<server>_t<threads>`` per (server, threads) pair the plan needs,
built with loadtests/serverbuild.py into ``var/matrix/`` (ZEO clients of the stack's
zeoserver, shared blob directory). Part ``i`` (in sorted order) serves Zope on
``base_port + 2 i`` and hello world on ``base_port + 2 i + 1``: the hello server is the
same server runner with the same ``[server:main]`` keys, which the recipe renders into
``parts/<part>/etc/hello.ini`` from the part's ``hello-address`` (the server's own template
and both stages, as for ``etc/wsgi.ini``), started as
``parts/<part>/bin/interpreter -m plonedeploy.runtime.hello parts/<part>/etc/hello.ini``
(see plonedeploy/runtime/hello.py); it never loads Zope.

All processes start at once with :func:`loadtests.extrabuild.start` (under a
supervisord of their own in ``var/matrix/run``, each in its own process group) and are
stopped by :func:`loadtests.extrabuild.stop` (SIGTERM to the group, SIGKILL after 30 s).
"""
import os

import requests

from loadtests import extrabuild, serverbuild
from loadtests.core import tree_processes

PORT_RANGE = (9510, 9599)


def part_name(server, threads):
    """Buildout part name of the pair: ``m_<server>_t<threads>``."""
    return f"m_{server}_t{threads}"


def assign_ports(pairs, base_port):
    """``{(server, threads): (zope port, hello port)}``: two consecutive ports per pair from
    ``base_port`` in the order of ``pairs``."""
    return {pair: (base_port + 2 * i, base_port + 2 * i + 1) for i, pair in enumerate(pairs)}


def hello_ini(directory, server, threads):
    """Path of the hello server's ini of the pair's part, written by the recipe
    (``hello-address``) when :func:`build` built it."""
    return os.path.join(os.path.abspath(directory), "parts", part_name(server, threads), "etc", "hello.ini")


def build(directory, pairs, ports, zeo_address, blob_storage):
    """Build the parts of ``pairs`` in ``directory`` (:func:`loadtests.serverbuild.build_parts`),
    each with ``hello-address`` on its hello port, so the recipe writes :func:`hello_ini` too.
    Returns the seconds buildout ran; raises RuntimeError with the tail of its output when it
    fails."""
    parts = [(part_name(s, t), s, ports[(s, t)][0], t) for s, t in pairs]
    hello = {part_name(s, t): f"hello-address = 127.0.0.1:{ports[(s, t)][1]}\n" for s, t in pairs}
    return serverbuild.build_parts(directory, parts, zeo_address, blob_storage, part_options=hello)


def run_config(directory, pairs, ports):
    """Every pair's Zope client (``bin/<part> console``) and hello server, all in one start
    stage, for :func:`loadtests.extrabuild.start`/``stop`` (their supervisord in ``directory/run``,
    logs in ``directory/log``). Process names: the part, and ``<part>-hello``."""
    directory = os.path.abspath(directory)
    processes = []
    for server, threads in pairs:
        name = part_name(server, threads)
        zope_port, hello_port = ports[(server, threads)]
        processes.append(extrabuild.client_process(directory, name, f"http://127.0.0.1:{zope_port}"))
        processes.append({"name": f"{name}-hello", "stage": 0, "ready": {"http": f"http://127.0.0.1:{hello_port}/"},
                          "argv": [os.path.join(directory, "parts", name, "bin", "interpreter"), "-m",
                                   "plonedeploy.runtime.hello", hello_ini(directory, server, threads)]})
    return extrabuild.run_config(directory, processes)


def start_all(config, pairs, timeout=420):
    """Start every process of ``config`` (:func:`run_config`) at once and wait until each
    answers HTTP. Returns ``{(server, threads, "zope"|"hello"): psutil.Process}``. Raises
    plonedeploy.recipe.stack.StackError naming the process that exited or did not answer
    within ``timeout`` seconds (those started are stopped again)."""
    procs = extrabuild.start(config, timeout=timeout)
    return {(s, t, kind): procs[part_name(s, t) + ("-hello" if kind == "hello" else "")]
            for s, t in pairs for kind in ("zope", "hello")}


def prime(base_url, paths, timeout=120):
    """GET ``base_url`` + each ``(path, accept)`` once (cold caches: may take seconds).
    Raises RuntimeError naming the path when one does not answer 200."""
    for path, accept in paths:
        headers = {"Accept": accept} if accept else {}
        try:
            status = requests.get(base_url + path, headers=headers, timeout=timeout).status_code
        except requests.RequestException as exc:
            raise RuntimeError(f"{base_url}{path}: {exc}") from None
        if status != 200:
            raise RuntimeError(f"{base_url}{path} answered {status}, not 200 (is the site created?)")


def tree(proc):
    """psutil processes of ``proc`` (psutil) and its descendants; [] when it is gone."""
    return tree_processes(proc.pid)
