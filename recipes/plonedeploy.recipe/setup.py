"""plonedeploy.recipe: buildout recipes for ZEO clients served by pyruvate, waitress and other WSGI servers.

Entry points (use them as ``recipe = plonedeploy.recipe:<name>``):

- ``instance``: a ZEO client; wraps plone.recipe.zope2instance, adds the chosen WSGI
  server's egg, renders the wsgi ini from ``templates/<server>.ini.in`` and sets the ZODB
  ``pool-size`` to the thread count.
- ``haproxy``: renders ``haproxy/haproxy.cfg.j2`` from the client parts and checks it
  with ``haproxy -c``.
- ``varnish``: renders ``templates/varnish.vcl.j2`` (the cache tier in front of the
  pool on HAProxy's TLS listener) and checks it with ``varnishd -C``.
- ``stack``: writes ``bin/stack`` (start/stop/status of zeoserver, clients and HAProxy).
- ``postgresql``: a local PostgreSQL cluster in ``var/<part>`` for clients with
  ``storage = relstorage``, started by ``bin/stack`` instead of the ZEO server; its
  ``bin/<part> dump`` and ``restore`` back it up with pg_dump and pg_restore.
- ``relstorage-tools``: the configs of RelStorage's ``bin/zodbconvert`` (Data.fs and blobs
  into PostgreSQL) and ``bin/zodbpack`` for those clients.

PasteDeploy server runners (``use = egg:plonedeploy.recipe#<server>`` in a client's
wsgi.ini) for gunicorn, cheroot, granian, bjoern, uwsgi (pyuwsgi) and gevent:
``plonedeploy.recipe.servers``.

PasteDeploy filter (``use = egg:plonedeploy.recipe#blobsendfile``):

- ``blobsendfile``: hands whole-file ZODB blob downloads to the server's
  ``wsgi.file_wrapper`` as a real file (pyruvate then uses ``sendfile(2)``); added to the
  clients' pipeline by ``instance`` unless ``blob-sendfile = off``.

- ``metrics``: Prometheus metrics of the client (requests, latency, ZODB pool and caches)
  on a port of their own (``plonedeploy.recipe.metrics``); added after ``blobsendfile`` by
  ``instance`` when ``metrics-address`` is set.

PasteDeploy app (``use = egg:plonedeploy.recipe#hello``):

- ``hello``: hello world, served by a client's server runner without Zope for the
  benchmark matrix (``python -m plonedeploy.recipe.hello hello.ini``).
"""
from setuptools import find_packages, setup

setup(
    name="plonedeploy.recipe",
    version="0.1.0",
    description="Buildout recipes for Plone ZEO clients on pyruvate, waitress and other WSGI servers behind HAProxy",
    long_description=__doc__,
    license="GPL-2.0-only",
    packages=find_packages("src"),
    package_dir={"": "src"},
    include_package_data=True,
    zip_safe=False,
    python_requires=">=3.10",
    install_requires=[
        "setuptools",
        "zc.buildout",
        "zc.recipe.egg",
        "plone.recipe.zope2instance",
        "Jinja2",
        "psutil",
    ],
    entry_points={
        "zc.buildout": [
            "default = plonedeploy.recipe.instance:Recipe",
            "instance = plonedeploy.recipe.instance:Recipe",
            "haproxy = plonedeploy.recipe.haproxy:Recipe",
            "stack = plonedeploy.recipe.stack:Recipe",
            "varnish = plonedeploy.recipe.varnish:Recipe",
            "postgresql = plonedeploy.recipe.postgresql:Recipe",
            "relstorage-tools = plonedeploy.recipe.relstoragetools:Recipe",
        ],
        # WSGI servers without a PasteDeploy entry point usable with Zope: the ZEO
        # client's wsgi.ini says "use = egg:plonedeploy.recipe#<server>" (see
        # plonedeploy/recipe/servers/__init__.py for the two kinds).
        "paste.server_runner": [
            "cheroot = plonedeploy.recipe.servers.cheroot:serve",
            "bjoern = plonedeploy.recipe.servers.bjoern:serve",
            "uwsgi = plonedeploy.recipe.servers.uwsgi:serve",
            "gevent = plonedeploy.recipe.servers.gevent:serve",
        ],
        "paste.server_factory": [
            "gunicorn = plonedeploy.recipe.servers.gunicorn:server_factory",
            "granian = plonedeploy.recipe.servers.granian:server_factory",
        ],
        # WSGI filter for the clients' pipeline (blob-sendfile = on): use = egg:plonedeploy.recipe#blobsendfile
        "paste.filter_factory": [
            "blobsendfile = plonedeploy.recipe.blobfilter:filter_factory",
            # metrics-address set: use = egg:plonedeploy.recipe#metrics (needs prometheus-client)
            "metrics = plonedeploy.recipe.metrics:filter_factory",
        ],
        # hello-world app for loadtests/matrix.py: use = egg:plonedeploy.recipe#hello
        "paste.app_factory": [
            "hello = plonedeploy.recipe.hello:app_factory",
        ],
    },
)
