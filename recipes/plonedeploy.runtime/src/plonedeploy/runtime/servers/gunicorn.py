"""``egg:plonedeploy.runtime#gunicorn``: gunicorn, one ``gthread`` worker with ``threads`` threads.

gunicorn's own ``egg:gunicorn#main`` (gunicorn.app.pasterapp) serves the app runwsgi
already loaded and forks its worker from there: the forked ZEO client has no client
thread (see :mod:`plonedeploy.runtime.servers`). This factory instead runs gunicorn's
arbiter as soon as runwsgi loads the server, before Zope is loaded; the arbiter forks
*one* worker (``workers = 1``: one ZEO client, one client cache) of class ``gthread``
with ``threads`` threads (= ZODB pool-size), and that worker loads Zope from the ini.
The arbiter is the process ``bin/<part>`` started (bin/stack's PID); SIGTERM stops both.

ini keys (plonedeploy.recipe's ``templates/gunicorn.ini.in``): ``host``, ``port``, ``threads``, ``keepalive``
(seconds an idle keep-alive connection stays open), ``timeout`` (seconds the arbiter
waits for a silent worker; it also covers Zope's start in the worker),
``graceful_timeout`` (seconds for running requests on SIGTERM), ``backlog``,
``limit_request_line`` (bytes), ``limit_request_fields`` (count),
``limit_request_field_size`` (bytes) -- gunicorn's own settings of the same names.
"""
import sys

from plonedeploy.runtime.servers import as_int, close_zope_databases, load_app, take

KEYS = ("host", "port", "threads", "keepalive", "timeout", "graceful_timeout", "backlog",
        "limit_request_line", "limit_request_fields", "limit_request_field_size")


def settings(conf, proc_name):
    """gunicorn settings (dict) for the ``[server:main]`` keys ``conf``."""
    take(conf, "gunicorn", KEYS)
    ints = {key: as_int(conf, key) for key in KEYS if key not in ("host", "port", "threads")}
    return dict(
        ints,
        bind=[f"{conf['host']}:{as_int(conf, 'port')}"],
        workers=1,
        worker_class="gthread",
        threads=as_int(conf, "threads"),
        preload_app=False,   # the app is loaded in the worker, never in the arbiter
        proc_name=proc_name,
        errorlog="-",
        # gunicorn 27's control socket defaults to one path per user ($HOME/.gunicorn/
        # gunicorn.ctl), shared by every client on the machine: off.
        control_socket_disable=True,
        accesslog=None,      # the ini's translogger writes the access log
    )


def server_factory(global_conf, **conf):
    """paste.server_factory: run gunicorn now, exit the process when it stops."""
    from gunicorn.app.base import BaseApplication

    ini = global_conf["__file__"]
    options = settings(conf, proc_name=ini)

    class ZopeApplication(BaseApplication):
        def load_config(self):
            for key, value in options.items():
                self.cfg.set(key, value)
            self.cfg.set("worker_exit", lambda arbiter, worker: close_zope_databases())

        def load(self):
            return load_app(ini)

    ZopeApplication().run()  # the arbiter's loop; it calls sys.exit when it stops
    sys.exit(0)
