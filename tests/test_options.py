"""Unit tests of the recipe's validation and rendering rules (no build needed)."""
import configparser
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest
import zc.buildout

from conftest import ROOT
from fake_buildout import fake_buildout
from unavailable import unavailable
from plonedeploy.recipe import clientoptions, edge, options, optiontables, tls
from plonedeploy.stack import rules


@pytest.mark.parametrize("value, expected", [
    ("127.0.0.1:8081", ("127.0.0.1", 8081)),
    ("localhost:1", ("localhost", 1)),
    ("10.0.0.5:65535", ("10.0.0.5", 65535)),
    ("[::1]:8080", ("[::1]", 8080)),
])
def test_http_address_accepts_host_port(value, expected):
    assert options.parse_http_address("instance", value) == expected


@pytest.mark.parametrize("value, fragment", [
    ("8081", "one host:port"),
    ("", "one host:port"),
    ("127.0.0.1:", "one host:port"),
    (":8081", "one host:port"),
    ("127.0.0.1:8081 127.0.0.1:8082", "one host:port"),
    ("127.0.0.1:http", "one host:port"),
    ("127.0.0.1:0", "between 1 and 65535"),
    ("127.0.0.1:70000", "between 1 and 65535"),
])
def test_http_address_refuses_others(value, fragment):
    with pytest.raises(zc.buildout.UserError) as err:
        options.parse_http_address("instance", value)
    message = str(err.value)
    assert message.startswith(f"[instance] http-address = {value!r} is invalid")
    assert fragment in message


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_threads_must_be_positive_integer(value):
    with pytest.raises(zc.buildout.UserError, match=r"\[client2\] threads = .* positive integer"):
        options.parse_positive_int("client2", value)


def test_threads_parses():
    assert options.parse_positive_int("client2", " 4 ") == 4


def test_server_choice_names_allowed_values():
    with pytest.raises(zc.buildout.UserError) as err:
        options.check_choice("instance", "wsgi-server", "tornado", tuple(options.SERVERS))
    assert str(err.value) == (
        "[instance] wsgi-server = 'tornado' is invalid: expected one of: pyruvate, waitress, "
        "gunicorn, cheroot, granian, bjoern, uwsgi, gevent, mod_wsgi"
    )


@pytest.mark.parametrize("server, value, expected", [
    ("pyruvate", None, 2), ("granian", "4", 4), ("bjoern", None, 1), ("gevent", "1", 1),
    ("mod_wsgi", None, 2), ("mod_wsgi", "3", 3),
])
def test_threads_default_and_value_per_server(server, value, expected):
    assert options.parse_threads("c", server, value) == expected


@pytest.mark.parametrize("server", options.SINGLE_THREADED)
def test_single_threaded_servers_refuse_more_threads(server):
    with pytest.raises(zc.buildout.UserError) as err:
        options.parse_threads("c", server, "2")
    assert str(err.value) == (
        f"[c] threads = '2' is invalid: expected 1 for wsgi-server = {server} "
        "(it calls the app from one thread, one request at a time)"
    )


def test_mod_wsgi_pin_is_the_one_install_system_builds():
    """scripts/install-system.sh builds the mod_wsgi of requirements-mod_wsgi.txt into the venv
    whose mod_wsgi-express is the recipe's default: one version in both."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "requirements-mod_wsgi.txt"), encoding="utf-8") as fp:
        pins = [line.strip() for line in fp if line.strip() and not line.startswith("#")]
    assert pins == [f"mod_wsgi=={rules.MOD_WSGI_VERSION}"]
    assert f"/mod_wsgi-{rules.MOD_WSGI_VERSION}/bin/mod_wsgi-express" in rules.MOD_WSGI_EXPRESS
    with open(os.path.join(root, "scripts", "install-system.sh"), encoding="utf-8") as fp:
        assert 'MOD_WSGI_VENV="/usr/local/lib/plonedeploy/mod_wsgi-$MOD_WSGI_VERSION"' in fp.read()


def test_every_server_has_a_template():
    for server in options.SERVERS:
        assert os.path.isfile(os.path.join(options.TEMPLATES_DIRECTORY, f"{server}.ini.in")), server


ZOPE_CONF = """\
%define INSTANCEHOME /x
<zodb_db main>
    # Main database
    cache-size 30000
    <zeoclient>
      server 127.0.0.1:8100
    </zeoclient>
    mount-point /
</zodb_db>

<zodb_db temporary>
    mount-point /temp_folder
</zodb_db>
"""


def test_insert_pool_size_goes_into_main_db_only():
    text = options.insert_pool_size(ZOPE_CONF, 3)
    main = text[text.index("<zodb_db main>"):text.index("</zodb_db>")]
    assert "    pool-size 3\n" in main
    assert text.count("pool-size") == 1


def test_insert_pool_size_refuses_double_setting():
    once = options.insert_pool_size(ZOPE_CONF, 2)
    with pytest.raises(ValueError, match="already sets pool-size"):
        options.insert_pool_size(once, 2)


def test_insert_pool_size_needs_main_db():
    with pytest.raises(ValueError, match="found 0"):
        options.insert_pool_size("<zodb_db other>\n</zodb_db>\n", 2)


def _render_stage_one(server, blob_sendfile=True, metrics_address=None, hello_port=None, **memory):
    port = hello_port or 8081
    context = {"part": "p", "server": server, "host": "127.0.0.1", "port": port,
               "http_address": f"127.0.0.1:{port}", "threads": 3, "blob_sendfile": blob_sendfile,
               "metrics_address": metrics_address, "hello_app": hello_port is not None,
               "warmup_paths": "/Plone /Plone/search?SearchableText=%", "stall_timeout": 60.0,
               "storage_grace": 30.0, **memory}
    if server == "mod_wsgi":  # instance.Recipe.mod_wsgi_context: the server root is per port
        context.update(mod_wsgi_express=rules.MOD_WSGI_EXPRESS, run_as="www-data",
                       server_root=f"/b/var/p/mod_wsgi-{port}", writable="/b/var/p/chameleon",
                       limit_request_body=1048576)
    return options.render_template(os.path.join(options.TEMPLATES_DIRECTORY, f"{server}.ini.in"), context)


@pytest.mark.parametrize("server", list(options.SERVERS))
def test_hello_ini_is_the_clients_server_section_on_its_own_address(server):
    """hello-address: the same template renders etc/hello.ini, whose [server:main] is the
    client's but for the address, and whose only other section is the hello app."""
    client = configparser.ConfigParser(interpolation=None)
    client.read_string(_render_stage_one(server))
    hello = configparser.ConfigParser(interpolation=None)
    hello.read_string(_render_stage_one(server, blob_sendfile=False, hello_port=9511))
    assert hello.sections() == ["server:main", "app:main"]
    assert dict(hello["app:main"]) == {"use": options.HELLO_APP}
    changed = {k: (v, hello["server:main"].get(k)) for k, v in client["server:main"].items()
               if hello["server:main"].get(k) != v}
    assert set(hello["server:main"]) == set(client["server:main"])
    assert changed and all(old.replace("8081", "9511") == new for old, new in changed.values()), changed


