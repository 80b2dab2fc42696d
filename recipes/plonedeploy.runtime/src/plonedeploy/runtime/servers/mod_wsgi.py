"""``egg:plonedeploy.runtime#mod_wsgi``: Apache httpd + mod_wsgi, through ``mod_wsgi-express``.

mod_wsgi embeds Python in Apache; its daemon mode runs the app in a process Apache forks
for it. So, as for gunicorn and granian, this factory starts the server as soon as
runwsgi loads it, before Zope is loaded: it replaces runwsgi's process (``execve``) with
``mod_wsgi-express start-server``, which execs Apache in the foreground (the PID
``bin/<part>`` started, the one bin/stack tracks). Apache's parent never loads Zope; it
forks one worker child (the event MPM: accepts connections, hands requests over) and *one*
mod_wsgi daemon process (``--processes 1``: one ZEO client) with ``threads`` threads
(``--threads``, = ZODB pool-size), which imports the WSGI script this module writes and
so loads Zope from the same ini (:func:`plonedeploy.runtime.servers.load_app`). SIGTERM
to the process group stops all three.

Two things differ from the other servers (docs/reference/servers.md):

- **another Python**: mod_wsgi embeds the Python it was compiled against. It is built
  against the system's ``/usr/bin/python3`` (Debian's 3.11, the same cp311 ABI as the
  eggs) in a venv of its own (``express``, made by scripts/install-system.sh): the
  project's own interpreter may live where the service user cannot read it (pyenv under
  ``/root``). This process's ``sys.path`` (the part's eggs), minus the interpreter's own
  library, reaches the daemon's path as ``eggs.pth`` in the server root, which
  mod_wsgi-express's ``--python-path`` names: mod_wsgi adds it with ``site.addsitedir``,
  which reads the ``.pth`` file (one line per egg; Apache's config lines are too short for
  the list itself).
- **not as root**: Apache refuses to serve as root (``AH00526 ... Apache has not been
  designed to serve pages while running as root``), and switching to another user would
  happen in Apache. When ``bin/<part>`` runs as root, this factory makes ``run_as`` own
  what the client writes (the server root, the files of the ini's log handlers, the
  ``writable`` directories such as the part's Chameleon cache), then drops to that user
  (``setgroups``/``setgid``/``setuid``) before the exec, so Apache never runs as root
  and never switches user. As any other user it runs as that user. A checkout under a
  mode-0700 directory (root's home, a ``mktemp -d`` clone): ``run_as`` is first given
  search permission by POSIX ACL on each directory on the way that it cannot enter
  (:func:`grant_search`, said on stderr).

ini keys (plonedeploy.recipe's ``templates/mod_wsgi.ini.in``): ``host``, ``port``,
``threads``, ``express`` (path of ``mod_wsgi-express``), ``run_as`` (user when started
as root), ``server_root`` (Apache's generated config, logs and sockets), ``writable``
(directories, whitespace-separated, that the daemon writes), ``locale``,
``keep_alive_timeout``, ``request_timeout``, ``startup_timeout``, ``queue_timeout``,
``socket_timeout`` (seconds), ``limit_request_body`` (bytes) -- mod_wsgi-express's
options of the same names.
"""
import grp
import logging
import os
import pwd
import sys
import sysconfig

from plonedeploy.runtime import access
from plonedeploy.runtime.servers import as_int, take

KEYS = ("host", "port", "threads", "express", "run_as", "server_root", "writable", "locale",
        "keep_alive_timeout", "request_timeout", "startup_timeout", "queue_timeout",
        "socket_timeout", "limit_request_body")

#: The file in the server root that lists the part's eggs for the daemon's ``site.addsitedir``.
PATH_FILE = "eggs.pth"

SCRIPT = '''\
# Written by plonedeploy.runtime.servers.mod_wsgi: the WSGI script of mod_wsgi's daemon
# process, which embeds the system Python; the part's eggs are on its path by eggs.pth
# beside this file (mod_wsgi-express --python-path). The ini's app:
from plonedeploy.runtime.servers.mod_wsgi import daemon_app
application = daemon_app({ini!r})
'''


def express_args(conf, script):
    """``mod_wsgi-express start-server`` command line (list of str) for the ``[server:main]``
    keys ``conf`` and the WSGI script ``script``."""
    take(conf, "mod_wsgi", KEYS)
    args = [conf["express"], "start-server", script,
            "--host", conf["host"], "--port", str(as_int(conf, "port")),
            "--processes", "1",                 # one daemon process: one ZEO client
            "--threads", str(as_int(conf, "threads")),
            "--server-root", conf["server_root"],
            "--locale", conf["locale"],
            "--log-to-terminal",                # Apache's error log to bin/<part>'s output
            "--python-path", conf["server_root"],  # its eggs.pth: the part's eggs
            "--application-type", "script", "--callable-object", "application"]
    for key in ("keep_alive_timeout", "request_timeout", "startup_timeout", "queue_timeout",
                "socket_timeout", "limit_request_body"):
        args += ["--" + key.replace("_", "-"), str(as_int(conf, key))]
    return args


