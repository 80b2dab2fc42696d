"""``egg:plonedeploy.runtime#granian``: granian (Rust, hyper/tokio), WSGI interface.

granian's supervisor forks its workers (``MPServer``; its thread-based ``MTServer`` runs
only on free-threaded Python builds and refuses 3.11 with ``FatalError: gil``). So, as
for gunicorn, this factory runs granian as soon as runwsgi loads the server, before Zope
is loaded; the supervisor forks *one* worker (``workers = 1``: one ZEO client), which
loads Zope from the ini. In the worker, granian's Rust runtime (``runtime_threads = 1``)
does the HTTP/1.1 I/O and hands each request to one of ``blocking_threads`` Python
threads (``threads``, = ZODB pool-size) that call the app.

ini keys (plonedeploy.recipe's ``templates/granian.ini.in``): ``host``, ``port``, ``threads``, ``backlog``,
``http1_keep_alive`` (true/false), ``http1_header_read_timeout`` (milliseconds),
``http1_max_buffer_size`` (bytes: largest request head granian buffers).
"""
import sys

from plonedeploy.runtime.servers import as_bool, as_int, load_app, take

KEYS = ("host", "port", "threads", "backlog", "http1_keep_alive", "http1_header_read_timeout",
        "http1_max_buffer_size")


def server_options(conf):
    """Keyword arguments (dict) of ``granian.server.Server`` for the ``[server:main]`` keys."""
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings

    take(conf, "granian", KEYS)
    return dict(
        address=conf["host"],
        port=as_int(conf, "port"),
        interface=Interfaces.WSGI,
        workers=1,
        blocking_threads=as_int(conf, "threads"),
        runtime_threads=1,
        http=HTTPModes.http1,
        websockets=False,
        backlog=as_int(conf, "backlog"),
        http1_settings=HTTP1Settings(
            keep_alive=as_bool(conf, "http1_keep_alive"),
            header_read_timeout=as_int(conf, "http1_header_read_timeout"),
            max_buffer_size=as_int(conf, "http1_max_buffer_size"),
        ),
        log_access=False,  # the ini's translogger writes the access log
    )


def server_factory(global_conf, **conf):
    """paste.server_factory: run granian now, exit the process when it stops."""
    from granian.server import Server

    server = Server(target=global_conf["__file__"], **server_options(conf))
    # granian calls load_app(target) in the worker (target = this ini's path)
    server.serve(target_loader=load_app)
    sys.exit(0)