def test_pyruvate_template_sets_only_keys_pyruvate_reads():
    text = _render_stage_one("pyruvate")
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    server = dict(parser["server:main"])
    assert server == {
        "use": "egg:pyruvate#main",
        "socket": "127.0.0.1:8081",
        "workers": "3",
        "max_reuse_count": "0",
        "max_number_headers": "32",
        "send_timeout": "20",  # 8-bit in pyruvate: > 255 would abort start-up
    }
    # stage two (plone.recipe.zope2instance) fills these
    assert "%(eventlog_args)s" in text and "%(pipeline)s" in text


def test_waitress_template():
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(_render_stage_one("waitress"))
    assert parser["server:main"]["use"] == "egg:waitress#main"
    assert parser["server:main"]["listen"] == "127.0.0.1:8081"
    assert parser["server:main"]["threads"] == "3"
    assert parser["logger_waitress"]["qualname"] == "waitress"


def test_template_with_unknown_variable_fails(tmp_path):
    path = tmp_path / "x.ini.in"
    path.write_text("socket = {{ nonsense }}\n")
    with pytest.raises(Exception, match="nonsense"):
        options.render_template(str(path), {})


@pytest.mark.parametrize("trim_blocks", [False, True], ids=["recipe", "ansible-trim_blocks"])
@pytest.mark.parametrize("networks", [[], ["127.0.0.1/32"]], ids=["no-zmi-block", "zmi-block"])
@pytest.mark.parametrize("fd_limit", [20000, 300], ids=["fd-limit-below-2x", "fd-limit-ample"])
@pytest.mark.parametrize("uploads", [False, True], ids=["no-upload-lane", "upload-lane"])
@pytest.mark.parametrize("with_tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("write_lane", [True, False], ids=["write-lane", "no-write-lane"])
def test_haproxy_template_is_valid_for_recipe_and_ansible(tmp_path, trim_blocks, networks, fd_limit, uploads,
                                                           with_tls, write_lane):
    """The recipe renders haproxy.cfg.j2 without trim_blocks, Ansible's template module
    with it: both must give a config haproxy -c accepts (a "{%- endif %}" once glued
    "default_backend" onto the ACL line under Ansible only)."""
    import subprocess

    import jinja2

    pem = tmp_path / "site.pem"
    if with_tls:
        tls.make_self_signed(str(pem), ["127.0.0.1"])
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.dirname(options.HAPROXY_TEMPLATE)),
                             undefined=jinja2.StrictUndefined, trim_blocks=trim_blocks,
                             keep_trailing_newline=True)
    text = env.get_template("haproxy.cfg.j2").render(
        part="t", servers=[{"name": "a", "host": "127.0.0.1", "port": 18081, "maxconn": 2,
                            "wsgi_server": "pyruvate"},
                           {"name": "b", "host": "127.0.0.1", "port": 18082, "maxconn": 2,
                            "wsgi_server": "waitress"}],
        write_lane=write_lane,
        bind="127.0.0.1:18080", stats_bind="127.0.0.1:18404", balance="leastconn",
        health_check="/Plone/@@ok", timeout_queue=60, max_body_size=1024,
        maxconn=10000 if fd_limit == 20000 else 100, fd_limit=fd_limit,
        manage_networks=networks, run_directory=str(tmp_path),
        **edge.template_context(
            ["127.0.0.1", "www.example.org"], per_source_exempt=networks,
            upload_servers=[{"name": "u", "host": "127.0.0.1", "port": 18079, "maxconn": 8,
                             "wsgi_server": "waitress", "max_body": 1024}] if uploads else []),
        **tls.template_context("127.0.0.1:18443" if with_tls else "", str(pem), True, tls.DEFAULT_HSTS_MAX_AGE,
                               redirect_exempt=networks))
    path = tmp_path / "haproxy.cfg"
    path.write_text(text)
    check = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True, timeout=60,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "\n    default_backend zeoclients\n" in text
    # each on a line of its own, not glued onto a comment (trim_blocks once did that)
    assert text.count("\n    timeout connect 1s\n    default-server inter 2s ") == 1 + uploads, text
    assert ("acl admin_network src 127.0.0.1/32" in text) == bool(networks)
    # no admin network: the ZMI is refused to every address, and visitors get no internal headers
    assert ("\n    acl admin_network always_false\n" in text) == (not networks)
    assert ("\n    acl internal_viewer always_false\n" in text) == (not networks)
    assert "\n    http-request deny deny_status 403 if zmi !admin_network\n" in text
    # ulimit-n and no strict-limits only where HAProxy's own 2-fds-per-connection sizing
    # would exceed fd_limit; a line of their own either way
    assert ("\n    ulimit-n 20000\n    no strict-limits\n" in text) == (fd_limit == 20000)
    assert ("strict-limits" in text) == (fd_limit == 20000)
    assert "acl allowed_host req.hdr(host),lower -m reg '^(127\\.0\\.0\\.1|www\\.example\\.org)(:[0-9]+)?$'" in text
    # IPv6 sources are counted per /64, IPv4 per address
    assert ("\n    tcp-request connection track-sc0 src,ipmask(32,64) if !per_source_exempt\n" in text) == bool(networks)
    assert ("\n    tcp-request connection track-sc0 src,ipmask(32,64)\n" in text) == (not networks)
    assert "\n    http-request wait-for-body time 10s\n" in text
    assert ("\n    use_backend uploads if body_large || !body_whole || tus_upload\n" in text) == uploads
    assert ("\n    server u 127.0.0.1:18079 maxconn 8 check" in text) == uploads
    assert ("\n    http-request redirect location https://" in text) == with_tls
    # the load generators' networks are served plain, everyone else is redirected
    exempt = with_tls and bool(networks)
    assert ("\n    acl redirect_exempt src 127.0.0.1/32\n" in text) == exempt
    assert ("code 301 if !{ ssl_fc } !redirect_exempt\n" in text) == exempt
    assert ("code 301 if !{ ssl_fc }\n" in text) == (with_tls and not networks)
    assert ("ssl crt" in text) == with_tls and ("Strict-Transport-Security" in text) == with_tls
    # the pool's balance is the template's variable (loadtests.core.balancers renders variants with
    # another); the write lane's is a hash of its own (one active server: see the template)
    assert re.findall(r"^\s*balance\s+(\S+)", text, re.MULTILINE) == ["leastconn"] + ["source"] * write_lane
    # the write lane: writing methods that the upload lane did not take, one at a time on the
    # first page client, the others backups; each tracks its state in zeoclients
    assert ("\n    use_backend writes if { method POST PUT PATCH DELETE }\n" in text) == write_lane
    assert (text.index("use_backend uploads") < text.index("use_backend writes")) if uploads and write_lane else True
    assert ("\n    server a 127.0.0.1:18081 maxconn 1 track zeoclients/a" in text) == write_lane
    assert ("\n    server b 127.0.0.1:18082 maxconn 1 backup track zeoclients/b" in text) == write_lane
    assert ("backend writes" in text) == write_lane
    # read your own writes: a write's answer names its server's position in a cookie (Secure over
    # TLS), set by the writes backend or, without the write lane, by the pool for writing methods;
    # the pool sends the next read there, and a read's answer clears the cookie
    pinned = re.findall(r"^    use-server (\S+) if \{ req.cook\(lb_wrote\) -m str (\d) \}(?:\s+#.*)?$", text, re.M)
    assert pinned == [("a", "1"), ("b", "2")]
    cookies = [text.count(f'"lb_wrote={i}; Max-Age=10; Path=/; HttpOnly; SameSite=Lax') for i in (1, 2)]
    assert cookies == [2, 2]
    assert text.count(" if { srv_name b } { ssl_fc }\n") == text.count(" if { srv_name b } !{ ssl_fc }\n") == write_lane
    by_pool = " if { var(txn.writing) -m bool } { srv_name b } { ssl_fc }\n"
    assert text.count(by_pool) == (not write_lane)
    assert ("\n    http-request set-var(txn.writing) bool(true) if { method POST PUT PATCH DELETE }\n" in text) == (
        not write_lane)
    cleared = '"lb_wrote=; Max-Age=0; Path=/; HttpOnly; SameSite=Lax" if { var(txn.wrote) -m found }'
    assert text.count(cleared) == 1
    assert (cleared + " !{ var(txn.writing) -m bool }\n" in text) == (not write_lane)


