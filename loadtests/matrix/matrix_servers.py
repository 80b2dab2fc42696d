"""The servers under test of the benchmark matrix: build, start, wait for, stop.

One ZEO client part per :class:`loadtests.matrix.matrix_plan.Part` the plan needs (server,
threads, blob-sendfile, replica; :func:`part_name`), built with loadtests/matrix/serverbuild.py
into ``var/matrix/`` (ZEO clients of the stack's zeoserver, shared blob directory). Part
``i`` (in sorted order) serves Zope on ``base_port + 2 i``; a *base* part (sendfile on,
replica 1) also serves hello world on ``base_port + 2 i + 1``: the hello server is the
same server runner with the same ``[server:main]`` keys, which the recipe renders into
``parts/<part>/etc/hello.ini`` from the part's ``hello-address`` (the server's own template
and both stages, as for ``etc/wsgi.ini``), started as
``parts/<part>/bin/interpreter -m plonedeploy.runtime.hello parts/<part>/etc/hello.ini``
(see plonedeploy/runtime/hello.py); it never loads Zope.

All processes start at once with :func:`loadtests.core.extrabuild.start` (under a
supervisord of their own in ``var/matrix/run``, each in its own process group) and are
stopped by :func:`loadtests.core.extrabuild.stop` (SIGTERM to the group, SIGKILL after 30 s).
"""
import os

import requests

from loadtests.core import extrabuild
from loadtests.core.procs import tree_processes
from loadtests.core.stack import BLOB_SIZE, PATHS
from loadtests.matrix import serverbuild

PORT_RANGE = (9510, 9599)


def part_name(part):
    """Buildout part name of a :class:`loadtests.matrix.matrix_plan.Part`:
    ``m_<server>_t<threads>``, then ``_off`` when built with ``blob-sendfile = off``,
    ``_c<size>`` with a zodb-cache-size of its own and ``_r<n>`` for replica n >= 2."""
    return (f"m_{part.server}_t{part.threads}" + ("" if part.sendfile else "_off")
            + (f"_c{part.cache}" if part.cache else "") + (f"_r{part.replica}" if part.replica > 1 else ""))


def has_hello(part):
    """True for a base part (sendfile on, the build's cache, replica 1): the one that serves
    hello world too."""
    return part.sendfile and not part.cache and part.replica == 1


def assign_ports(parts, base_port):
    """``{part: (zope port, hello port)}``: two consecutive ports per part from
    ``base_port`` in the order of ``parts`` (the hello port stays unused unless
    :func:`has_hello`)."""
    return {part: (base_port + 2 * i, base_port + 2 * i + 1) for i, part in enumerate(parts)}


def hello_ini(directory, part):
    """Path of the hello server's ini of ``part``, written by the recipe
    (``hello-address``) when :func:`build` built it."""
    return os.path.join(os.path.abspath(directory), "parts", part_name(part), "etc", "hello.ini")


def build(directory, parts, ports, zeo_address, blob_storage, service_user=""):
    """Build ``parts`` in ``directory`` (:func:`loadtests.matrix.serverbuild.build_parts`): base
    parts with ``hello-address`` on their hello port (the recipe writes :func:`hello_ini`),
    sendfile-off parts with ``blob-sendfile = off``, parts with a cache of their own with
    that ``zodb-cache-size``; ``service_user``: the stack's
    (:func:`loadtests.core.stack.service_user`), who the parts run as when root starts them.
    Returns the seconds buildout ran; raises RuntimeError with the tail of its output when
    it fails."""
    options = {}
    for part in parts:
        lines = f"hello-address = 127.0.0.1:{ports[part][1]}\n" if has_hello(part) else ""
        lines += "" if part.sendfile else "blob-sendfile = off\n"
        options[part_name(part)] = lines + (f"zodb-cache-size = {part.cache}\n" if part.cache else "")
    return serverbuild.build_parts(directory, [(part_name(p), p.server, ports[p][0], p.threads) for p in parts],
                                   zeo_address, blob_storage, part_options=options, service_user=service_user)


def run_config(directory, parts, ports, hello=True):
    """Every part's Zope client (``bin/<part> console``) and, with ``hello``, each base
    part's hello server, all in one start stage, for :func:`loadtests.core.extrabuild.start`/``stop`` (their
    supervisord in ``directory/run``, logs in ``directory/log``). Process names: the part,
    and ``<part>-hello``."""
    directory = os.path.abspath(directory)
    processes = []
    for part in parts:
        name = part_name(part)
        zope_port, hello_port = ports[part]
        processes.append(extrabuild.client_process(directory, name, f"http://127.0.0.1:{zope_port}"))
        if hello and has_hello(part):
            processes.append({"name": f"{name}-hello", "stage": 0,
                              "ready": {"http": f"http://127.0.0.1:{hello_port}/"},
                              "argv": [os.path.join(directory, "parts", name, "bin", "interpreter"), "-m",
                                       "plonedeploy.runtime.hello", hello_ini(directory, part)]})
    return extrabuild.run_config(directory, processes)


def start_all(config, parts, timeout=420):
    """Start every process of ``config`` (:func:`run_config`) at once and wait until each
    answers HTTP. Returns ``{(part, "zope"|"hello"): psutil.Process}`` (``hello`` for the
    base parts whose hello server ``config`` has). Raises plonedeploy.stack.StackError naming the process that exited
    or did not answer within ``timeout`` seconds (those started are stopped again)."""
    procs = extrabuild.start(config, timeout=timeout)
    out = {(part, "zope"): procs[part_name(part)] for part in parts}
    out.update({(part, "hello"): procs[part_name(part) + "-hello"] for part in parts
                if part_name(part) + "-hello" in procs})
    return out


def prime(base_url, paths, timeout=120):
    """GET ``base_url`` + each ``(path, accept)`` once (cold caches: may take seconds).
    Raises RuntimeError naming the path when one does not answer 200, or when the blob's
    download is not BLOB_SIZE bytes (a filter that cut or padded it would be measured
    as fast)."""
    for path, accept in paths:
        headers = {"Accept": accept} if accept else {}
        try:
            answer = requests.get(base_url + path, headers=headers, timeout=timeout)
        except requests.RequestException as exc:
            raise RuntimeError(f"{base_url}{path}: {exc}") from None
        if answer.status_code != 200:
            raise RuntimeError(f"{base_url}{path} answered {answer.status_code}, not 200 (is the site created?)")
        if path == PATHS["blob"][0] and len(answer.content) != BLOB_SIZE:
            raise RuntimeError(f"{base_url}{path}: {len(answer.content)} bytes, not the blob's {BLOB_SIZE}")


def tree(proc):
    """psutil processes of ``proc`` (psutil) and its descendants; [] when it is gone."""
    return tree_processes(proc.pid)
