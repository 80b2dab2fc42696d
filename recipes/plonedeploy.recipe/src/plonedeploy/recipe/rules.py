"""The rules of a ZEO client and its place in HAProxy that both deploy paths apply:
``bin/buildout`` (the recipes, through ``options`` and ``haproxy``) and Ansible (the roles,
through ``ansible/filter_plugins/plonedeploy_edge.py``).

Plain Python without zc.buildout or Jinja2, so that Ansible's controller can import it.
Errors are returned as message strings; the recipes turn them into
``zc.buildout.UserError``, the roles into a failed ``assert``.
"""

#: WSGI servers a ZEO client can run, mapped to the eggs the client needs for them (added
#: to its ``eggs``). Each needs a ``templates/<name>.ini.in``. Servers without a
#: PasteDeploy entry point usable with Zope run through a runner of this distribution
#: (``egg:plonedeploy.recipe#<name>``, plonedeploy/recipe/servers/); ``uwsgi`` is the
#: uWSGI project's ``pyuwsgi`` wheel (uWSGI as a Python extension). See docs/servers.md.
SERVERS = {
    "pyruvate": ("pyruvate",),
    "waitress": ("waitress",),
    "gunicorn": ("plonedeploy.recipe", "gunicorn"),
    "cheroot": ("plonedeploy.recipe", "cheroot"),
    "granian": ("plonedeploy.recipe", "granian"),
    "bjoern": ("plonedeploy.recipe", "bjoern"),
    "uwsgi": ("plonedeploy.recipe", "pyuwsgi"),
    "gevent": ("plonedeploy.recipe", "gevent"),
}
#: Servers that call the app from one thread, one request at a time (bjoern's libev loop;
#: gevent's greenlets, which without monkey-patching would share Zope's thread-local
#: transaction): for them ``threads`` defaults to, and must be, 1.
SINGLE_THREADED = ("bjoern", "gevent")
DEFAULT_SERVER = "pyruvate"

#: Default worker threads per ZEO client. Two threads keep one Zope process (which uses at
#: most about one core because of the GIL) busy while one request waits on ZEO or I/O,
#: and keep two ZODB connection caches in memory, not ZODB's default pool of seven.
DEFAULT_THREADS = 2


def default_threads(server):
    """Threads (int) of a ZEO client on ``server`` when none are given: 1 for the
    :data:`SINGLE_THREADED` servers, else :data:`DEFAULT_THREADS`."""
    return 1 if server in SINGLE_THREADED else DEFAULT_THREADS


def threads_error(server, threads):
    """Why ``threads`` (an int >= 1) cannot serve on ``server``, or None when it can."""
    if server in SINGLE_THREADED and threads != 1:
        return f"1 for wsgi-server = {server} (it calls the app from one thread, one request at a time)"
    return None


def fd_limit_needed(maxconn, servers):
    """Smallest ``fd-limit`` (file descriptors) for a frontend ``maxconn``: one per client
    connection (global maxconn = maxconn + 16), one per server connection (at most each
    server's ``maxconn``; ``servers`` is a list of dicts with ``maxconn``), plus 64 for
    listeners, health checks, the stats socket and logs."""
    return maxconn + 16 + sum(int(s["maxconn"]) for s in servers) + 64