@pytest.mark.parametrize("value, expected", [
    ("on", True), ("off", False), ("true", True), ("false", False), (" ON ", True), ("Off", False),
])
def test_switch_parses(value, expected):
    assert options.parse_switch("instance", "blob-sendfile", value) is expected


@pytest.mark.parametrize("value", ["", "1", "yes", "enabled", "onn"])
def test_switch_refuses_others(value):
    with pytest.raises(zc.buildout.UserError) as err:
        options.parse_switch("instance", "blob-sendfile", value)
    assert str(err.value) == f"[instance] blob-sendfile = {value!r} is invalid: expected on or off"


def test_blob_filter_goes_first_in_pipeline():
    stock = "translogger\n                egg:Zope#httpexceptions\n                zope"
    assert options.add_pipeline_filter(stock).split() == [
        "blobsendfile", "translogger", "egg:Zope#httpexceptions", "zope"]
    # an operator's pipeline that already names it keeps its order
    own = "translogger blobsendfile zope"
    assert options.add_pipeline_filter(own).split() == own.split()


@pytest.mark.parametrize("flag, name", [("blob_sendfile", "blobsendfile"), ("explicit_tx", "explicittx")])
@pytest.mark.parametrize("server", ["pyruvate", "waitress"])
def test_template_defines_a_plain_filter_only_when_on(server, flag, name):
    on = configparser.ConfigParser(interpolation=None)
    on.read_string(_render_stage_one(server, **{flag: True}))
    assert dict(on[f"filter:{name}"]) == {"use": f"egg:plonedeploy.runtime#{name}"}
    off = configparser.ConfigParser(interpolation=None)
    off.read_string(_render_stage_one(server, **{flag: False}))
    assert f"filter:{name}" not in off
    assert set(off.sections()) == set(on.sections()) - {f"filter:{name}"}


@pytest.mark.parametrize("server", ["pyruvate", "waitress"])
def test_template_defines_metrics_filter_only_with_address(server):
    on = configparser.ConfigParser(interpolation=None)
    on.read_string(_render_stage_one(server, metrics_address="127.0.0.1:8091"))
    # The probes' settings (plonedeploy.runtime.probes); a literal % doubled for stage two.
    assert dict(on["filter:metrics"]) == {
        "use": "egg:plonedeploy.runtime#metrics", "address": "127.0.0.1:8091", "threads": "3",
        "warmup_paths": "/Plone /Plone/search?SearchableText=%%", "warmup_host": "127.0.0.1:8081",
        "stall_timeout": "60.0", "storage_grace": "30.0"}
    off = configparser.ConfigParser(interpolation=None)
    off.read_string(_render_stage_one(server))
    assert set(off.sections()) == set(on.sections()) - {"filter:metrics"}
    # The memory watchdog's settings only with a limit (plonedeploy.runtime.watchdog).
    watched = configparser.ConfigParser(interpolation=None)
    watched.read_string(_render_stage_one(
        server, metrics_address="127.0.0.1:8091", memory_limit=1073741824, memory_limit_grace="60",
        memory_limit_restarts="3", memory_limit_peers="127.0.0.1:8092", memory_state_file="/srv/var/instance/m%",
        check_window=9))
    assert {k: v for k, v in watched["filter:metrics"].items() if k not in on["filter:metrics"]} == {
        "memory_limit": "1073741824", "memory_limit_grace": "60", "memory_limit_restarts": "3",
        "memory_limit_peers": "127.0.0.1:8092", "memory_state_file": "/srv/var/instance/m%%", "check_window": "9"}
    off_limit = configparser.ConfigParser(interpolation=None)
    off_limit.read_string(_render_stage_one(server, metrics_address="127.0.0.1:8091", memory_limit="off"))
    assert dict(off_limit["filter:metrics"]) == dict(on["filter:metrics"])


