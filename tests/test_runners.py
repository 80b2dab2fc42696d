"""Unit tests of the server runners' ini parsing (plonedeploy.runtime.servers), no server
imported: the keys each runner accepts, and what it makes of them."""
import os

import pytest

from plonedeploy.runtime.servers import as_bool, as_int, gunicorn, mod_wsgi, take, uwsgi

UWSGI = {"host": "127.0.0.1", "port": "9389", "threads": "3", "listen": "100",
         "buffer_size": "32768", "http_keepalive": "true", "http_timeout": "30"}
GUNICORN = {"host": "127.0.0.1", "port": "9385", "threads": "2", "keepalive": "5", "timeout": "120",
            "graceful_timeout": "30", "backlog": "2048", "limit_request_line": "4094",
            "limit_request_fields": "100", "limit_request_field_size": "8190"}

MOD_WSGI = {"host": "127.0.0.1", "port": "9391", "threads": "3", "express": "/x/bin/mod_wsgi-express",
            "run_as": "www-data", "server_root": "/b/var/c/mod_wsgi-9391", "writable": "/b/var/c/chameleon",
            "locale": "C.UTF-8", "keep_alive_timeout": "5", "request_timeout": "120",
            "startup_timeout": "180", "queue_timeout": "45", "socket_timeout": "60",
            "limit_request_body": "1048576"}


def test_unknown_key_is_refused_with_the_known_ones():
    with pytest.raises(ValueError) as err:
        take({"host": "h", "workers": "2"}, "cheroot", ("host", "threads"))
    assert str(err.value) == "[server:main] of cheroot: unknown key(s) workers; this runner reads: host, threads"


def test_int_and_bool_values():
    assert as_int({"port": " 80"}, "port") == 80
    with pytest.raises(ValueError, match=r"port = '80a': expected an integer"):
        as_int({"port": "80a"}, "port")
    assert as_bool({"k": "On"}, "k") is True and as_bool({"k": "false"}, "k") is False
    with pytest.raises(ValueError, match="expected true or false"):
        as_bool({"k": "maybe"}, "k")


def test_uwsgi_runs_one_process_without_master_on_the_loaded_app():
    args = uwsgi.uwsgi_args(dict(UWSGI))

    def value(flag):
        return args[args.index(flag) + 1]

    assert value("--http11-socket") == "127.0.0.1:9389"
    assert value("--processes") == "1" and value("--threads") == "3"
    assert value("--module") == "plonedeploy.runtime.servers.uwsgi:application"
    assert value("--buffer-size") == "32768"
    assert "--master" not in args
    assert "--tcp-nodelay" in args  # else ~40 ms per kept-alive response (Nagle vs. delayed ACK)
    assert "--http-socket" in uwsgi.uwsgi_args(dict(UWSGI, http_keepalive="false"))


def test_gunicorn_one_gthread_worker_app_loaded_in_the_worker():
    options = gunicorn.settings(dict(GUNICORN), proc_name="x.ini")
    assert options["workers"] == 1 and options["worker_class"] == "gthread"
    assert options["threads"] == 2 and options["bind"] == ["127.0.0.1:9385"]
    assert options["preload_app"] is False
    assert options["control_socket_disable"] is True
    assert options["limit_request_fields"] == 100 and options["keepalive"] == 5



def test_mod_wsgi_one_daemon_process_with_threads():
    args = mod_wsgi.express_args(dict(MOD_WSGI), "/b/var/c/mod_wsgi-9391/zope.wsgi")

    def value(flag):
        return args[args.index(flag) + 1]

    assert args[:3] == ["/x/bin/mod_wsgi-express", "start-server", "/b/var/c/mod_wsgi-9391/zope.wsgi"]
    assert value("--processes") == "1" and value("--threads") == "3"
    assert value("--host") == "127.0.0.1" and value("--port") == "9391"
    assert value("--server-root") == "/b/var/c/mod_wsgi-9391"
    assert value("--python-path") == value("--server-root")  # its eggs.pth lists the part's eggs
    assert value("--locale") == "C.UTF-8"  # express's default en_US.UTF-8 is not installed
    assert value("--startup-timeout") == "180" and value("--limit-request-body") == "1048576"
    assert "--user" not in args  # never switched by Apache: the factory drops privileges itself
    with pytest.raises(ValueError, match="unknown key"):
        mod_wsgi.express_args(dict(MOD_WSGI, workers="2"), "s")


def test_mod_wsgi_daemon_path_is_the_eggs_without_this_interpreters_library(tmp_path):
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    path = ["", "/b/eggs/Zope.egg", stdlib, os.path.join(stdlib, "lib-dynload"), "/b/eggs/Zope.egg",
            "/venv/lib/python3.11/site-packages"]
    assert mod_wsgi.eggs_path(path) == ["/b/eggs/Zope.egg", "/venv/lib/python3.11/site-packages"]


def test_mod_wsgi_grants_run_as_search_permission(tmp_path):
    """The mod_wsgi runner lets ``run_as`` reach the part and its eggs with bin/stack's
    plonedeploy.runtime.access (one copy): the directories it could not enter get
    ``u:<user>:x``, a second call grants nothing, and a path it still cannot read is a
    ValueError naming ``run_as``. Root only."""
    import pwd
    import shutil
    import subprocess
    import tempfile

    if os.geteuid() != 0:
        pytest.fail("runs as root only (the runner grants when started as root)")
    nobody = pwd.getpwnam("nobody")
    base = tempfile.mkdtemp(prefix="plonedeploy-reach-")  # 0700
    try:
        os.makedirs(os.path.join(base, "a", "b"))
        os.chmod(os.path.join(base, "a"), 0o750)
        target = os.path.join(base, "a", "b", "egg")
        assert [path[len(base):] for path in mod_wsgi.grant_search(nobody, [target])] == ["", "/a"]
        assert mod_wsgi.grant_search(nobody, [target]) == []
        acl = subprocess.run(["getfacl", "-cp", base], capture_output=True, text=True, timeout=30).stdout
        assert "user:nobody:--x" in acl
        secret = os.path.join(base, "a", "b", "secret.cfg")
        with open(secret, "w", encoding="ascii") as fp:
            fp.write("x")
        os.chmod(secret, 0o600)
        with pytest.raises(ValueError, match=r"\[server:main\] run_as = 'nobody': user 'nobody' .* cannot read "):
            mod_wsgi.grant_search(nobody, [secret])
    finally:
        shutil.rmtree(base)


