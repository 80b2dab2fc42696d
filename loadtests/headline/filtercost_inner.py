"""The WSGI filters of a ZEO client's pipeline, timed around a trivial application; run by
``python -m loadtests filters`` in the client's own interpreter
(``parts/<client>/bin/interpreter``), where Paste, Zope and plonedeploy.runtime are importable.

    parts/instance/bin/interpreter filtercost_inner.py REQUESTS ROUNDS METRICS_PORT

The application answers every request ``200 OK`` with a 2-byte body at once, so the time of a
chain is the filters' own: what each adds to every request the client answers, whatever the
page costs. Chains (outermost filter first, as in wsgi.ini's ``pipeline``):

- ``app``: the application alone;
- one per filter alone: ``blobsendfile``, ``metrics``, ``translogger``, ``httpexceptions``;
- ``metrics+translogger``: the pair whose cost is more than its parts' (docs/results.md,
  28 Nov 2026);
- the controls for that extra: ``noop`` (a filter that only calls the application) alone and
  ``noop+translogger`` (does any filter around translogger bring it?); ``translogger(log
  off)`` alone and ``metrics+translogger(log off)``, the access log's logger disabled
  (translogger still formats the line, no log record is made: does it go with the logging?);
- ``stock``: ``translogger httpexceptions`` (plone.recipe.zope2instance's pipeline);
- ``kit``: ``blobsendfile metrics translogger httpexceptions`` (the kit's default).

``metrics`` is the real filter with its exporter thread on 127.0.0.1:METRICS_PORT (a free
port the caller chose) and the
probes' bookkeeping, no warm-up paths and no memory watchdog. ``translogger`` logs each
request at INFO to a FileHandler on ``/dev/null`` (the stock ini's access log is a
FileHandler): formatting and the handler's lock are counted, the disk write is not.
``translogger(log off)`` logs to a logger of its own (``wsgi-off``) that is disabled, so the
other chains' ``wsgi`` logger stays on.

Each round times every chain over REQUESTS requests (a fresh copy of one GET environ each,
the body iterated and closed), in an order rotated per round. Output on stdout, one JSON
object: ``{"requests": n, "rounds": n, "python": "3.11.2", "seconds": {chain: [s per
request, one per round]}}``. Exit status 2 with a message on bad arguments.
"""
import io
import json
import logging
import os
import platform
import sys
import time

from paste.translogger import make_filter as translogger
from plonedeploy.runtime import blobfilter, metrics
from ZPublisher.httpexceptions import main as httpexceptions


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


def noop(inner):
    """A WSGI filter that only calls ``inner``: one more Python frame around it, nothing else."""
    def call(environ, start_response):
        return inner(environ, start_response)
    return call


def start_response(status, headers, exc_info=None):
    return lambda data: None


ENVIRON = {
    "REQUEST_METHOD": "GET", "SCRIPT_NAME": "", "PATH_INFO": "/Plone", "QUERY_STRING": "",
    "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8081", "SERVER_PROTOCOL": "HTTP/1.1",
    "REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "127.0.0.1:8081", "HTTP_USER_AGENT": "filtercost",
    "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr, "wsgi.version": (1, 0),
    "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
}


def chains(metrics_port):
    """``{name: WSGI callable}``: the chains of the module docstring, built once; the metrics
    filter's exporter on 127.0.0.1:``metrics_port``."""
    access = logging.getLogger("wsgi")
    access.addHandler(logging.FileHandler(os.devnull))
    access.propagate = False
    # The same filter with its access log off: a logger of its own, so that "wsgi" stays on
    # for the other chains; disabled, Logger.log returns before it makes a record.
    logging.getLogger("wsgi-off").disabled = True
    make = {
        "blobsendfile": blobfilter.filter_factory({}),
        "metrics": metrics.filter_factory({}, address=f"127.0.0.1:{metrics_port}", threads="2"),
        "translogger": lambda inner: translogger(inner, {}, setup_console_handler=False),
        "httpexceptions": httpexceptions,
        "noop": noop,
        "translogger(log off)": lambda inner: translogger(inner, {}, logger_name="wsgi-off",
                                                          setup_console_handler=False),
    }

    def chain(*names):
        wrapped = app
        for name in reversed(names):
            wrapped = make[name](wrapped)
        return wrapped

    built = {"app": app, **{name: chain(name) for name in make}}
    built["metrics+translogger"] = chain("metrics", "translogger")
    built["noop+translogger"] = chain("noop", "translogger")
    built["metrics+translogger(log off)"] = chain("metrics", "translogger(log off)")
    built["stock"] = chain("translogger", "httpexceptions")
    built["kit"] = chain("blobsendfile", "metrics", "translogger", "httpexceptions")
    return built


def seconds_per_request(wsgi, requests):
    """Mean seconds per request of ``wsgi`` over ``requests`` calls."""
    started = time.perf_counter()
    for _ in range(requests):
        environ = dict(ENVIRON)
        environ["wsgi.input"] = io.BytesIO(b"")
        body = wsgi(environ, start_response)
        for _chunk in body:
            pass
        if hasattr(body, "close"):
            body.close()
    return (time.perf_counter() - started) / requests


def main(argv):
    try:
        requests, rounds, metrics_port = (int(value) for value in argv)
        if requests < 1 or rounds < 1 or not 1 <= metrics_port <= 65535:
            raise ValueError
    except ValueError:
        print("usage: filtercost_inner.py REQUESTS ROUNDS METRICS_PORT (whole numbers >= 1, a port <= 65535)",
              file=sys.stderr)
        return 2
    built = chains(metrics_port)
    names = list(built)
    seconds = {name: [] for name in names}
    for number in range(rounds):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            seconds[name].append(seconds_per_request(built[name], requests))
    json.dump({"requests": requests, "rounds": rounds, "python": platform.python_version(),
               "seconds": seconds}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