def test_metrics_filter_goes_after_blob_filter():
    stock = "translogger\negg:Zope#httpexceptions\nzope"
    with_blob = options.add_pipeline_filter(stock)
    assert options.insert_pipeline_filter_after(with_blob, "metrics", "blobsendfile").split() == [
        "blobsendfile", "metrics", "translogger", "egg:Zope#httpexceptions", "zope"]
    # blob-sendfile = off: first; named already: left where the operator put it
    assert options.insert_pipeline_filter_after(stock, "metrics", "blobsendfile").split()[0] == "metrics"
    own = "blobsendfile translogger metrics zope"
    assert options.insert_pipeline_filter_after(own, "metrics", "blobsendfile").split() == own.split()


@pytest.mark.parametrize("server, cores, clients, expected", [
    ("pyruvate", 2, 2, 2),   # the demo: clients = cores
    ("pyruvate", 8, 2, 2),   # more cores do not make one Zope process use more than one
    ("waitress", 2, 3, 1),   # more clients than cores
    ("bjoern", 8, 1, 1),     # single-threaded server
    ("gevent", 2, 2, 1),
])
def test_auto_threads_rule(server, cores, clients, expected):
    assert options.auto_threads is rules.auto_threads  # one rule, re-exported for the recipe
    threads, reason = options.auto_threads(server, cores, clients)
    assert threads == expected
    assert reason  # logged by bin/buildout next to the choice


@pytest.mark.parametrize("value, expected", [
    ("512MB", 512 * 1024 ** 2), ("1GB", 1024 ** 3), ("1 gb", 1024 ** 3), ("65536", 65536), ("64KB", 65536),
])
def test_byte_size_parses(value, expected):
    assert options.parse_byte_size("instance", "zodb-cache-memory", value) == expected


@pytest.mark.parametrize("value", ["", "0", "0MB", "1TB", "-1GB", "1.5GB", "lots"])
def test_byte_size_refuses_others(value):
    with pytest.raises(zc.buildout.UserError) as err:
        options.parse_byte_size("instance", "zodb-cache-memory", value)
    assert "zodb-cache-memory" in str(err.value) and "512MB" in str(err.value)


def test_threads_refuses_words_other_than_auto():
    with pytest.raises(zc.buildout.UserError) as err:
        options.parse_threads("instance", "pyruvate", "many")
    assert str(err.value) == ("[instance] threads = 'many' is invalid: "
                              "expected a positive integer such as 2, or auto")


# storage = relstorage (docs/how-to/relstorage.md)

@pytest.mark.parametrize("value, expected", [
    ("host=127.0.0.1 port=5432 dbname=plone user=plone passfile=/srv/var/pgpass",
     {"host": "127.0.0.1", "port": "5432", "dbname": "plone", "user": "plone", "passfile": "/srv/var/pgpass"}),
    ("dbname=plone", {"dbname": "plone"}),
    ("  dbname = 'my db'  passfile='/a b/it\\'s'  sslmode=require ",
     {"dbname": "my db", "passfile": "/a b/it's", "sslmode": "require"}),
])
def test_dsn_parses_libpq_pairs(value, expected):
    assert options.parse_dsn("instance", "relstorage-dsn", value) == expected


@pytest.mark.parametrize("value, fragment", [
    ("", "expected libpq key=value pairs"),
    ("postgresql://plone@127.0.0.1/plone", "expected libpq key=value pairs"),
    ("host=127.0.0.1 port=5432", "(dbname is missing)"),
    ("dbname=plone dbname=other", "('dbname' given twice)"),
    ("dbname=plone colour=blue", "('colour' is not a libpq keyword)"),
    ("dbname=plone user", "expected libpq key=value pairs"),
    ("dbname=$PGDATABASE", "without '$'"),
    ("dbname=plone password=hunter2", "without password (zope.conf is world-readable"),
])
def test_dsn_refuses_others(value, fragment):
    with pytest.raises(zc.buildout.UserError) as err:
        options.parse_dsn("instance", "relstorage-dsn", value)
    assert str(err.value).startswith("[instance] relstorage-dsn = ")
    assert fragment in str(err.value)


@pytest.mark.parametrize("value", [
    "dbname=plone password=hunter2",
    "dbname=plone password = 'hunter2 x'",
    "postgresql://plone:hunter2@127.0.0.1/plone",
])
def test_dsn_errors_never_repeat_a_password(value):
    with pytest.raises(zc.buildout.UserError) as err:
        options.parse_dsn("instance", "relstorage-dsn", value)
    assert "hunter2" not in str(err.value)
    assert "***" in str(err.value)


@pytest.mark.parametrize("blobs, shared", [("database", "false"), ("shared-directory", "true")])
def test_relstorage_lines_for_the_stock_recipe(blobs, shared):
    assert options.relstorage_lines("dbname=plone", blobs, "/srv/blobs").splitlines() == [
        "type postgresql", "dsn dbname=plone", "blob-dir /srv/blobs", f"shared-blob-dir {shared}"]


def test_storage_and_blob_choices_name_allowed_values():
    with pytest.raises(zc.buildout.UserError) as err:
        options.check_choice("instance", "storage", "s3", options.STORAGES)
    assert str(err.value) == "[instance] storage = 's3' is invalid: expected one of: zeo, relstorage"
    with pytest.raises(zc.buildout.UserError) as err:
        options.check_choice("instance", "relstorage-blobs", "nfs", tuple(options.RELSTORAGE_BLOBS))
    assert str(err.value) == ("[instance] relstorage-blobs = 'nfs' is invalid: expected one of: "
                              "database, shared-directory")