def eggs_path(path=None):
    """The entries of ``path`` (default ``sys.path``) that are not this interpreter's own
    library (the standard library, lib-dynload, the zip): the part's eggs and develop eggs,
    for the daemon's interpreter, which has its own standard library."""
    # Not platstdlib: in a venv that is the venv's lib/pythonX.Y, which holds its site-packages.
    own = {os.path.realpath(sysconfig.get_paths()["stdlib"])}
    own.add(os.path.realpath(os.path.join(sys.base_prefix, "lib", f"python{sys.version_info[0]}"
                                                                  f"{sys.version_info[1]}.zip")))
    result = []
    for entry in sys.path if path is None else path:
        real = os.path.realpath(entry) if entry else ""
        if not entry or real in own or any(real.startswith(o + os.sep) for o in own):
            continue
        if entry not in result:
            result.append(entry)
    return result


def log_files():
    """Paths of the file handlers runwsgi's ``setup_logging`` configured from the ini."""
    paths = []
    for ref in list(logging._handlerList):  # every handler still alive
        handler = ref()
        path = getattr(handler, "baseFilename", None)
        if path and path not in paths:
            paths.append(path)
    return paths


def grant_search(user, paths):
    """Give ``user`` (a ``pwd`` entry) search permission, by POSIX ACL (``setfacl -m
    u:<user>:x``), on every directory on the way to ``paths`` that it cannot enter (a
    checkout under root's home or a ``mktemp -d`` directory), and say so on stderr, with
    :func:`plonedeploy.runtime.access.grant_search` (the one bin/stack uses). Returns the
    directories granted. Root only. Raises ValueError naming ``run_as`` and the directory
    when setfacl is missing or does not help, or a path stays unreadable."""
    try:
        return access.grant_search(user.pw_name, paths, "mod_wsgi's daemon reads the part and its eggs there",
                                   lambda line: print(line, file=sys.stderr, flush=True))
    except (access.AccessError, OSError) as exc:
        raise ValueError(f"[server:main] run_as = {user.pw_name!r}: {exc}") from exc


def prepare(conf, user):
    """Make ``user`` (a ``pwd`` entry, or None for this process's own user) own what the
    daemon writes: the server root, the log files, the ``writable`` directories."""
    directories = [conf["server_root"]] + conf["writable"].split()
    for directory in directories:
        os.makedirs(directory, exist_ok=True)
    files = log_files()
    for path in files:
        open(path, "a").close()
    if user is None:
        return
    for path in directories + files:
        os.chown(path, user.pw_uid, user.pw_gid)
    for directory in conf["writable"].split():
        for base, dirs, names in os.walk(directory):
            for name in dirs + names:
                os.chown(os.path.join(base, name), user.pw_uid, user.pw_gid)


def server_factory(global_conf, **conf):
    """paste.server_factory: become ``mod_wsgi-express start-server`` (exec), as ``run_as``
    when started as root."""
    ini = os.path.abspath(global_conf["__file__"])
    args = express_args(conf, os.path.join(conf["server_root"], "zope.wsgi"))
    if not os.access(conf["express"], os.X_OK):
        raise ValueError(f"[server:main] express = {conf['express']}: no such program "
                         "(scripts/install-system.sh installs mod_wsgi-express)")
    user = None
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam(conf["run_as"])
        except KeyError:
            raise ValueError(f"[server:main] run_as = {conf['run_as']!r}: no such user (Apache refuses "
                             "to serve as root; scripts/install-system.sh uses www-data)") from None
    if user is not None:
        grant_search(user, [os.path.dirname(ini), conf["express"]] + eggs_path()
                     + [conf["server_root"]] + conf["writable"].split())
    prepare(conf, user)
    script = args[2]
    with open(script, "w", encoding="utf-8") as fp:
        fp.write(SCRIPT.format(ini=ini))
    path_file = os.path.join(conf["server_root"], PATH_FILE)
    with open(path_file, "w", encoding="utf-8") as fp:
        fp.write("".join(entry + "\n" for entry in eggs_path()))
    env = {key: value for key, value in os.environ.items() if key in ("PATH", "TZ")}
    env["LANG"] = conf["locale"]
    if user is not None:
        env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
        os.chown(script, user.pw_uid, user.pw_gid)
        os.chown(path_file, user.pw_uid, user.pw_gid)
        os.setgroups([g.gr_gid for g in grp.getgrall() if user.pw_name in g.gr_mem])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(conf["express"], args, env)


def daemon_app(ini):
    """The app of mod_wsgi's daemon process: logging as runwsgi sets it up, then the ini's
    ``main`` pipeline (Zope)."""
    import configparser
    from logging.config import fileConfig

    from plonedeploy.runtime.servers import load_app

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ini, encoding="utf-8")
    if parser.has_section("loggers"):  # etc/hello.ini has none
        fileConfig(ini, {"__file__": ini, "here": os.path.dirname(ini)}, disable_existing_loggers=False)
    return load_app(ini)
