"""``egg:plonedeploy.recipe#gevent``: gevent's pywsgi, one greenlet at a time, in-process.

gevent.pywsgi serves each connection in a greenlet of gevent's event loop. Without
``gevent.monkey.patch_all()`` (which would also patch the threads and sockets of ZEO's
client thread) the greenlets of one thread share Zope's thread-local state: the
``transaction`` manager, ``zope.globalrequest``, the ZODB connection of the request.
Two requests interleaved in one thread would mix their transactions, so the pool is one
greenlet: one request at a time, and the recipe requires ``threads = 1``.

ini keys (``templates/gevent.ini.in``): ``host``, ``port``, ``threads`` (must be 1, the
greenlet pool size), ``backlog``, ``max_accept``.
"""
import signal

from plonedeploy.recipe.servers import as_int, take

KEYS = ("host", "port", "threads", "backlog", "max_accept")


def serve(app, global_conf, **conf):
    """paste.server_runner: serve ``app`` until SIGTERM/SIGINT."""
    from gevent.pool import Pool
    from gevent.pywsgi import WSGIServer

    take(conf, "gevent", KEYS)
    if as_int(conf, "threads") != 1:
        raise ValueError("[server:main] threads: gevent without monkey-patching serves one "
                         "request at a time; expected 1")
    server = WSGIServer((conf["host"], as_int(conf, "port")), app,
                        spawn=Pool(1), backlog=as_int(conf, "backlog"), log=None)
    server.max_accept = as_int(conf, "max_accept")
    import gevent

    gevent.signal_handler(signal.SIGTERM, server.stop, 5)  # 5 s for running requests
    server.serve_forever()
