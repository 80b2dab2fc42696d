"""A buildout with one ZEO client part per wsgi-server value, for the server tests.

:func:`build_parts` builds any list of parts (name, server, port, threads); the benchmark
matrix (loadtests/matrix/matrix.py) uses it for one part per (server, threads) pair.

Used by tests/test_recipe_buildout.py (does every server render and build?),
tests/test_servers.py (does every server serve Zope?); the matrix builds its parts with
:func:`build_parts` (loadtests/matrix/matrix_servers.py). The parts of :func:`build` are named
``c_<server>``, one port each from ``base_port`` on, in the order of
``options.SERVERS``; all are ZEO clients of ``zeo_address`` with a shared blob directory,
run as ``service_user`` (the stack's, :func:`loadtests.core.stack.service_user`) when root starts
them: the blob directory is that user's alone (mod_wsgi's Apache too runs as it then).
Built by :func:`loadtests.core.extrabuild.build`; :func:`run_config` describes the clients for
:func:`loadtests.core.extrabuild.start` and ``stop``.
"""
import os

from loadtests.core import extrabuild
from loadtests.core.stack import ROOT
from plonedeploy.stack.rules import SERVERS

#: zodb-cache-size (objects per ZODB connection) of every part unless its options set their
#: own: buildout.cfg's [instance] (and plone.recipe.zope2instance's default).
ZODB_CACHE_SIZE = 30000


CLIENT = """
[client]
recipe = plonedeploy.recipe:instance
eggs = Plone
zeo-client = on
zeo-address = {zeo_address}
shared-blob = on
blob-storage = {blob_storage}
zodb-cache-size = {zodb_cache_size}
service-user = {service_user}
{client_options}"""

PART = """
[{name}]
<= client
wsgi-server = {server}
http-address = 127.0.0.1:{port}
{threads}{options}"""


def ports(base_port):
    """``{server: port}``: consecutive ports from ``base_port`` in the order of SERVERS."""
    return {server: base_port + i for i, server in enumerate(SERVERS)}


def build(directory, base_port, zeo_address, blob_storage, timeout=600, service_user=""):
    """Write ``directory/buildout.cfg`` with a ``c_<server>`` part per server and build it
    (:func:`build_parts`). Returns the seconds buildout ran; its output is in
    ``directory/buildout.log``. Raises RuntimeError with the output's tail when it fails."""
    parts = [(f"c_{s}", s, p, None) for s, p in ports(base_port).items()]
    return build_parts(directory, parts, zeo_address, blob_storage, timeout, service_user=service_user)


def build_parts(directory, parts, zeo_address, blob_storage, timeout=600, client_options="", part_options=None,
                service_user=""):
    """Write ``directory/buildout.cfg`` with the ZEO client ``parts`` and build it with
    :func:`loadtests.core.extrabuild.build` (the one builder of the load tools).

    ``parts``: ``[(part name, wsgi-server, http port, threads or None for the default)]``;
    ``zeo_address``: ``host:port`` of the ZEO server, ``blob_storage`` its blob directory
    (:func:`loadtests.core.stack.zeo_server`); ``client_options``: more ``key = value`` lines
    (text, newline-terminated) for every part, e.g. a ``metrics-address`` (then build one
    part only: each needs its own, or give it per part); ``part_options``: ``{part name: such
    lines}`` for one part each (the matrix's ``hello-address``); ``service_user``: the
    clients' ``service-user`` (empty: none). Returns the seconds buildout ran; its output is in
    ``directory/buildout.log``. Raises RuntimeError (config, log, output's tail) when it
    fails, ``subprocess.TimeoutExpired`` after ``timeout`` seconds.
    """
    text = extrabuild.checkout_header(os.path.join(ROOT, "versions.cfg"), [name for name, _, _, _ in parts])
    text += CLIENT.format(zeo_address=zeo_address, blob_storage=blob_storage, client_options=client_options,
                          service_user=service_user, zodb_cache_size=ZODB_CACHE_SIZE)
    for name, server, port, threads in parts:
        text += PART.format(name=name, server=server, port=port,
                            threads="" if threads is None else f"threads = {threads}\n",
                            options=(part_options or {}).get(name, ""))
    return extrabuild.build(os.path.abspath(directory), text, f"buildout of {len(parts)} ZEO client part(s)",
                            timeout)


def run_config(directory, parts):
    """The processes of client ``parts`` (``[(part name, http port)]``) of the build in
    ``directory``, each its own stage, for :func:`loadtests.core.extrabuild.start`/``stop``
    (their supervisord in ``directory/run``, logs ``directory/log/<part>.stdout.log``)."""
    directory = os.path.abspath(directory)
    return extrabuild.run_config(directory, [
        extrabuild.client_process(directory, name, f"http://127.0.0.1:{port}", stage)
        for stage, (name, port) in enumerate(parts)])
