"""``egg:plonedeploy.runtime#cheroot``: cheroot (CherryPy's HTTP server), threads, in-process.

cheroot's ``wsgi.Server`` runs a fixed pool of ``numthreads`` worker threads in this
process (the one runwsgi started, with the Zope app it loaded) and queues accepted
connections for them; it has no PasteDeploy entry point of its own.

ini keys (plonedeploy.recipe's ``templates/cheroot.ini.in``): ``host``, ``port``, ``threads`` (-> ``numthreads``
and ``max``: a fixed pool, = ZODB pool-size), ``request_queue_size`` (listen backlog),
``timeout`` (seconds a connection may be idle, also keep-alive), ``shutdown_timeout``
(seconds to finish requests on SIGTERM), ``max_request_header_size`` (bytes, 0 = no
limit), ``max_request_body_size`` (bytes, 0 = no limit).
"""
import signal

from plonedeploy.runtime.servers import as_int, take

KEYS = ("host", "port", "threads", "request_queue_size", "timeout", "shutdown_timeout",
        "max_request_header_size", "max_request_body_size")


def serve(app, global_conf, **conf):
    """paste.server_runner: serve ``app`` until SIGTERM/SIGINT; see the module docstring."""
    from cheroot import wsgi

    take(conf, "cheroot", KEYS)
    threads = as_int(conf, "threads")
    server = wsgi.Server(
        (conf["host"], as_int(conf, "port")), app,
        numthreads=threads, max=threads,
        request_queue_size=as_int(conf, "request_queue_size"),
        timeout=as_int(conf, "timeout"),
        shutdown_timeout=as_int(conf, "shutdown_timeout"),
    )
    server.max_request_header_size = as_int(conf, "max_request_header_size")
    server.max_request_body_size = as_int(conf, "max_request_body_size")

    def stop(signum, frame):
        raise KeyboardInterrupt  # safe_start() stops the server on it

    signal.signal(signal.SIGTERM, stop)
    server.safe_start()
