"""``egg:plonedeploy.runtime#bjoern``: bjoern, one thread, libev event loop, in-process.

bjoern (C, libev, http-parser) parses requests in an event loop and calls the WSGI app in
that same single thread: one request runs at a time, so the recipe requires
``threads = 1`` (ZODB pool-size 1, HAProxy maxconn 1). It keeps connections alive (HTTP/1.1)
and has no options for timeouts or header limits. No PasteDeploy entry point of its own.

ini keys (plonedeploy.recipe's ``templates/bjoern.ini.in``): ``host``, ``port``, ``threads`` (must be 1).
"""
from plonedeploy.runtime.servers import as_int, take

KEYS = ("host", "port", "threads")


def serve(app, global_conf, **conf):
    """paste.server_runner: serve ``app`` until the process is signalled."""
    import bjoern

    take(conf, "bjoern", KEYS)
    if as_int(conf, "threads") != 1:
        raise ValueError("[server:main] threads: bjoern runs the app in one thread; expected 1")
    bjoern.run(app, conf["host"], as_int(conf, "port"))
