"""plonedeploy.recipe: buildout recipes for ZEO clients served by pyruvate, waitress and other WSGI servers.

Entry points (use them as ``recipe = plonedeploy.recipe:<name>``):

- ``instance``: a ZEO client; wraps plone.recipe.zope2instance, adds the chosen WSGI
  server's egg and ``plonedeploy.runtime``, renders the wsgi ini from
  ``templates/<server>.ini.in`` and sets the ZODB ``pool-size`` to the thread count.
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

The templates they render are the project's (``templates/``: the wsgi ini of each server,
``<server>.ini.in`` and ``_common.ini.in``, ``varnish.vcl.j2``, supervisord's
``supervisord.conf.j2`` and ``program.conf.j2``; ``haproxy/haproxy.cfg.j2``), the same files
the Ansible roles render: read from the checkout when this is a develop egg, and copied into
the wheel as package data (``plonedeploy/stack/templates/``) when one is built
(``plonedeploy.stack.templates`` says which it reads). ``templates-directory`` (instance) and
``template`` (haproxy, varnish) point a part at your own.

``bin/stack`` (start, stop, rolling restart, status) is the package ``plonedeploy.stack`` of
this distribution, separate from the recipe (``stack`` only writes its configuration and
scripts); its ``rules`` and ``rolling`` modules are plain Python that Ansible's controller
and the load tools import too.

What a ZEO client runs (the server runners, the ``blobsendfile`` and ``metrics`` filters,
the ``hello`` app) is the separate distribution ``plonedeploy.runtime``: ``instance`` adds
it to the client's ``eggs``, never this one, so a client does not carry zc.buildout,
Jinja2 or psutil. ``plonedeploy`` is a PEP 420 namespace package (no
``plonedeploy/__init__.py``) shared by both.
"""
import glob
import os
import shutil

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

#: The project's folders of the shared templates, relative to this file (a checkout).
CHECKOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
TEMPLATES = [os.path.join("templates", "*"), os.path.join("haproxy", "haproxy.cfg.j2")]


class BuildWithTemplates(build_py):
    """build_py that copies the project's templates into the built package
    (``plonedeploy/stack/templates/``), so that a wheel carries them; not for an editable
    install, which reads them from the checkout."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = os.path.join(self.build_lib, "plonedeploy", "stack", "templates")
        os.makedirs(target, exist_ok=True)
        for pattern in TEMPLATES:
            paths = glob.glob(os.path.join(CHECKOUT, pattern))
            if not paths:
                raise RuntimeError(f"no {pattern} in {os.path.abspath(CHECKOUT)}: build the wheel from a checkout")
            for path in paths:
                shutil.copy(path, target)


setup(
    name="plonedeploy.recipe",
    version="0.1.0",
    description="Buildout recipes for Plone ZEO clients on pyruvate, waitress and other WSGI servers behind HAProxy",
    long_description=__doc__,
    license="GPL-2.0-only",
    # "plonedeploy" is the namespace; the templates are copied in by BuildWithTemplates.
    packages=find_namespace_packages("src", include=["plonedeploy.recipe", "plonedeploy.stack"]),
    package_dir={"": "src"},
    cmdclass={"build_py": BuildWithTemplates},
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
