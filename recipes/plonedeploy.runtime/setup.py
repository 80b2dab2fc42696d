"""plonedeploy.runtime: the code a plonedeploy ZEO client runs, without the build tools.

``plonedeploy.recipe:instance`` adds this distribution (never itself) to each ZEO client's
``eggs``, so a client's path carries PasteDeploy, the chosen WSGI server and this, not
zc.buildout, Jinja2 or psutil (the recipe's build-time dependencies). Its wsgi.ini names
the entry points below as ``use = egg:plonedeploy.runtime#<name>``.

PasteDeploy server runners for the WSGI servers that ship none usable with Zope
(``plonedeploy.runtime.servers``; docs/reference/servers.md):

- ``paste.server_runner`` (in runwsgi's own process): ``cheroot``, ``bjoern``, ``uwsgi``
  (pyuwsgi), ``gevent``;
- ``paste.server_factory`` (the server's supervisor started before Zope is loaded, one
  worker that loads the app): ``gunicorn``, ``granian``; ``mod_wsgi`` (Apache through
  ``mod_wsgi-express``, exec'd before Zope is loaded; its one daemon process loads the app).

PasteDeploy filters (``paste.filter_factory``):

- ``blobsendfile`` (``plonedeploy.runtime.blobfilter``): hands whole-file ZODB blob
  downloads to the server's ``wsgi.file_wrapper`` as a real file (pyruvate then uses
  ``sendfile(2)``); first in the pipeline unless the part says ``blob-sendfile = off``.
- ``explicittx`` (``plonedeploy.runtime.explicittx``): the transaction package's explicit
  mode per request (``transaction-mode = explicit``).
- ``astlock`` (``plonedeploy.runtime.astlock``): on CPython before 3.12, one thread at a time
  builds an AST, so that threads compiling page templates at once do not fail.
- ``delay`` (``plonedeploy.runtime.delay``): a testing aid, page requests made slower by
  ``added-delay`` ms (the canary's tests and benchmark); never in a default.
- ``metrics`` (``plonedeploy.runtime.metrics``): Prometheus metrics of the client
  (requests, latency, ZODB pool and caches) on a port of their own; needs
  prometheus-client (extra ``metrics``; the recipe adds it to the eggs with
  ``metrics-address``).

PasteDeploy app (``paste.app_factory``):

- ``hello`` (``plonedeploy.runtime.hello``): hello world, served by a client's server
  runner without Zope for the benchmark matrix
  (``python -m plonedeploy.runtime.hello hello.ini``).

``plonedeploy`` is a PEP 420 namespace package (no ``plonedeploy/__init__.py``) shared
with plonedeploy.recipe.
"""
from setuptools import find_namespace_packages, setup

setup(
    name="plonedeploy.runtime",
    version="0.1.0",
    description="Runtime pieces of plonedeploy ZEO clients: WSGI server runners, the blobsendfile and metrics filters",
    long_description=__doc__,
    license="GPL-2.0-only",
    packages=find_namespace_packages("src", include=["plonedeploy.runtime", "plonedeploy.runtime.*"]),
    package_dir={"": "src"},
    zip_safe=False,
    python_requires=">=3.10",
    # The servers themselves (gunicorn, cheroot, ...) are added to a client's eggs by the
    # recipe for the server it runs; one client needs one of them, never all.
    install_requires=["PasteDeploy"],
    extras_require={"metrics": ["prometheus-client"]},
    entry_points={
        # WSGI servers without a PasteDeploy entry point usable with Zope: the ZEO
        # client's wsgi.ini says "use = egg:plonedeploy.runtime#<server>" (see
        # plonedeploy/runtime/servers/__init__.py for the two kinds).
        "paste.server_runner": [
            "cheroot = plonedeploy.runtime.servers.cheroot:serve",
            "bjoern = plonedeploy.runtime.servers.bjoern:serve",
            "uwsgi = plonedeploy.runtime.servers.uwsgi:serve",
            "gevent = plonedeploy.runtime.servers.gevent:serve",
        ],
        "paste.server_factory": [
            "gunicorn = plonedeploy.runtime.servers.gunicorn:server_factory",
            "granian = plonedeploy.runtime.servers.granian:server_factory",
            # execs mod_wsgi-express (Apache) before Zope is loaded; its daemon loads Zope
            "mod_wsgi = plonedeploy.runtime.servers.mod_wsgi:server_factory",
        ],
        "paste.filter_factory": [
            # blob-sendfile = on (the default): use = egg:plonedeploy.runtime#blobsendfile
            "blobsendfile = plonedeploy.runtime.blobfilter:filter_factory",
            # metrics-address set: use = egg:plonedeploy.runtime#metrics (needs prometheus-client)
            "metrics = plonedeploy.runtime.metrics:filter_factory",
            # transaction-mode = explicit: use = egg:plonedeploy.runtime#explicittx
            "explicittx = plonedeploy.runtime.explicittx:filter_factory",
            # Python < 3.12 (always put there by the recipe): use = egg:plonedeploy.runtime#astlock
            "astlock = plonedeploy.runtime.astlock:filter_factory",
            # added-delay = <ms> (a testing aid): use = egg:plonedeploy.runtime#delay
            "delay = plonedeploy.runtime.delay:filter_factory",
        ],
        # hello-world app for loadtests/matrix/matrix.py: use = egg:plonedeploy.runtime#hello
        "paste.app_factory": [
            "hello = plonedeploy.runtime.hello:app_factory",
        ],
    },
)
