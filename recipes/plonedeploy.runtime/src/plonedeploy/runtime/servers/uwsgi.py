"""``egg:plonedeploy.runtime#uwsgi``: uWSGI (``pyuwsgi`` wheel), threads, in-process.

``pyuwsgi`` is uWSGI built as a Python extension (the uWSGI project's own wheels; the
``uwsgi`` sdist would compile a separate binary). ``pyuwsgi.run(args)`` runs uWSGI inside
this process, on the interpreter that already holds the Zope app runwsgi loaded: the app
is handed over as :data:`application` (``--module``). Without ``--master`` and with
``--processes 1`` uWSGI does not fork: this process is its one worker, with ``threads``
threads (``--threads``, = ZODB pool-size). SIGTERM ends it.

ini keys (plonedeploy.recipe's ``templates/uwsgi.ini.in``): ``host``, ``port``, ``threads``, ``listen`` (backlog),
``buffer_size`` (bytes: largest request line + headers; uWSGI's default 4096 is too small
for Plone's cookies), ``http_keepalive`` (true: ``--http11-socket``, HTTP/1.1 keep-alive;
false: ``--http-socket``), ``http_timeout`` (seconds, ``--socket-timeout``).
"""
from plonedeploy.runtime.servers import as_bool, as_int, take

KEYS = ("host", "port", "threads", "listen", "buffer_size", "http_keepalive", "http_timeout")

#: The app runwsgi loaded; uWSGI imports it by name (``--module``).
application = None


def uwsgi_args(conf):
    """uWSGI command line (list of str) for the ``[server:main]`` keys ``conf``."""
    take(conf, "uwsgi", KEYS)
    socket = "--http11-socket" if as_bool(conf, "http_keepalive") else "--http-socket"
    return [
        socket, f"{conf['host']}:{as_int(conf, 'port')}",
        "--module", f"{__name__}:application",
        "--processes", "1",                   # no master, no fork: this process serves
        "--threads", str(as_int(conf, "threads")),
        "--enable-threads",
        "--listen", str(as_int(conf, "listen")),
        "--buffer-size", str(as_int(conf, "buffer_size")),
        "--socket-timeout", str(as_int(conf, "http_timeout")),
        # Without it, a kept-alive connection stalls ~40 ms per response (Nagle's
        # algorithm against the client's delayed ACK): 45 req/s on / instead of hundreds.
        "--tcp-nodelay",
        "--need-app",                         # exit if the app cannot be found
        "--disable-logging",                  # the ini's access log (translogger) logs requests
        "--ignore-sigpipe", "--ignore-write-errors", "--disable-write-exception",
    ]


def serve(app, global_conf, **conf):
    """paste.server_runner: run uWSGI in this process on ``app`` until SIGTERM."""
    global application
    import pyuwsgi

    args = uwsgi_args(conf)
    application = app
    pyuwsgi.run(args)
