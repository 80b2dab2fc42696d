"""Unit tests of the server runners' ini parsing (plonedeploy.runtime.servers), no server
imported: the keys each runner accepts, and what it makes of them."""
import pytest

from plonedeploy.runtime.servers import as_bool, as_int, gunicorn, take, uwsgi

UWSGI = {"host": "127.0.0.1", "port": "9389", "threads": "3", "listen": "100",
         "buffer_size": "32768", "http_keepalive": "true", "http_timeout": "30"}
GUNICORN = {"host": "127.0.0.1", "port": "9385", "threads": "2", "keepalive": "5", "timeout": "120",
            "graceful_timeout": "30", "backlog": "2048", "limit_request_line": "4094",
            "limit_request_fields": "100", "limit_request_field_size": "8190"}


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

