"""``egg:plonedeploy.runtime#hello``: a hello-world WSGI app, and a runner that serves it.

The benchmark matrix (loadtests/matrix/matrix.py) measures each WSGI server on a trivial app
as well as on Zope, so its figures compare with the old server benchmarks (which served
hello world) and show what the server costs by itself. The app answers every request
with ``200 OK``, ``Content-Type: text/plain`` and the 13 bytes ``Hello, world!``.

Served by the same server runner as a ZEO client, without loading Zope::

    parts/<part>/bin/interpreter -m plonedeploy.runtime.hello <hello.ini>

where ``hello.ini`` (``parts/<part>/etc/hello.ini``, written by plonedeploy.recipe when the
part sets ``hello-address``) has the ``[server:main]`` section of the client's
``etc/wsgi.ini`` on that address and ``[app:main] use = egg:plonedeploy.runtime#hello``. :func:`main` does
what Zope's runwsgi does (PasteDeploy ``loadserver``, ``loadapp``, ``server(app)``) but
sets up no logging and writes no pidfile. The supervisor factories (gunicorn, granian)
load the app in their worker from the same ini, so they serve hello too.
"""
import os
import sys

BODY = b"Hello, world!"


def application(environ, start_response):
    """The WSGI app: 200 with ``Hello, world!`` for any method and path."""
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))])
    return [BODY]


def app_factory(global_conf, **local_conf):
    """paste.app_factory: returns :func:`application` (no options)."""
    return application


def main(argv=None):
    """Serve the ini ``argv[0]``'s ``[app:main]`` with its ``[server:main]`` until stopped.

    Raises whatever PasteDeploy raises for a missing or bad ini (``LookupError``,
    ``OSError``); returns 0 when the server returns.
    """
    from paste.deploy import loadapp, loadserver

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m plonedeploy.runtime.hello HELLO.INI", file=sys.stderr)
        return 2
    uri = "config:" + os.path.abspath(argv[0])
    server = loadserver(uri, name="main")
    app = loadapp(uri, name="main")
    server(app)
    return 0


if __name__ == "__main__":
    sys.exit(main())