def test_scram_verifier_format_and_salt():
    from plonedeploy.stack import storage

    verifier = storage.scram_verifier("pencil", salt=b"\x00" * 16)
    assert re.fullmatch(r"SCRAM-SHA-256\$4096:AAAAAAAAAAAAAAAAAAAAAA==\$[A-Za-z0-9+/]{43}=:[A-Za-z0-9+/]{43}=",
                        verifier)
    assert verifier == storage.scram_verifier("pencil", salt=b"\x00" * 16)
    assert storage.scram_verifier("pencil") != storage.scram_verifier("pencil")  # random salt
    with pytest.raises(ValueError):
        storage.scram_verifier("p\u00e9ncil")


def test_grant_search_opens_exactly_the_closed_parents_by_acl():
    """A checkout under closed directories (a mktemp -d clone, root's home): the user gets
    search permission (an ACL entry u:<user>:x) on each directory it cannot enter and on
    no other, checked as that user; a second call grants nothing; a file it cannot read
    stays an error (search is all it gets). Root only: the check runs as the user."""
    import pwd

    from plonedeploy.runtime import access

    if os.geteuid() != 0:
        pytest.fail("runs as root only (bin/stack and bin/postgresql grant as root)")
    user = pwd.getpwnam("nobody")
    base = tempfile.mkdtemp(prefix="plonedeploy-reach-")  # mode 0700, like a fresh clone's parent
    try:
        open_dir = os.path.join(base, "open")
        closed = os.path.join(open_dir, "closed")
        os.makedirs(os.path.join(closed, "inner"))
        os.chmod(open_dir, 0o755)
        os.chmod(closed, 0o700)
        target = os.path.join(closed, "inner", "data")
        said = []
        assert access.grant_search("nobody", [target], "a test", said.append) == [base, closed]
        assert said == [f"granted user 'nobody' search permission (setfacl -m u:nobody:x) on {base}, {closed}: "
                        "a test"]
        for directory, granted in ((base, True), (open_dir, False), (closed, True)):
            acl = subprocess.run(["getfacl", "-cp", directory], capture_output=True, text=True, timeout=30).stdout
            assert ("user:nobody:--x" in acl) is granted, (directory, acl)
        assert stat.S_IMODE(os.stat(closed).st_mode) & 0o007 == 0  # others: still nothing
        assert access.grant_search("nobody", [target], "a test", said.append) == [] and len(said) == 1
        secret = os.path.join(closed, "inner", "secret")
        with open(secret, "w") as fp:
            fp.write("x")
        os.chmod(secret, 0o600)
        with pytest.raises(access.AccessError, match=f"user 'nobody' .* cannot read {secret}"):
            access.grant_search("nobody", [secret], "a test", said.append)
        assert access._check_as(user, [target]) == {target: None}
    finally:
        shutil.rmtree(base)


def test_become_gives_the_client_its_files_then_drops_for_good():
    """What a ZEO client's script runs first when root starts it (plonedeploy.runtime.access
    .become): the user gets search permission on the way to what it runs from, owns the
    client's directories (recursively, root's files in them included) and logs (with their
    rotations), but no link's target; then the process is that user for good (real,
    effective and saved uid; its groups; umask 027; HOME/USER/LOGNAME), and what it creates is
    its own. In a forked child: the test process stays root. Not root: it changes nothing."""
    import pwd

    from plonedeploy.runtime import access

    if os.geteuid() != 0:
        pytest.fail("runs as root only (a client script drops only when root starts it)")
    user = pwd.getpwnam("nobody")
    base = tempfile.mkdtemp(prefix="plonedeploy-become-")  # mode 0700: nobody cannot enter it
    try:
        home, logs = os.path.join(base, "var", "client"), os.path.join(base, "var", "log")
        os.makedirs(os.path.join(home, "import"))
        os.makedirs(logs)
        for name in ("client.log", "client.log.1", "other.log"):
            open(os.path.join(logs, name), "w").close()
        root_file = os.path.join(base, "root-only")
        open(root_file, "w").close()
        os.symlink(root_file, os.path.join(home, "link"))  # must stay root's
        os.chmod(logs, 0o755)  # root's: the user could not create a log in it itself
        layout = {"directories": [home], "files": [os.path.join(logs, "client.log"),
                                                  os.path.join(logs, "client-access.log")],  # missing
                  "readable": [], "reach": [home]}
        def as_nobody():  # in a forked child: become nobody, report what it is, try what it may and may not
            # Only the test's paths to reach: not the interpreter's (under /root here),
            # which would give nobody search permission there for good.
            sys.path[:], sys.executable = [], "/usr/bin/python3"
            access.become("nobody", layout)
            with open(os.path.join(home, "Z4.pid"), "w") as fp:
                fp.write("1")
            with open(os.path.join(logs, "client-access.log"), "a") as fp:
                fp.write("a line\n")
            try:
                open(root_file, "a").close()
                wrote_root = True
            except PermissionError:
                wrote_root = False
            try:
                os.setuid(0)
                regained = True
            except PermissionError:
                regained = False
            return {"uids": os.getresuid(), "gids": os.getresgid(), "groups": sorted(os.getgroups()),
                    "umask": os.umask(0o027), "env": [os.environ.get(k) for k in ("HOME", "USER", "LOGNAME")],
                    "wrote_root": wrote_root, "regained": regained}

        seen = access.in_child(as_nobody)  # the child's traceback, if any, is in the captured stderr
        assert seen["uids"] == [user.pw_uid] * 3 and seen["gids"] == [user.pw_gid] * 3
        assert seen["groups"] == sorted(set(os.getgrouplist("nobody", user.pw_gid)))
        assert seen["umask"] == 0o027 and seen["env"] == [user.pw_dir, "nobody", "nobody"]
        assert not seen["wrote_root"] and not seen["regained"]
        for path in (home, os.path.join(home, "import"), os.path.join(home, "Z4.pid"),
                     os.path.join(logs, "client.log"), os.path.join(logs, "client.log.1"),
                     os.path.join(logs, "client-access.log")):
            assert os.lstat(path).st_uid == user.pw_uid, path
        for path in (os.path.join(logs, "other.log"), root_file, os.path.join(home, "link")):
            assert os.lstat(path).st_uid == 0, path  # another log, and neither a link nor its target
        acl = subprocess.run(["getfacl", "-cp", base], capture_output=True, text=True, timeout=30).stdout
        assert "user:nobody:--x" in acl, acl  # search on the way, granted before the drop
    finally:
        shutil.rmtree(base)


