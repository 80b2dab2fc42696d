"""``egg:plonedeploy.runtime#gevent``: gevent's pywsgi, one request in Zope at a time, in-process.

gevent.pywsgi serves each connection in a greenlet of gevent's event loop, all in one
thread. Without ``gevent.monkey.patch_all()`` (which would also patch the threads and
sockets of ZEO's client thread) the greenlets of that thread share Zope's thread-local
state: the ``transaction`` manager, ``zope.globalrequest``, the request's ZODB connection.
So the app is serialized: a greenlet holds a gevent lock from the app call until the
response body is closed (it may yield to the loop while writing the body, but no other
greenlet enters Zope meanwhile). Connections are not limited to one greenlet: an idle
keep-alive connection must not stop the others (with ``spawn=Pool(1)`` it did: after
one request from python-requests the server accepted nothing more). One request at a
time, so the recipe requires ``threads = 1``.

ini keys (plonedeploy.recipe's ``templates/gevent.ini.in``): ``host``, ``port``, ``threads`` (must be 1: the
lock's size), ``backlog``.
"""
import signal

from plonedeploy.runtime.servers import as_int, take

KEYS = ("host", "port", "threads", "backlog")


class _Serialized:
    """WSGI app wrapper: at most one request inside ``app`` (call + body) at a time."""

    def __init__(self, app, lock):
        self.app, self.lock = app, lock

    def __call__(self, environ, start_response):
        self.lock.acquire()
        try:
            result = self.app(environ, start_response)
        except BaseException:
            self.lock.release()
            raise
        return _Body(result, self.lock)


class _Body:
    """The app's response iterable; releases the lock once, on ``close()`` (WSGI calls it)."""

    def __init__(self, result, lock):
        self.result, self.lock, self.open = result, lock, True

    def __iter__(self):
        return iter(self.result)

    def close(self):
        try:
            if hasattr(self.result, "close"):
                self.result.close()
        finally:
            if self.open:
                self.open = False
                self.lock.release()


def serve(app, global_conf, **conf):
    """paste.server_runner: serve ``app`` until SIGTERM/SIGINT."""
    import gevent
    from gevent.lock import Semaphore
    from gevent.pywsgi import WSGIServer

    take(conf, "gevent", KEYS)
    if as_int(conf, "threads") != 1:
        raise ValueError("[server:main] threads: gevent without monkey-patching runs Zope for "
                         "one request at a time; expected 1")
    server = WSGIServer((conf["host"], as_int(conf, "port")), _Serialized(app, Semaphore(1)),
                        backlog=as_int(conf, "backlog"), log=None)
    # The handler runs in gevent's hub, which must not block: stop in a greenlet of its
    # own, giving running requests 5 s.
    gevent.signal_handler(signal.SIGTERM, lambda: gevent.spawn(server.stop, 5))
    server.serve_forever()
