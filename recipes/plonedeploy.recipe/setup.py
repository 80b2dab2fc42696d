"""plonedeploy.recipe: buildout recipes for ZEO clients served by pyruvate, waitress and other WSGI servers.

Entry points (use them as ``recipe = plonedeploy.recipe:<name>``):

- ``instance``: a ZEO client; wraps plone.recipe.zope2instance, adds the chosen WSGI
  server's egg and ``plonedeploy.runtime``, renders the wsgi ini from
  ``templates/<server>.ini.in`` and sets the ZODB ``pool-size`` to the thread count.
- ``haproxy``: renders ``templates/haproxy.cfg.j2`` from the client parts and checks it
  with ``haproxy -c``.
- ``varnish``: renders ``templates/varnish.vcl.j2`` (the cache tier in front of the
  pool on HAProxy's TLS listener) and checks it with ``varnishd -C``.
- ``stack``: writes ``bin/stack`` (start/stop/status of zeoserver, clients and HAProxy).
- ``postgresql``: a local PostgreSQL cluster in ``var/<part>`` for clients with
  ``storage = relstorage``, started by ``bin/stack`` instead of the ZEO server; its
  ``bin/<part> dump`` and ``restore`` back it up with pg_dump and pg_restore.
- ``relstorage-tools``: the configs of RelStorage's ``bin/zodbconvert`` (Data.fs and blobs
  into PostgreSQL) and ``bin/zodbpack`` for those clients.

Every template they render ships with this package (``plonedeploy/recipe/templates/``,
package data): the wsgi ini of each server (``<server>.ini.in`` and ``_common.ini.in``),
``haproxy.cfg.j2`` (in the checkout a link to the project's one copy, ``haproxy/``) and
``varnish.vcl.j2``; the Ansible roles render the same two files. ``templates-directory`` (instance) and ``template`` (haproxy, varnish) point a part at
your own.

What a ZEO client runs (the server runners, the ``blobsendfile`` and ``metrics`` filters,
the ``hello`` app) is the separate distribution ``plonedeploy.runtime``: ``instance`` adds
it to the client's ``eggs``, never this one, so a client does not carry zc.buildout,
Jinja2 or psutil. ``plonedeploy`` is a PEP 420 namespace package (no
``plonedeploy/__init__.py``) shared by both.
"""
from setuptools import find_namespace_packages, setup

setup(
    name="plonedeploy.recipe",
    version="0.1.0",
    description="Buildout recipes for Plone ZEO clients on pyruvate, waitress and other WSGI servers behind HAProxy",
    long_description=__doc__,
    license="GPL-2.0-only",
    # plonedeploy.recipe alone: "plonedeploy" is the namespace, templates/ is package data.
    packages=find_namespace_packages("src", include=["plonedeploy.recipe"]),
    package_dir={"": "src"},
    package_data={"plonedeploy.recipe": ["templates/*"]},
    zip_safe=False,
    python_requires=">=3.10",
    install_requires=[
        "setuptools",
        "zc.buildout",
        "zc.recipe.egg",
        "plone.recipe.zope2instance",
        # plonedeploy.runtime.access: bin/stack and bin/postgresql grant service users search
        # permission with the mod_wsgi runner's code (one copy, in the runtime a client may import)
        "plonedeploy.runtime",
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
    },
)