def test_find_program_names_what_it_tried():
    assert options.find_program(None, ["no-such-program-x", "sh"], "{tried}") == shutil.which("sh")
    with pytest.raises(zc.buildout.UserError, match=r"^missing: no-such-a, /no/such-b$"):
        options.find_program(None, ["no-such-a", "/no/such-b"], "missing: {tried}")
    with pytest.raises(zc.buildout.UserError, match=r"^missing: /opt/x$"):
        options.find_program("/opt/x", ["sh"], "missing: {tried}")  # a configured one only


def test_write_checked_replaces_only_what_the_check_accepts(tmp_path):
    path = tmp_path / "parts" / "x" / "site.cfg"
    options.write_checked(str(path), "good\n", lambda tmp: None)
    assert path.read_text() == "good\n" and oct(path.stat().st_mode & 0o777) == "0o644"

    def refuse(tmp):
        assert tmp.endswith(".cfg") and open(tmp).read() == "bad\n"  # the checker sees the new text
        raise zc.buildout.UserError("refused")

    with pytest.raises(zc.buildout.UserError, match="refused"):
        options.write_checked(str(path), "bad\n", refuse)
    assert path.read_text() == "good\n"  # the file in use is untouched
    assert os.listdir(path.parent) == ["site.cfg"]  # no temporary file left


# --------------------------------------------------------------- the option tables


RECIPE_PAGE = os.path.join(ROOT, "docs", "reference", "recipe.md")


def _gen_reference():
    import gen_reference  # scripts/ (pytest.ini: pythonpath)

    return gen_reference


def test_option_reference_is_generated_from_the_tables():
    """docs/reference/recipe.md's option tables are what ``plonedeploy.recipe.optionsdoc.render``
    makes of ``optiontables``, links and all (scripts/gen_reference.py writes them with it:
    run it after changing a table)."""
    from plonedeploy.recipe import optionsdoc

    with open(RECIPE_PAGE, encoding="utf-8") as fp:
        text = fp.read()
    assert _gen_reference().render_recipe(text) == text
    assert _gen_reference().main(["--check", os.path.relpath(RECIPE_PAGE, ROOT)]) == 0
    assert optionsdoc.render(text) == text  # the links too: optiontables names the pages as they are


def test_stale_or_badly_marked_option_tables_fail_the_check(tmp_path, capsys):
    """A hand edit in a table fails ``gen_reference.py --check`` (exit 1, naming the page) and
    a run writes the table back; an unknown or missing marker exits 2 naming both."""
    from plonedeploy.recipe import optionsdoc

    gen = _gen_reference()
    page = os.path.join("docs", "reference", "recipe.md")
    (tmp_path / "docs" / "reference").mkdir(parents=True)
    with open(RECIPE_PAGE, encoding="utf-8") as fp:
        text = fp.read()
    stale = text.replace("| `bind` | `127.0.0.1:8080` |", "| `bind` | `0.0.0.0:80` |")
    assert stale != text
    (tmp_path / page).write_text(stale)
    assert gen.main(["--root", str(tmp_path), "--check", page]) == 1
    assert f"{page} differs from its source" in capsys.readouterr().err
    assert gen.main(["--root", str(tmp_path), page]) == 0
    assert (tmp_path / page).read_text() == text
    (tmp_path / page).write_text(text.replace("<!-- options: stack -->", "<!-- options: stak -->"))
    assert gen.main(["--root", str(tmp_path), "--check", page]) == 2
    assert "unknown ['stak'], missing ['stack']" in capsys.readouterr().err
    with pytest.raises(ValueError, match="has no '<!-- /options -->' after it"):
        optionsdoc.render(text + "<!-- options: stack -->\n")


@pytest.mark.parametrize("recipe", sorted(optiontables.TABLES))
def test_option_table_is_consistent(recipe):
    table = optiontables.TABLES[recipe]
    names = [option.name for option in table]
    assert len(names) == len(set(names))
    for option in table:
        assert option.doc and "|" not in option.doc + str(option.allowed), option
        # a computed or required default says what it is
        assert option.default is not None or option.shown_default, option
        if isinstance(option.allowed, tuple) and option.default:
            assert option.default in option.allowed, option


def test_undeclared_option_read_raises():
    raw = {"bind": "127.0.0.1:9900", "secret": "x"}
    opts = optiontables.DeclaredOptions("lb", raw, optiontables.HAPROXY)
    assert (opts["bind"], opts.get("balance"), "bind" in opts) == ("127.0.0.1:9900", None, True)
    assert opts.setdefault("balance") == "leastconn" and raw["balance"] == "leastconn"
    assert opts.setdefault("template", "/t.j2") == "/t.j2"
    for read in (lambda: opts["secret"], lambda: opts.get("secret"), lambda: "secret" in opts,
                 lambda: opts.setdefault("secret", "y")):
        with pytest.raises(optiontables.UndeclaredOption, match=r"\[lb\] option 'secret' is read but not declared"):
            read()
    with pytest.raises(ValueError, match="no declared default"):
        opts.setdefault("backends")


def test_recipes_read_only_declared_options(tmp_path):
    """The varnish, haproxy and stack recipes, every optional feature on, read their parts'
    options only through their tables (a slip raises UndeclaredOption here) and store every
    declared non-empty default in the part (where other parts and buildout's records read it)."""
    from plonedeploy.recipe import haproxy, stack, varnish

    buildout = fake_buildout(tmp_path)
    buildout["varnish"] = {"clients": "instance uploads", "metrics-address": "127.0.0.1:9912",
                           "purge-networks": "10.0.0.0/8"}
    varnish.Recipe(buildout, "varnish", buildout["varnish"])
    buildout["haproxy"] = {"backends": "instance", "upload-backends": "uploads", "bind": "127.0.0.1:9903",
                           "stats-bind": "127.0.0.1:9904", "tls-bind": "127.0.0.1:9905", "cache": "varnish",
                           "manage-networks": "127.0.0.1/32", "max-body-size": "1048576000"}
    haproxy.Recipe(buildout, "haproxy", buildout["haproxy"])
    buildout["stack"] = {"zeoserver": "zeoserver", "clients": "instance", "upload-clients": "uploads",
                         "haproxy": "haproxy", "cache": "varnish"}
    stack.Recipe(buildout, "stack", buildout["stack"])
    for recipe in ("varnish", "haproxy", "stack"):
        for option in optiontables.TABLES[recipe]:
            if option.default:
                assert option.name in buildout[recipe], (recipe, option.name)
    assert buildout["haproxy"]["balance"] == optiontables.default_of(optiontables.HAPROXY, "balance")
    assert varnish.DEFAULT_COOKIE_ALLOWLIST == tuple(buildout["varnish"]["cookie-allowlist"].split())


LDCONFIG = """\
1234 libs found in cache `/etc/ld.so.cache'
	libjemalloc.so.2 (libc6) => /usr/lib/i386-linux-gnu/libjemalloc.so.2
	libjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2
	libjemalloc.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so
"""


def test_jemalloc_is_looked_up_by_triplet_then_ldconfig():
    assert clientoptions.jemalloc_candidates("x86_64-linux-gnu", LDCONFIG) == [
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "/usr/lib/i386-linux-gnu/libjemalloc.so.2"]
    # a Python without a triplet: ldconfig's order; no library listed, no triplet: nothing
    assert clientoptions.jemalloc_candidates(None, LDCONFIG) == [
        "/usr/lib/i386-linux-gnu/libjemalloc.so.2", "/lib/x86_64-linux-gnu/libjemalloc.so.2"]
    assert clientoptions.jemalloc_candidates("", "") == []


@pytest.mark.parametrize("given, expected", [
    ({}, ("system", "", {})),
    ({"malloc": " system ", "malloc-arena-max": "02"}, ("system", "2", {"MALLOC_ARENA_MAX": "2"})),
    ({"malloc": "jemalloc", "environment-vars": "TUS_TMP_FILE_DIR /tmp/tus"},
     ("jemalloc", "", {"LD_PRELOAD": "/lib/libjemalloc.so.2"})),
])
def test_malloc_options_resolve_to_the_server_environment(given, expected):
    options = dict(given)
    environment = clientoptions.malloc_environment("c", options, find=lambda: "/lib/libjemalloc.so.2")
    assert (options["malloc"], options["malloc-arena-max"], environment) == expected


@pytest.mark.parametrize("given, message", [
    ({"malloc": "tcmalloc"}, "[c] malloc = 'tcmalloc' is invalid: expected one of: system, jemalloc"),
    ({"malloc-arena-max": "0"}, "[c] malloc-arena-max = '0' is invalid: expected a positive integer such as 2"),
    ({"malloc-arena-max": "two"}, "[c] malloc-arena-max = 'two' is invalid: expected a positive integer"),
    ({"malloc": "jemalloc", "malloc-arena-max": "2"},
     "[c] malloc-arena-max = '2' is invalid: expected empty with malloc = jemalloc"),
    ({"environment-vars": "LD_PRELOAD /usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
     "[c] environment-vars sets LD_PRELOAD, which Zope sets only once the process runs"),
    ({"environment-vars": "TZ UTC\nMALLOC_ARENA_MAX 2"}, "[c] environment-vars sets MALLOC_ARENA_MAX"),
    # no library: the option, its values and the package to install
    ({"malloc": "jemalloc"}, "[c] malloc = jemalloc needs libjemalloc.so.2, which is not on this host (looked "
     "in the multiarch directories and ldconfig -p): apt-get install libjemalloc2 (make system installs it), "
     "or set malloc to another of: system, jemalloc"),
])
def test_malloc_options_refuse_bad_values_naming_the_option(given, message):
    with pytest.raises(zc.buildout.UserError) as err:
        clientoptions.malloc_environment("c", dict(given), find=lambda: None)
    assert str(err.value).startswith(message), str(err.value)


def test_malloc_initialization_preloads_jemalloc_into_the_processes_it_starts():
    """The lines bin/<part> begins with: a process started after them (as the ctl script
    starts the server) has this host's jemalloc mapped and glibc's arena variable, the
    library once and before any other of LD_PRELOAD. Needs Debian's libjemalloc2 (make
    system); without it: skipped, failed in CI (tests/unavailable.py)."""
    library = clientoptions.find_jemalloc()
    if library is None:
        unavailable("libjemalloc.so.2 not installed (scripts/install-system.sh installs libjemalloc2)")
    assert clientoptions.malloc_initialization({}) == ""
    code = clientoptions.malloc_initialization({"LD_PRELOAD": library, "MALLOC_ARENA_MAX": "2"}) + (
        "import json, os, subprocess\n"
        "maps = subprocess.run(['cat', '/proc/self/maps'], capture_output=True, text=True, check=True).stdout\n"
        "print(json.dumps([os.environ['LD_PRELOAD'], os.environ['MALLOC_ARENA_MAX'], 'libjemalloc' in maps]))\n")
    for before, preload in (("", library), (library, library), (f"{library}:/x/other.so", f"{library} /x/other.so")):
        env = {key: value for key, value in os.environ.items() if key not in ("LD_PRELOAD", "MALLOC_ARENA_MAX")}
        if before:
            env["LD_PRELOAD"] = before
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                             check=True).stdout
        assert json.loads(out) == [preload, "2", True], before


# RelStorage tuning (issue 32; docs/how-to/relstorage.md#tuning)

def _tuning(blobs="database", **given):
    table = optiontables.DeclaredOptions("instance", {k.replace("_", "-"): v for k, v in given.items()},
                                         optiontables.INSTANCE)
    return clientoptions.relstorage_tuning("instance", table, blobs)


def test_relstorage_tuning_writes_relstorage_keys_only_when_set():
    assert _tuning() == []  # RelStorage's defaults: 10 MB, no persistent cache, unbounded blob cache
    assert _tuning(relstorage_cache_local_mb=" 0100 ", relstorage_cache_local_dir="/srv/var/rs-cache",
                   relstorage_blob_cache_size="1GB") == [
        ("cache-local-mb", "100"), ("cache-local-dir", "/srv/var/rs-cache"), ("blob-cache-size", str(2**30))]
    assert _tuning(relstorage_cache_local_mb="0") == [("cache-local-mb", "0")]
    lines = options.relstorage_lines("dbname=plone", "database", "/srv/blobs", [("cache-local-mb", "100")])
    assert lines.splitlines()[-2:] == ["shared-blob-dir false", "cache-local-mb 100"]


@pytest.mark.parametrize("given, message", [
    ({"relstorage_cache_local_mb": "-1"}, "[instance] relstorage-cache-local-mb = '-1' is invalid: expected a whole "
                                          "number of MB >= 0 (0: no local pickle cache), or empty for RelStorage's 10"),
    ({"relstorage_cache_local_mb": "10MB"}, "relstorage-cache-local-mb = '10MB' is invalid"),
    ({"relstorage_cache_local_dir": "var/cache"}, "[instance] relstorage-cache-local-dir = 'var/cache' is invalid: "
                                                  "expected an absolute path, or empty (no persistent cache)"),
    ({"relstorage_blob_cache_size": "lots"}, "[instance] relstorage-blob-cache-size = 'lots' is invalid: "
                                             "expected a size in bytes such as 512MB, 1GB or 65536"),
])
def test_relstorage_tuning_errors_name_the_option_and_allowed_values(given, message):
    with pytest.raises(zc.buildout.UserError) as err:
        _tuning(**given)
    assert message in str(err.value)


def test_blob_cache_size_is_refused_with_a_shared_blob_directory():
    with pytest.raises(zc.buildout.UserError) as err:
        _tuning("shared-directory", relstorage_blob_cache_size="1GB")
    assert str(err.value) == ("[instance] relstorage-blob-cache-size = '1GB' is invalid: expected empty with "
                              "relstorage-blobs = shared-directory (the blobs there are no cache)")


def test_transaction_mode_choices_and_the_filter_place_in_the_pipeline():
    # unset: explicit for a RelStorage client (it polls PostgreSQL per transaction), Zope's
    # stock implicit for a ZEO client
    on_zeo, on_relstorage = {}, {}
    assert clientoptions.transaction_mode("instance", on_zeo, "zeo") is False
    assert clientoptions.transaction_mode("instance", on_relstorage, "relstorage") is True
    assert (on_zeo["transaction-mode"], on_relstorage["transaction-mode"]) == ("implicit", "explicit")
    assert clientoptions.transaction_mode("instance", {"transaction-mode": " explicit "}, "zeo") is True
    assert clientoptions.transaction_mode("instance", {"transaction-mode": "implicit"}, "relstorage") is False
    with pytest.raises(zc.buildout.UserError) as err:
        clientoptions.transaction_mode("instance", {"transaction-mode": "manual"}, "relstorage")
    assert str(err.value) == ("[instance] transaction-mode = 'manual' is invalid: expected one of: "
                              "implicit, explicit")
    # innermost: right before the Zope app, after the filters that wrap the response
    assert options.insert_pipeline_filter_before_app(
        "blobsendfile\nmetrics\ntranslogger\negg:Zope#httpexceptions\nzope", "explicittx").split() == [
        "blobsendfile", "metrics", "translogger", "egg:Zope#httpexceptions", "explicittx", "zope"]
    assert options.insert_pipeline_filter_before_app("zope explicittx", "explicittx").split() == ["zope", "explicittx"]


def test_added_delay_is_off_by_default_and_a_wrong_value_names_the_option():
    given = {}
    assert clientoptions.added_delay("instance", given) == 0 and given["added-delay"] == "0"
    assert clientoptions.added_delay("instance", {"added-delay": " 50 "}) == 50
    with pytest.raises(zc.buildout.UserError) as err:
        clientoptions.added_delay("instance", {"added-delay": "50ms"})
    assert str(err.value) == ("[instance] added-delay = '50ms' is invalid: expected a whole number of "
                              "milliseconds from 0 to 10000 (0: no delay)")


@pytest.mark.parametrize("server", ["pyruvate", "waitress"])
def test_template_defines_the_delay_filter_only_with_a_delay(server):
    on = configparser.ConfigParser(interpolation=None)
    on.read_string(_render_stage_one(server, added_delay=50))
    assert dict(on["filter:delay"]) == {"use": "egg:plonedeploy.runtime#delay", "delay_ms": "50"}
    off = configparser.ConfigParser(interpolation=None)
    off.read_string(_render_stage_one(server, added_delay=0))
    assert set(off.sections()) == set(on.sections()) - {"filter:delay"}


def test_postgresql_settings_become_command_line_settings_after_the_parts_own():
    from plonedeploy.stack import postgresql, storage

    settings = storage.parse_postgresql_settings(
        "\n shared_buffers = 256MB\n  work_mem=16MB\nplan_cache_mode = force_generic_plan\njit = off\n"
        "random_page_cost = 1.1\n")
    assert settings == {"shared_buffers": "256MB", "work_mem": "16MB", "plan_cache_mode": "force_generic_plan",
                        "jit": "off", "random_page_cost": "1.1"}
    config = {"bin_directory": "/pg/bin", "data_directory": "/d", "host": "127.0.0.1", "port": 8432,
              "socket_directory": "/s", "settings": settings}
    argv = postgresql.server_argv(config)
    assert argv[:3] == ["/pg/bin/postgres", "-D", "/d"]
    assert argv[3:9] == ["-c", "listen_addresses=127.0.0.1", "-c", "port=8432", "-c", "unix_socket_directories=/s"]
    assert argv[9:] == ["-c", "shared_buffers=256MB", "-c", "work_mem=16MB", "-c", "plan_cache_mode=force_generic_plan",
                        "-c", "jit=off", "-c", "random_page_cost=1.1"]
    del config["settings"]  # a postgresql.json written before the option
    assert len(postgresql.server_argv(config)) == 9


@pytest.mark.parametrize("text, fragment", [
    ("port = 9999", "names of: shared_buffers, work_mem"),          # the part's own
    ("shared_buffers 256MB", "'name = value' lines"),
    ("work_mem = 4MB\nwork_mem = 8MB", "each name once"),
    ("work_mem = 4MB -c port=1", "values such as 256MB, off or 1.1 (line 'work_mem = 4MB -c port=1')"),
    ("jit = 'off'", "values such as 256MB"),
])
def test_postgresql_settings_refuse_other_names_and_values(text, fragment):
    from plonedeploy.stack import storage

    with pytest.raises(ValueError) as err:
        storage.parse_postgresql_settings(text)
    assert fragment in str(err.value)
