"""The recipes run by a real bin/buildout in a temporary directory.

With this checkout's pinned eggs (``make build`` fetched them) and ``newest = false``, so
nothing is downloaded and each buildout takes seconds -- except the servers' eggs that the
demo's parts do not use (gunicorn, cheroot, granian, bjoern, pyuwsgi, gevent and their
dependencies): the first build of ``servers_build`` (conftest.py, one client part per
``wsgi-server`` value) fetches those pinned eggs into eggs/ and compiles bjoern (~1 min).
(``offline = true`` would be the natural setting, but zc.buildout 6.0.1 then fails to find
eggs in the v5 eggs directory.) Each bad option must stop bin/buildout with a one-line
UserError that names the part, the option, the value and what is allowed, before anything
is installed.
"""
import configparser
import json
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from conftest import ROOT, develop_eggs, setup_budget, stop_group
from loadtests.core.extrabuild import BUILDOUT, checkout_header
from plonedeploy.recipe import clientoptions
from plonedeploy.recipe.options import SERVERS
from plonedeploy.stack import rules
from plonedeploy.stack.templates import HAPROXY_TEMPLATE, TEMPLATES_DIRECTORY, render_template

pytestmark = pytest.mark.buildout

# The [buildout] section is loadtests.core.extrabuild.checkout_header's, as the load tools' own
# builds have it, with the session's develop eggs (conftest.develop_eggs); the rest is
# str.format'ed with root=ROOT and develop_eggs.
#: The astlock filter the recipe puts before the app on Python < 3.12 (plonedeploy.runtime.astlock);
#: the buildout's Python is made by the Makefile's $(PYTHON), as the tests' own.
AST_LOCK = ["astlock"] if sys.version_info < (3, 12) else []

BASE = checkout_header(os.path.join(ROOT, "versions.cfg"),
                       ["zeoserver", "instance", "client2", "uploads", "haproxy", "stack"],
                       develop_eggs="{develop_eggs}") + """
[zeoserver]
recipe = plone.recipe.zeoserver
zeo-address = 127.0.0.1:18100

[instance]
recipe = plonedeploy.recipe:instance
http-address = 127.0.0.1:18081
zeo-client = on
zeo-address = 127.0.0.1:18100
eggs =

[client2]
<= instance
wsgi-server = waitress
http-address = 127.0.0.1:18082
threads = 3

[uploads]
<= instance
wsgi-server = waitress
http-address = 127.0.0.1:18079
threads = 1

[haproxy]
recipe = plonedeploy.recipe:haproxy
backends = instance client2
upload-backends = uploads
bind = 127.0.0.1:18080
stats-bind = 127.0.0.1:18404
# BASE's clients have no metrics-address, so no probes: Zope's own path (the default
# /readyz on the metrics addresses: test_metrics_filter_wired_per_client, test_probes.py)
health-check = /Plone/@@ok

[stack]
recipe = plonedeploy.recipe:stack
zeoserver = zeoserver
clients = instance client2
upload-clients = uploads
haproxy = haproxy
"""


def buildout(directory, extra=""):
    """Write base.cfg (BASE) and buildout.cfg (extends it, plus ``extra``); run bin/buildout."""
    (directory / "base.cfg").write_text(BASE.format(root=ROOT, develop_eggs=develop_eggs()))
    cfg = directory / "buildout.cfg"
    cfg.write_text("[buildout]\nextends = base.cfg\n" + extra)
    return subprocess.run([BUILDOUT, "-c", str(cfg)], cwd=directory, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
@setup_budget(300)  # conftest.develop_eggs' buildout the first time, then this one (~10 s each; 300 s allowed each)
def built(tmp_path_factory):
    directory = tmp_path_factory.mktemp("buildout")
    result = buildout(directory)
    assert result.returncode == 0, result.stdout + result.stderr
    return directory, result.stdout + result.stderr


def _ini(path):
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    return parser


def test_pyruvate_client_ini(built):
    directory, _ = built
    ini = _ini(directory / "parts" / "instance" / "etc" / "wsgi.ini")
    assert ini["server:main"]["use"] == "egg:pyruvate#main"
    assert ini["server:main"]["socket"] == "127.0.0.1:18081"
    assert ini["server:main"]["workers"] == "2"  # the recipe's default threads
    assert ini["server:main"]["max_reuse_count"] == "0"
    assert "threads" not in ini["server:main"]  # pyruvate would ignore it silently
    # logging like the stock recipe: event and access log of the part under var/log
    assert ini["handler_eventlog"]["args"] == f"(r'{directory}/var/log/instance.log', 'a')"
    assert ini["handler_accesslog"]["args"] == f"(r'{directory}/var/log/instance-access.log', 'a')"
    assert ini["app:zope"]["zope_conf"] == f"{directory}/parts/instance/etc/zope.conf"


@pytest.mark.parametrize("part", ["instance", "client2"])
def test_blob_filter_on_by_default(built, part):
    directory, _ = built
    ini = _ini(directory / "parts" / part / "etc" / "wsgi.ini")
    assert ini["pipeline:main"]["pipeline"].split() == [
        "blobsendfile", "translogger", "egg:Zope#httpexceptions", *AST_LOCK, "zope"]
    assert ini["filter:blobsendfile"]["use"] == "egg:plonedeploy.runtime#blobsendfile"
    if AST_LOCK:
        assert ini["filter:astlock"]["use"] == "egg:plonedeploy.runtime#astlock"
    # the filter's distribution is on the client's path (egg:plonedeploy.runtime#...), the
    # recipe's own (zc.buildout, Jinja2, psutil) is not
    script = (directory / "bin" / part).read_text()
    assert os.path.join(ROOT, "recipes", "plonedeploy.runtime", "src") in script
    assert os.path.join(ROOT, "recipes", "plonedeploy.recipe", "src") not in script
    assert "/Jinja2-" not in script and "/psutil-" not in script


def test_blob_filter_off(tmp_path):
    result = buildout(tmp_path, "[instance]\nblob-sendfile = off\n")
    assert result.returncode == 0, result.stdout + result.stderr
    ini = _ini(tmp_path / "parts" / "instance" / "etc" / "wsgi.ini")
    assert ini["pipeline:main"]["pipeline"].split() == ["translogger", "egg:Zope#httpexceptions", *AST_LOCK, "zope"]
    assert "filter:blobsendfile" not in ini
    # the runtime's distribution is on the client's path only for the astlock filter
    script = (tmp_path / "bin" / "instance").read_text()
    assert ("plonedeploy.runtime" in script) == bool(AST_LOCK)
    assert "plonedeploy.recipe" not in script
    # client2 (<= instance) inherits it, as any other option of the macro
    assert "blobsendfile" not in _ini(tmp_path / "parts" / "client2" / "etc" / "wsgi.ini")["pipeline:main"]["pipeline"]


def test_waitress_client_ini(built):
    directory, _ = built
    ini = _ini(directory / "parts" / "client2" / "etc" / "wsgi.ini")
    assert ini["server:main"]["use"] == "egg:waitress#main"
    assert ini["server:main"]["listen"] == "127.0.0.1:18082"
    assert ini["server:main"]["threads"] == "3"
    assert ini["handler_eventlog"]["args"] == f"(r'{directory}/var/log/client2.log', 'a')"


@pytest.mark.parametrize("part, threads", [("instance", 2), ("client2", 3)])
def test_pool_size_equals_threads(built, part, threads):
    directory, _ = built
    text = (directory / "parts" / part / "etc" / "zope.conf").read_text()
    main = text[text.index("<zodb_db main>"):]
    main = main[:main.index("</zodb_db>")]
    assert re.findall(r"^\s*pool-size (\d+)$", main, re.MULTILINE) == [str(threads)]


def test_conflict_retries_in_zope_conf(built):
    """Zope's max-conflict-retries: the recipe's default in every client's zope.conf, once,
    after the part's own zope-conf-additional lines."""
    from plonedeploy.stack.rules import DEFAULT_CONFLICT_RETRIES

    directory, _ = built
    for part in ("instance", "client2", "uploads"):
        text = (directory / "parts" / part / "etc" / "zope.conf").read_text()
        assert re.findall(r"^\s*max-conflict-retries (\d+)$", text, re.MULTILINE) == [DEFAULT_CONFLICT_RETRIES], part


def test_server_egg_added_to_client_scripts(built):
    directory, _ = built
    assert re.search(r"pyruvate-[\d.]+-py", (directory / "bin" / "instance").read_text())
    assert re.search(r"waitress-[\d.]+-py", (directory / "bin" / "client2").read_text())


def test_no_inituser_prompt_and_no_default_admin(built):
    directory, output = built
    assert "Username:" not in output
    assert not (directory / "parts" / "instance" / "inituser").exists()


def test_haproxy_config_from_client_parts(built):
    directory, output = built
    text = (directory / "parts" / "haproxy" / "haproxy.cfg").read_text()
    assert "server instance 127.0.0.1:18081 maxconn 2 check" in text
    assert "server client2 127.0.0.1:18082 maxconn 3 check" in text
    assert "balance leastconn" in text
    assert "option httpchk GET /Plone/@@ok" in text
    assert "bind 127.0.0.1:18080" in text
    assert "http-response set-header X-Served-By %[srv_name]" in text
    assert "http-request deny deny_status 413 if { req.hdr(content-length) -m int gt 1073741824 }" in text
    assert "    maxconn 10016\n" in text  # global default: frontend maxconn 10000 + 16
    assert "    bind 127.0.0.1:18080 backlog 10000\n" in text
    # 1 fd per client connection: below HAProxy's own 2 x maxconn estimate, so it must not
    # refuse to start (strict-limits) under a hard limit of 20,000
    assert "    ulimit-n 20000\n    no strict-limits\n" in text
    # no manage-networks: the ZMI from no address (it was open to all before)
    assert "\n    acl admin_network always_false\n" in text
    assert "\n    http-request deny deny_status 403 if zmi !admin_network\n" in text
    # the edge (docs/explanation/edge.md, "Edge limits"): the body is held before a server is
    # chosen, larger bodies go to the upload lane, Host is the bind's host unless set
    assert "\n    http-request wait-for-body time 10s\n" in text
    assert "acl body_large req.hdr(content-length) -m int gt 8192" in text
    assert "backend uploads" in text and "server uploads 127.0.0.1:18079 maxconn 8 check" in text
    assert "# uploads: waitress, bodies up to 1073741824 bytes" in text
    assert "acl allowed_host req.hdr(host),lower -m reg '^(127\\.0\\.0\\.1)(:[0-9]+)?$'" in text
    assert "sc_conn_cur(0) gt 100" in text and "sc_http_req_rate(0) gt 1000" in text
    assert "\n    tcp-request connection track-sc0 src,ipmask(32,64)\n" in text  # nobody exempt by default
    assert "http-request use-service prometheus-exporter if { path /metrics }" in text
    # the write lane, on by default: writes one at a time on instance, client2 its backup
    assert "\n    use_backend writes if { method POST PUT PATCH DELETE }\n" in text
    assert "server instance 127.0.0.1:18081 maxconn 1 track zeoclients/instance" in text
    assert "server client2 127.0.0.1:18082 maxconn 1 backup track zeoclients/client2" in text
    assert "track zeoclients/uploads" not in text  # the upload lane is not a writer
    # it was checked by haproxy -c before being written
    check = subprocess.run(["haproxy", "-c", "-f", str(directory / "parts" / "haproxy" / "haproxy.cfg")],
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_stack_script_and_config(built):
    directory, _ = built
    config = json.loads((directory / "parts" / "stack" / "stack.json").read_text())
    assert [p["name"] for p in config["processes"]] == ["zeoserver", "instance", "client2", "uploads", "haproxy"]
    assert config["storage"] == "zeo" and config["zeoserver"] == "zeoserver"
    assert config["server_kinds"] == {"instance": "pyruvate", "client2": "waitress"}
    assert config["upload_servers"] == ["uploads"] and config["upload_backend"] == "uploads"
    assert config["stats_url"] == "http://127.0.0.1:18404/stats;csv"
    # The facts the load tools read instead of haproxy.cfg and wsgi.ini (loadtests.core).
    assert config["part"] == "stack"
    assert config["frontend_maxconn"] == 10000
    assert config["clients"] == {
        "instance": {"server": "pyruvate", "threads": 2, "url": "http://127.0.0.1:18081",
                     "blob_sendfile": True, "metrics_url": None},
        "client2": {"server": "waitress", "threads": 3, "url": "http://127.0.0.1:18082",
                    "blob_sendfile": True, "metrics_url": None},
        "uploads": {"server": "waitress", "threads": 1, "url": "http://127.0.0.1:18079",
                    "blob_sendfile": True, "metrics_url": None},
    }
    assert config["zeo_address"] == "127.0.0.1:18100"
    assert config["blob_storage"] is None  # BASE's zeoserver part sets no blob-storage
    # The template and its variables reproduce the rendered haproxy.cfg byte for byte, so a
    # variant rendered from them differs only in what the tool changed.
    assert config["haproxy_template"] == HAPROXY_TEMPLATE == os.path.join(ROOT, "haproxy", "haproxy.cfg.j2")
    assert config["haproxy_context"]["balance"] == "leastconn"
    assert render_template(config["haproxy_template"], config["haproxy_context"]) == \
        (directory / "parts" / "haproxy" / "haproxy.cfg").read_text()
    help_text = subprocess.run([str(directory / "bin" / "stack"), "--help"], capture_output=True,
                               text=True, timeout=60, check=True).stdout
    assert "start" in help_text and "stop" in help_text
    # supervisord's config, rendered at install from the templates the Ansible role renders too.
    assert config["supervisor_config"] == str(directory / "parts" / "stack" / "supervisord.conf")
    conf = (directory / "parts" / "stack" / "supervisord.conf").read_text()
    assert f"file = {directory}/var/run/supervisor.sock\nchmod = 0700\n" in conf
    assert f"files = {directory}/parts/stack/supervisor.d/*.conf" in conf
    program = (directory / "parts" / "stack" / "supervisor.d" / "instance.conf").read_text()
    assert f"command = {directory}/bin/instance console\n" in program
    assert "autostart = false\nautorestart = true\n" in program
    assert f"stdout_logfile = {directory}/var/log/instance.stdout.log\nstdout_logfile_maxbytes = 0\n" in \
        program.replace("; bin/stack: 0 and 0, logrotate rotates the file (the file is opened with O_APPEND)\n", "")
    assert TEMPLATES_DIRECTORY == os.path.join(ROOT, "templates")
    defaults = os.path.join(ROOT, "ansible", "roles", "process_manager", "defaults", "main.yml")
    with open(defaults, encoding="utf-8") as fp:
        assert 'process_manager_templates: "{{ playbook_dir }}/../templates"' in fp.read()
    for name in ("supervisord.conf.j2", "program.conf.j2"):
        assert os.path.isfile(os.path.join(TEMPLATES_DIRECTORY, name))
        assert not os.path.lexists(os.path.join(ROOT, "ansible", "roles", "process_manager", "templates", name))
    ctl = subprocess.run([str(directory / "bin" / "supervisorctl"), "status"], capture_output=True, text=True,
                         timeout=60)
    assert "supervisor.sock no such file" in ctl.stdout  # its config baked in; nothing runs


def test_stack_status_into_a_closed_pipe_exits_quietly(built):
    """``bin/stack status | head`` when head has gone: no BrokenPipeError traceback, and the
    status of a tool killed by SIGPIPE (141), like other Unix tools. The pipe has no reader
    at all, so every write fails, however fast the reader would have been."""
    directory, _ = built
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([str(directory / "bin" / "stack"), "status"], stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


def test_manage_networks_block_the_zmi(tmp_path):
    result = buildout(tmp_path, "[haproxy]\nmanage-networks = 127.0.0.1 10.1.0.0/16\nmaxconn = 9000\n")
    assert result.returncode == 0, result.stdout + result.stderr
    text = (tmp_path / "parts" / "haproxy" / "haproxy.cfg").read_text()
    assert "acl admin_network src 127.0.0.1/32 10.1.0.0/16" in text
    assert "http-request deny deny_status 403 if zmi !admin_network" in text
    assert "    maxconn 9000\n" in text


def test_write_lane_off(tmp_path):
    result = buildout(tmp_path, "[haproxy]\nwrite-lane = off\n")
    assert result.returncode == 0, result.stdout + result.stderr
    text = (tmp_path / "parts" / "haproxy" / "haproxy.cfg").read_text()
    assert "backend writes" not in text and "use_backend writes" not in text
    stack = json.loads((tmp_path / "parts" / "stack" / "stack.json").read_text())
    assert stack["haproxy_context"]["write_lane"] is False


def test_tls_certificate_and_redirect(tmp_path):
    """tls-bind without tls-certificate: the build makes a self-signed certificate for the
    server names (0600); the plain port answers 301 to the same URL over https."""
    import socket
    import time

    result = buildout(tmp_path, "[haproxy]\nbind = 127.0.0.1:18580\nstats-bind = 127.0.0.1:18504\n"
                                "tls-bind = 127.0.0.1:18543\nserver-names = 127.0.0.1 localhost\n")
    assert result.returncode == 0, result.stdout + result.stderr
    pem = tmp_path / "var" / "tls" / "haproxy.pem"
    assert oct(pem.stat().st_mode & 0o777) == "0o600"
    config = tmp_path / "parts" / "haproxy" / "haproxy.cfg"
    text = config.read_text()
    assert f"bind 127.0.0.1:18543 ssl crt {pem} alpn h2,http/1.1" in text
    assert "ssl-default-bind-options ssl-min-ver TLSv1.2" in text
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(50):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", 18580)) == 0:
                    break
            time.sleep(0.1)
        answer = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{redirect_url}",
                                 "http://127.0.0.1:18580/Plone/front?x=1"], capture_output=True, text=True,
                                timeout=30, check=False).stdout
    finally:
        stop_group(proc, timeout=10)  # SIGKILL if SIGTERM did not stop it
    assert answer == "301 https://127.0.0.1:18543/Plone/front?x=1", answer


def test_second_buildout_keeps_parts(built):
    directory, _ = built
    result = subprocess.run([BUILDOUT, "-c", str(directory / "buildout.cfg")], cwd=directory,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Updating instance." in result.stderr + result.stdout
    assert "Installing instance." not in result.stderr + result.stdout


def varnish_part(**options):
    """Buildout text adding a cache tier ([varnish], not in BASE's parts) with ``options``
    (keys with ``_`` for ``-``) over the defaults of these tests."""
    values = {"recipe": "plonedeploy.recipe:varnish", "template": f"{TEMPLATES_DIRECTORY}/varnish.vcl.j2",
              "bind": "127.0.0.1:18681", "backend": "127.0.0.1:18688", "clients": "instance client2 uploads"}
    values.update({k.replace("_", "-"): v for k, v in options.items()})
    # Continues buildout()'s [buildout] section: put it first in ``extra``.
    return "parts += varnish\n[varnish]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())


def test_service_users_wired_into_scripts_haproxy_and_varnish(tmp_path, monkeypatch):
    """The users buildout.cfg's [service] names (make build sets them as root), here nobody
    for ZEO and the clients: every client's bin/<part> and interpreter drop to it first (its
    own directories and logs in the layout they hand over), stack.json says what it runs
    and owns, HAProxy's global drops to haproxy, varnishd runs in the unix jail and its
    exporter as varnishlog (supervisord's user= for each, when root starts the stack)."""
    from plonedeploy.stack import service as stack_module

    extra = (varnish_part(jail="unix", metrics_address="127.0.0.1:18689")
             + "[haproxy]\ntls-bind = 127.0.0.1:18443\ncache = varnish\nuser = haproxy\n"
             "[stack]\ncache = varnish\nservice-user = nobody\n"
             "[zeoserver]\npid-file = ${buildout:directory}/var/zeoserver/zeoserver.pid\n"
             "[instance]\nservice-user = nobody\n")
    result = buildout(tmp_path, extra)
    assert result.returncode == 0, result.stdout + result.stderr
    for part in ("instance", "client2", "uploads"):
        for script in (tmp_path / "bin" / part, tmp_path / "parts" / part / "bin" / "interpreter"):
            text = script.read_text()
            drop = text.index("from plonedeploy.runtime.access import become\nbecome('nobody', {")
            assert drop > text.index("sys.path[0:0]"), script
            assert "import plone.recipe.zope2instance.ctl" not in text or \
                drop < text.index("import plone.recipe.zope2instance.ctl"), script
            assert f"'{tmp_path}/var/{part}'" in text and f"'{tmp_path}/var/log/{part}-access.log'" in text, script
    stack = json.loads((tmp_path / "parts" / "stack" / "stack.json").read_text())
    assert stack["service"]["user"] == "nobody"
    assert stack["service"]["processes"] == ["zeoserver", "instance", "client2", "uploads"]
    assert stack["service"]["writable"] == [f"{tmp_path}/var/admin-password", f"{tmp_path}/var/editor-password"]
    assert stack["haproxy_context"]["user"] == stack["haproxy_context"]["group"] == "haproxy"
    config = (tmp_path / "parts" / "haproxy" / "haproxy.cfg").read_text()
    assert "\n    user haproxy\n    group haproxy\n" in config
    chroot = tmp_path / "parts" / "haproxy" / "empty"  # chroot = auto with a user
    assert f"\n    chroot {chroot}\n" in config and stack["haproxy_context"]["chroot"] == str(chroot)
    assert list(chroot.iterdir()) == [] and stat.S_IMODE(chroot.stat().st_mode) == 0o755
    assert stack["cache"]["jail_users"] == ["varnish", "vcache"]
    argv = next(p["argv"] for p in stack["processes"] if p["name"] == "varnish")
    assert argv[argv.index("-j") + 1] == "unix"
    assert stack["cache"]["exporter_user"] == "varnishlog"
    monkeypatch.setattr(stack_module.os, "geteuid", lambda: 0)  # who supervisord runs each as, as root
    assert stack_module.service_users(stack) == {
        "zeoserver": "nobody", "instance": "nobody", "client2": "nobody", "uploads": "nobody",
        "varnish-exporter": "varnishlog"}


def test_cache_tier_wired_into_haproxy_and_stack(tmp_path):
    """[varnish] renders a VCL varnishd accepted; [haproxy] cache sends TLS GETs to it and
    binds its backend; bin/stack starts varnishd between the clients and HAProxy."""
    result = buildout(tmp_path, varnish_part() + "[haproxy]\ntls-bind = 127.0.0.1:18443\ncache = varnish\n"
                                "[stack]\ncache = varnish\n")
    assert result.returncode == 0, result.stdout + result.stderr
    vcl = (tmp_path / "parts" / "varnish" / "varnish.vcl").read_text()
    assert '.port = "18688";' in vcl and '"127.0.0.1"/32;' in vcl
    config = (tmp_path / "parts" / "haproxy" / "haproxy.cfg").read_text()
    assert "server varnish 127.0.0.1:18681 check" in config
    assert "bind 127.0.0.1:18688" in config and "use_backend cache if to_cache" in config
    stack = json.loads((tmp_path / "parts" / "stack" / "stack.json").read_text())
    assert stack["cache"]["url"] == "http://127.0.0.1:18681"
    names = [p["name"] for p in sorted(stack["processes"], key=lambda p: p["stage"])]
    assert names.index("varnish") == names.index("haproxy") - 1
    argv = next(p["argv"] for p in stack["processes"] if p["name"] == "varnish")
    assert argv[argv.index("-a") + 1] == "127.0.0.1:18681" and "-F" in argv


# A RelStorage variant of BASE as relstorage.cfg makes it: a postgresql part, every client a
# RelStorage client of it, the stack starting it instead of the ZEO server.
PG = """\
parts += postgresql
[postgresql]
recipe = plonedeploy.recipe:postgresql
address = 127.0.0.1:18432
[instance]
storage = relstorage
relstorage-dsn = ${postgresql:dsn}
[stack]
zeoserver =
database = postgresql
"""

# relstorage.cfg's [relstorage-tools] on PG: the configs of bin/zodbconvert and bin/zodbpack.
TOOLS = PG.replace("parts += postgresql\n", "parts += postgresql relstorage-tools\n") + """\
[relstorage-tools]
recipe = plonedeploy.recipe:relstorage-tools
file-storage = ${buildout:directory}/var/filestorage/Data.fs
blob-storage = ${buildout:directory}/var/blobstorage
"""


BAD = [
    ("[instance]\nmemory-limit = lots\n",
     "[instance] memory-limit = 'lots' is invalid: expected a size in bytes such as 512MB, 1GB or 65536"),
    ("[instance]\nmemory-limit-grace = 0\n",
     "[instance] memory-limit-grace = '0' is invalid: expected a number of seconds > 0"),
    ("[instance]\nmemory-limit-restarts = -1\n",
     "[instance] memory-limit-restarts = '-1' is invalid: expected a whole number >= 0 (recycles per hour)"),
    ("[instance]\nmemory-limit-peers = 8072\n", "[instance] memory-limit-peers = '8072' is invalid"),
    ("[instance]\nmetrics-address = 127.0.0.1:18091\nmemory-limit-peers = 127.0.0.1:18091\n"
     "[client2]\nmetrics-address = 127.0.0.1:18092\n[uploads]\nmetrics-address = 127.0.0.1:18093\n",
     "[instance] memory-limit-peers = '127.0.0.1:18091' is invalid: expected the other clients' metrics "
     "addresses, not this client's own (127.0.0.1:18091)"),
    ("[stack]\nservice-user = no-such-user-pd\n",
     "[stack] service-user = 'no-such-user-pd' is invalid: expected an existing system user (make demo "
     "creates 'plonedeploy'"),
    ("[stack]\nservice-user = root\n",
     "[stack] service-user = 'root' is invalid: expected a system user other than root"),
    ("[client2]\nservice-user = nobody\n",
     "[client2] service-user = 'nobody' is invalid: expected '', the [stack] service-user (bin/client2 runs "
     "as that user when root starts it"),
    ("[instance]\nservice-user = root\n",
     "[instance] service-user = 'root' is invalid: expected a system user other than root"),
    ("[haproxy]\nuser = no-such-user-pd\n",
     "[haproxy] user = 'no-such-user-pd' is invalid: expected an existing system user such as haproxy"),
    ("[haproxy]\nuser = root\n", "[haproxy] user = 'root' is invalid: expected a system user other than root"),
    # a chroot needs the drop (root leaves one), and must be root's alone (not /tmp) and absolute
    ("[haproxy]\nchroot = /var/lib/haproxy\n", "[haproxy] chroot = '/var/lib/haproxy' is invalid: expected auto, "
     "none, or with user an absolute path of an existing directory that root owns and nobody else may write"),
    ("[haproxy]\nuser = haproxy\nchroot = /tmp\n", "[haproxy] chroot = '/tmp' is invalid: expected auto, none"),
    ("[haproxy]\nuser = haproxy\nchroot = var\n", "[haproxy] chroot = 'var' is invalid: expected auto, none"),
    (varnish_part(jail="chroot"), "[varnish] jail = 'chroot' is invalid: expected one of: unix, none"),
    ("[stack]\nclients = client2 instance\n",
     "[stack] clients = 'client2 instance' is invalid: expected the [haproxy] part's backends in their "
     "order, 'instance client2'"),
    ("[instance]\nwsgi-server = tornado\n",
     "[instance] wsgi-server = 'tornado' is invalid: expected one of: pyruvate, waitress, gunicorn, "
     "cheroot, granian, bjoern, uwsgi, gevent, mod_wsgi"),
    ("[instance]\nwsgi-server = mod_wsgi\nmod-wsgi-express = /nonexistent/bin/mod_wsgi-express\n",
     "[instance] mod-wsgi-express = '/nonexistent/bin/mod_wsgi-express' is invalid: expected an existing "
     "program: mod_wsgi compiled against the system Python, which scripts/install-system.sh (make system) "
     "installs as /usr/local/lib/plonedeploy/mod_wsgi-"),
    ("[instance]\nwsgi-server = mod_wsgi\nmod-wsgi-express = mod_wsgi-express\n",
     "[instance] mod-wsgi-express = 'mod_wsgi-express' is invalid: expected an absolute path such as "
     "/usr/local/lib/plonedeploy/mod_wsgi-"),
    ("[instance]\nwsgi-server = bjoern\nthreads = 2\n",
     "[instance] threads = '2' is invalid: expected 1 for wsgi-server = bjoern"),
    ("[instance]\nhttp-address = 8081\n",
     "[instance] http-address = '8081' is invalid: expected one host:port such as 127.0.0.1:8081"),
    ("[instance]\nhttp-address = 127.0.0.1:99999\n",
     "[instance] http-address = '127.0.0.1:99999' is invalid: expected a port between 1 and 65535"),
    ("[client2]\nthreads = 0\n",
     "[client2] threads = '0' is invalid: expected a positive integer"),
    ("[client2]\nthreads = many\n",
     "[client2] threads = 'many' is invalid: expected a positive integer"),
    ("[client2]\nthreads = auto\ncpu-cores = none\n",
     "[client2] cpu-cores = 'none' is invalid: expected a positive integer"),
    ("[client2]\nzodb-cache-memory = lots\n",
     "[client2] zodb-cache-memory = 'lots' is invalid: expected a size in bytes such as 512MB"),
    ("[client2]\nzodb-cache-memory = 1GB\nzodb-cache-size-bytes = 1000\n",
     "[client2] zodb-cache-memory and zodb-cache-size-bytes are both set"),
    ("[instance]\nblob-sendfile = maybe\n",
     "[instance] blob-sendfile = 'maybe' is invalid: expected on or off"),
    ("[instance]\nblob-sendfile = off\npipeline = blobsendfile zope\n",
     "[instance] pipeline names blobsendfile but blob-sendfile = off"),
    ("[instance]\nadded-delay = 50ms\n",
     "[instance] added-delay = '50ms' is invalid: expected a whole number of milliseconds from 0 to 10000"),
    ("[instance]\nhello-address = 127.0.0.1:18081\n",
     "[instance] hello-address = '127.0.0.1:18081' is invalid: expected a host:port other than "
     "http-address = 127.0.0.1:18081"),
    ("[instance]\nwsgi-ini-template = /tmp/x.ini\n",
     "[instance] wsgi-ini-template is set by plonedeploy.recipe"),
    ("[instance]\ntemplates-directory = /nonexistent\n",
     "[instance] templates-directory = '/nonexistent' is invalid: expected a directory holding pyruvate.ini.in"),
    ("[haproxy]\ntemplate = /nonexistent/haproxy.cfg.j2\n",
     "[haproxy] template = '/nonexistent/haproxy.cfg.j2' is invalid: expected an existing template file"),
    (varnish_part(template="/nonexistent.vcl"),
     "[varnish] template = '/nonexistent.vcl' is invalid: expected an existing template file"),
    ("[haproxy]\nbalance = fastest\n",
     "[haproxy] balance = 'fastest' is invalid: expected one of: leastconn, roundrobin"),
    ("[haproxy]\nbackends = instance instance\n",
     "[haproxy] backends = 'instance instance' names a part twice"),
    ("[haproxy]\nmax-body-size = 1GB\n",
     "[haproxy] max-body-size = '1GB' is invalid: expected a positive integer"),
    ("[haproxy]\nmanage-networks = 10.0.0.0/8 intranet\n",
     "[haproxy] manage-networks = 'intranet' is invalid: expected IPv4/IPv6 networks"),
    ("[haproxy]\nmaxconn = -1\n",
     "[haproxy] maxconn = '-1' is invalid: expected a positive integer"),
    ("[haproxy]\nmaxconn = 19950\n",
     "[haproxy] fd-limit = 20000 is too low for maxconn = 19950: expected at least 20043"),
    ("[haproxy]\nfd-limit = many\n",
     "[haproxy] fd-limit = 'many' is invalid: expected a positive integer"),
    ("[haproxy]\nbind = 18080\n",
     "[haproxy] bind = '18080' is invalid: expected one host:port"),
    ("[instance]\nmax-request-body-size = lots\n",
     "[instance] max-request-body-size = 'lots' is invalid: expected a number of bytes"),
    ("[haproxy]\nupload-backends =\n",
     "[haproxy] inconsistent body limits (max-body-size, upload-threshold, max-request-body-size of the "
     "clients):\n  [instance] max-request-body-size = 1048576 is smaller than max-body-size"),
    ("[haproxy]\nupload-backends = instance\n",
     "[haproxy] inconsistent body limits (max-body-size, upload-threshold, max-request-body-size of the "
     "clients):\n  [instance] is in upload-backends but runs pyruvate"),
    ("[haproxy]\nupload-threshold = 20000\n",
     "[haproxy] inconsistent body limits (max-body-size, upload-threshold, max-request-body-size of the "
     "clients):\n  upload-threshold = 20000 is larger than HAProxy can buffer"),
    ("[uploads]\nmax-request-body-size = 1000\n",
     "[haproxy] inconsistent body limits (max-body-size, upload-threshold, max-request-body-size of the "
     "clients):\n  [uploads] max-request-body-size = 1000 is smaller than max-body-size = 1073741824"),
    ("[haproxy]\nserver-names = www.example.org:443\n",
     "[haproxy] server-names = 'www.example.org:443' is invalid: expected host names"),
    ("[haproxy]\nbind = 0.0.0.0:18080\n",
     "[haproxy] server-names is required when bind = 0.0.0.0:18080 listens on all addresses"),
    ("[haproxy]\nper-source-requests = 0\n",
     "[haproxy] per-source-requests = '0' is invalid: expected a positive integer"),
    ("[haproxy]\nwrite-lane = sometimes\n",
     "[haproxy] write-lane = 'sometimes' is invalid: expected on or off"),
    ("[haproxy]\ntls-redirect = on\n",
     "[haproxy] tls-redirect is set but tls-bind is empty"),
    ("[haproxy]\ntls-bind = 127.0.0.1:18443\ntls-certificate = /nonexistent.pem\n",
     "[haproxy] tls-certificate = '/nonexistent.pem' is invalid: expected a readable PEM file"),
    ("[haproxy]\ntls-bind = 127.0.0.1:18443\nhsts-max-age = forever\n",
     "[haproxy] hsts-max-age = 'forever' is invalid: expected a number of seconds"),
    ("[haproxy]\ntls-bind = 127.0.0.1:18443\ntls-redirect = off\ntls-redirect-exempt = 10.0.0.5\n",
     "[haproxy] tls-redirect-exempt is set but tls-redirect is off"),
    ("[haproxy]\ntls-bind = 127.0.0.1:18443\ntls-redirect-exempt = 10.0.0.0/33\n",
     "[haproxy] tls-redirect-exempt = '10.0.0.0/33' is invalid: expected IPv4/IPv6 networks"),
    ("[haproxy]\ntls-bind = 127.0.0.1:18080\n",
     "[haproxy] tls-bind = 127.0.0.1:18080 is the same address as bind"),
    ("[haproxy]\nper-source-exempt = everyone\n",
     "[haproxy] per-source-exempt = 'everyone' is invalid: expected IPv4/IPv6 networks"),
    ("[instance]\nmetrics-address = 18091\n",
     "[instance] metrics-address = '18091' is invalid: expected one host:port"),
    ("[instance]\nmetrics-address = 127.0.0.1:18081\n",
     "[instance] metrics-address = '127.0.0.1:18081' is invalid: expected a host:port other than "
     "http-address = 127.0.0.1:18081"),
    # client2 and uploads inherit instance's address ("<= instance"): the stack refuses it.
    ("[instance]\nmetrics-address = 127.0.0.1:18091\n",
     "[client2] metrics-address = '127.0.0.1:18091' is invalid: [instance] metrics-address listens "
     "there already"),
    ("[client2]\nmetrics-address = 127.0.0.1:18079\n",
     "[client2] metrics-address = '127.0.0.1:18079' is invalid: [uploads] http-address listens there"),
    ("[instance]\npipeline = metrics zope\n",
     "[instance] pipeline names metrics but metrics-address is not set"),
    (varnish_part() + "[haproxy]\ncache = varnish\n",
     "[haproxy] cache = varnish needs tls-bind"),
    (varnish_part(cache_size="lots"),
     "[varnish] cache-size = 'lots' is invalid: expected a size such as 256M"),
    (varnish_part(clients=""),
     "[varnish] clients is required"),
    (varnish_part(purge_networks="everyone"),
     "[varnish] purge-networks = 'everyone' is invalid: expected IPv4/IPv6 networks"),
    (varnish_part(cookie_allowlist="__ac a.b"),
     "[varnish] cookie-allowlist = '__ac a.b' is invalid: expected cookie names"),
    (varnish_part(backend="127.0.0.1:18404") +
     "[haproxy]\ntls-bind = 127.0.0.1:18443\ncache = varnish\n",
     "[varnish] backend = 127.0.0.1:18404 is one of [haproxy]'s own listeners"),
    # the allocator (a missing libjemalloc2: tests/test_options.py)
    ("[instance]\nmalloc = tcmalloc\n",
     "[instance] malloc = 'tcmalloc' is invalid: expected one of: system, jemalloc"),
    ("[instance]\nmalloc-arena-max = 0\n",
     "[instance] malloc-arena-max = '0' is invalid: expected a positive integer such as 2"),
    ("[client2]\nmalloc = jemalloc\nmalloc-arena-max = 2\n",
     "[client2] malloc-arena-max = '2' is invalid: expected empty with malloc = jemalloc"),
    ("[uploads]\nenvironment-vars = MALLOC_ARENA_MAX 2\n",
     "[uploads] environment-vars sets MALLOC_ARENA_MAX, which Zope sets only once the process runs"),
    # storage = relstorage (tests/test_relstorage.py runs it against a real PostgreSQL)
    ("[instance]\nstorage = s3\n",
     "[instance] storage = 's3' is invalid: expected one of: zeo, relstorage"),
    # Zope's conflict retries: more than 6 would retry past HAProxy's timeout server
    ("[instance]\nmax-conflict-retries = 9\n",
     "[instance] max-conflict-retries = '9' is invalid: expected one of: 0, 1, 2, 3, 4, 5, 6"),
    ("[instance]\nzope-conf-additional = max-conflict-retries 2\n",
     "[instance] zope-conf-additional sets max-conflict-retries; remove it there"),
    ("[instance]\nstorage = relstorage\n",
     "[instance] relstorage-dsn is required with storage = relstorage"),
    ("[instance]\nstorage = relstorage\nrelstorage-dsn = dbname=plone\nrelstorage-blobs = nfs\n",
     "[instance] relstorage-blobs = 'nfs' is invalid: expected one of: database, shared-directory"),
    ("[instance]\nstorage = relstorage\nrelstorage-dsn = dbname=plone password=hunter2\n",
     "[instance] relstorage-dsn = 'dbname=plone password=***' is invalid: expected libpq key=value pairs"),
    ("[instance]\nstorage = relstorage\nrelstorage-dsn = host=127.0.0.1\n",
     "[instance] relstorage-dsn = 'host=127.0.0.1' is invalid: expected libpq key=value pairs such as"),
    ("[instance]\nstorage = relstorage\nrelstorage-dsn = dbname=plone\nrelstorage-blob-dir = var/blobs\n",
     "[instance] relstorage-blob-dir = 'var/blobs' is invalid: expected an absolute path"),
    ("[instance]\nstorage = relstorage\nrelstorage-dsn = dbname=plone\nrel-storage = type postgresql\n",
     "[instance] rel-storage is written by plonedeploy.recipe from storage = relstorage"),
    (PG + "[postgresql]\naddress = 0.0.0.0:18432\n",
     "[postgresql] address = '0.0.0.0:18432' is invalid: expected a loopback host:port such as 127.0.0.1:5432"),
    (PG + "[postgresql]\ndatabase = Plone-Site\n",
     "[postgresql] database = 'Plone-Site' is invalid: expected a lower-case identifier"),
    (PG + "[postgresql]\nbin-directory = /nonexistent\n",
     "[postgresql] bin-directory = '/nonexistent' is invalid: expected the directory of PostgreSQL's initdb"),
    ("[instance]\nstorage = relstorage\nrelstorage-dsn = dbname=plone\nrelstorage-cache-local-mb = ten\n",
     "[instance] relstorage-cache-local-mb = 'ten' is invalid: expected a whole number of MB >= 0"),
    ("[instance]\nstorage = relstorage\nrelstorage-dsn = dbname=plone\nrelstorage-blobs = shared-directory\n"
     "relstorage-blob-cache-size = 1GB\n",
     "[instance] relstorage-blob-cache-size = '1GB' is invalid: "
     "expected empty with relstorage-blobs = shared-directory"),
    ("[instance]\ntransaction-mode = manual\n",
     "[instance] transaction-mode = 'manual' is invalid: expected one of: implicit, explicit"),
    (PG + "[postgresql]\nsettings = port = 1\n",
     "[postgresql] settings = 'port = 1' is invalid: expected 'name = value' lines, each name once, names of: "
     "shared_buffers"),
    (PG + "[stack]\nzeoserver = zeoserver\n",
     "[stack] zeoserver and database are both set; keep one"),
    (PG + "[stack]\ndatabase =\nzeoserver =\n",
     "[stack] zeoserver is required (part names)"),
    (TOOLS + "[relstorage-tools]\nclient = haproxy\n",
     "[relstorage-tools] client = 'haproxy' is invalid: expected a plonedeploy.recipe:instance part "
     "with storage = relstorage"),
    (TOOLS + "[relstorage-tools]\nfile-storage = var/Data.fs\n",
     "[relstorage-tools] file-storage = 'var/Data.fs' is invalid: expected an absolute path"),
]


METRICS = ("[instance]\nmetrics-address = 127.0.0.1:18091\n"
           "[client2]\nmetrics-address = 127.0.0.1:18092\n"
           "[uploads]\nmetrics-address = 127.0.0.1:18093\n")


def test_hello_address_writes_the_hello_ini_through_both_stages(tmp_path):
    """etc/hello.ini: the client's [server:main] (stage 2 filled: waitress has %(...)s keys)
    on hello-address, and the hello app; etc/wsgi.ini stays the Zope client's."""
    # client2 and uploads are "<= instance": each needs its own address
    result = buildout(tmp_path, "[instance]\nhello-address = 127.0.0.1:18095\n"
                                "[client2]\nhello-address = 127.0.0.1:18096\n"
                                "[uploads]\nhello-address = 127.0.0.1:18097\n")
    assert result.returncode == 0, result.stdout + result.stderr
    for part, server_port, hello_port in (("instance", 18081, 18095), ("client2", 18082, 18096),
                                          ("uploads", 18079, 18097)):
        etc = tmp_path / "parts" / part / "etc"
        hello, client = _ini(etc / "hello.ini"), _ini(etc / "wsgi.ini")
        assert hello.sections() == ["server:main", "app:main"], part
        assert dict(hello["app:main"]) == {"use": "egg:plonedeploy.runtime#hello"}
        assert "%(" not in (etc / "hello.ini").read_text()
        assert {k: v.replace(str(hello_port), str(server_port)) for k, v in hello["server:main"].items()} \
            == dict(client["server:main"]), part
        assert "pipeline:main" in client and "egg:Zope#main" in (etc / "wsgi.ini").read_text()


def test_added_delay_is_a_filter_of_that_client_only(tmp_path):
    """added-delay (the canary's testing aid): [filter:delay] with the milliseconds, right
    before the Zope app, in the client that sets it; the others have none (the default)."""
    result = buildout(tmp_path, "[client2]\nadded-delay = 50\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[client2] added-delay = 50: page requests sleep 50 ms first" in result.stdout + result.stderr
    ini = _ini(tmp_path / "parts" / "client2" / "etc" / "wsgi.ini")
    assert dict(ini["filter:delay"]) == {"use": "egg:plonedeploy.runtime#delay", "delay_ms": "50"}
    assert ini["pipeline:main"]["pipeline"].split()[-2:] == ["delay", "zope"]
    for part in ("instance", "uploads"):
        assert "delay" not in _ini(tmp_path / "parts" / part / "etc" / "wsgi.ini")["pipeline:main"]["pipeline"]


def test_metrics_filter_wired_per_client(tmp_path):
    """metrics-address: [filter:metrics] after blobsendfile, prometheus-client on the
    client's path, the endpoints in stack.json; without it (the other tests' BASE) none.
    With them HAProxy's default check, /readyz, is asked on each client's metrics address."""
    result = buildout(tmp_path, METRICS + "[haproxy]\nhealth-check = /readyz\n")
    assert result.returncode == 0, result.stdout + result.stderr
    for part, port in (("instance", 18091), ("client2", 18092), ("uploads", 18093)):
        ini = _ini(tmp_path / "parts" / part / "etc" / "wsgi.ini")
        assert ini["filter:metrics"]["use"] == "egg:plonedeploy.runtime#metrics"
        assert ini["filter:metrics"]["address"] == f"127.0.0.1:{port}"
        assert ini["pipeline:main"]["pipeline"].split()[:2] == ["blobsendfile", "metrics"]
        assert "prometheus_client-0.26.0" in (tmp_path / "bin" / part).read_text()
    config = json.loads((tmp_path / "parts" / "stack" / "stack.json").read_text())
    assert config["metrics"] == {p: f"http://127.0.0.1:{n}/metrics"
                                 for p, n in (("instance", 18091), ("client2", 18092), ("uploads", 18093))}
    assert config["haproxy_metrics_url"] == "http://127.0.0.1:18404/metrics"
    haproxy_cfg = (tmp_path / "parts" / "haproxy" / "haproxy.cfg").read_text()
    assert haproxy_cfg.count("option httpchk GET /readyz") == 2
    for part, port, metrics in (("instance", 18081, 18091), ("client2", 18082, 18092), ("uploads", 18079, 18093)):
        assert re.search(rf"server {part} 127\.0\.0\.1:{port} maxconn \d+ check addr 127\.0\.0\.1 port {metrics}\n",
                         haproxy_cfg), part


def test_memory_watchdog_and_allocator_wired_per_client(tmp_path):
    """memory-limit and its peers in [filter:metrics]; the default limit is the rule of
    rules.default_memory_limit over host-memory and clients-per-host; off turns it off.
    malloc = jemalloc and malloc-arena-max: bin/<part> sets LD_PRELOAD (this host's library)
    or MALLOC_ARENA_MAX before the ctl script starts the server (test_options.py starts a
    process after those lines); the default, system, sets neither."""
    result = buildout(tmp_path, "[instance]\nmetrics-address = 127.0.0.1:18091\n"
                                "memory-limit-peers = 127.0.0.1:18092\nhost-memory = 4GB\nclients-per-host = 2\n"
                                "[client2]\nmetrics-address = 127.0.0.1:18092\nmemory-limit-peers = 127.0.0.1:18091\n"
                                "memory-limit = 900MB\nmemory-limit-restarts = 1\nmalloc = jemalloc\n"
                                "[uploads]\nmetrics-address = 127.0.0.1:18093\nmemory-limit-peers =\n"
                                "memory-limit = off\nmalloc-arena-max = 2\n")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    library = clientoptions.find_jemalloc()
    scripts = {part: (tmp_path / "bin" / part).read_text() for part in ("instance", "client2", "uploads")}
    for text in scripts.values():
        compile(text, "bin/<part>", "exec")
    assert "LD_PRELOAD" not in scripts["instance"] + scripts["uploads"]
    assert "MALLOC_ARENA_MAX" not in scripts["instance"] + scripts["client2"]
    assert f"_plonedeploy_os.environ['LD_PRELOAD'] = ' '.join([{library!r}]" in scripts["client2"]
    assert "_plonedeploy_os.environ['MALLOC_ARENA_MAX'] = '2'" in scripts["uploads"]
    # before the ctl script's import, which starts the server
    assert scripts["client2"].index("LD_PRELOAD") < scripts["client2"].index("import plone.recipe.zope2instance.ctl")
    assert f"[client2] malloc = jemalloc: bin/client2 starts the server with LD_PRELOAD={library}" in output
    instance = _ini(tmp_path / "parts" / "instance" / "etc" / "wsgi.ini")["filter:metrics"]
    assert instance["memory_limit"] == str(rules.default_memory_limit(4 * 1024 ** 3, 2)[0]) == str(1152 * 1048576)
    assert instance["memory_limit_peers"] == "127.0.0.1:18092"
    assert (instance["memory_limit_grace"], instance["memory_limit_restarts"], instance["check_window"]) == \
        ("60", "3", "9")
    assert instance["memory_state_file"] == str(tmp_path / "var" / "instance" / "memory-recycles")
    client2 = _ini(tmp_path / "parts" / "client2" / "etc" / "wsgi.ini")["filter:metrics"]
    assert (client2["memory_limit"], client2["memory_limit_restarts"]) == (str(900 * 1048576), "1")
    # off: no watchdog lines at all (the filter's default is off)
    assert "memory_limit" not in _ini(tmp_path / "parts" / "uploads" / "etc" / "wsgi.ini")["filter:metrics"]


def test_no_metrics_filter_without_address(built):
    directory, _ = built
    ini = _ini(directory / "parts" / "instance" / "etc" / "wsgi.ini")
    assert not ini.has_section("filter:metrics")
    assert "metrics" not in ini["pipeline:main"]["pipeline"].split()


def test_threads_auto_follows_cores_and_clients(tmp_path):
    """threads = auto: 3 clients (the upload client counts) on 4 cores -> 2 threads; on 1
    core -> 1 (docs/how-to/tuning.md). The choice is logged with its reason and flows into
    pool-size, the connection cache budget and HAProxy's maxconn. One buildout: client2
    claims 1 core, instance 4."""
    result = buildout(tmp_path, "[instance]\nthreads = auto\ncpu-cores = 4\nzodb-cache-memory = 256MB\n"
                                "[client2]\nthreads = auto\ncpu-cores = 1\n")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    haproxy_cfg = (tmp_path / "parts" / "haproxy" / "haproxy.cfg").read_text()
    for part, expected in (("instance", 2), ("client2", 1)):
        assert f"[{part}] threads = auto -> {expected}: 3 ZEO client" in output, output
        zope_conf = (tmp_path / "parts" / part / "etc" / "zope.conf").read_text()
        assert f"pool-size {expected}" in zope_conf
        # 256 MiB for all connection caches of the client together
        assert f"cache-size-bytes {256 * 1024 ** 2 // expected}" in zope_conf
        server_line = next(line for line in haproxy_cfg.splitlines()
                           if line.strip().startswith(f"server {part} "))
        assert f"maxconn {expected}" in server_line, server_line


@pytest.fixture
def template_without_filter(tmp_path_factory):
    """A templates-directory whose pyruvate.ini.in has no [filter:blobsendfile]."""
    directory = tmp_path_factory.mktemp("templates")
    (directory / "pyruvate.ini.in").write_text("[server:main]\nuse = egg:pyruvate#main\n")
    return directory


def test_own_template_without_the_filter_section(tmp_path, template_without_filter):
    result = buildout(tmp_path, f"[instance]\ntemplates-directory = {template_without_filter}\n")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert (f"Error: [instance] blob-sendfile = on but {template_without_filter}/pyruvate.ini.in "
            "defines no [filter:blobsendfile]") in output, output
    assert not (tmp_path / "parts" / "instance").exists()


@pytest.mark.skipif(not AST_LOCK, reason="the astlock filter is for Python < 3.12")
def test_own_template_without_the_astlock_section(tmp_path, tmp_path_factory):
    directory = tmp_path_factory.mktemp("templates")
    (directory / "pyruvate.ini.in").write_text(
        "[server:main]\nuse = egg:pyruvate#main\n[filter:blobsendfile]\n[filter:metrics]\n")
    result = buildout(tmp_path, f"[instance]\ntemplates-directory = {directory}\n")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert (f"Error: [instance] Python {sys.version_info[0]}.{sys.version_info[1]} needs the astlock filter but "
            f"{directory}/pyruvate.ini.in defines no [filter:astlock]") in output, output
    assert not (tmp_path / "parts" / "instance").exists()


@pytest.mark.parametrize("extra, message", BAD, ids=[m.split(" is")[0] for _, m in BAD])
def test_bad_option_fails_buildout_with_named_error(tmp_path, extra, message):
    result = buildout(tmp_path, extra)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"Error: {message}" in output, output
    assert "Traceback" not in output
    assert not (tmp_path / "parts" / "instance").exists()  # nothing was installed


# Every wsgi-server value, each in a part c_<server> of one buildout (conftest.servers_build).
SERVER_USE = {"pyruvate": "egg:pyruvate#main", "waitress": "egg:waitress#main"}
SINGLE = {"bjoern", "gevent"}


def test_every_server_builds(servers_build):
    _, _, output = servers_build
    for server in SERVERS:
        assert f"c_{server}: {server} on 127.0.0.1:" in output


@pytest.mark.parametrize("server", list(SERVERS))
def test_server_ini_pool_size_and_eggs(servers_build, server):
    directory, ports, _ = servers_build
    part = directory / "parts" / f"c_{server}"
    section = _ini(part / "etc" / "wsgi.ini")["server:main"]
    threads = 1 if server in SINGLE else 2
    assert section["use"] == SERVER_USE.get(server, f"egg:plonedeploy.runtime#{server}")
    address = (f"{section['host']}:{section['port']}" if "host" in section
               else section.get("socket") or section["listen"])
    assert address == f"127.0.0.1:{ports[server]}"
    assert int(section.get("threads") or section.get("workers")) == threads
    text = (part / "etc" / "zope.conf").read_text()
    main = text[text.index("<zodb_db main>"):]
    assert re.findall(r"^\s*pool-size (\d+)$", main[:main.index("</zodb_db>")], re.MULTILINE) == [str(threads)]
    script = (directory / "bin" / f"c_{server}").read_text()
    for egg in SERVERS[server]:
        if egg != "plonedeploy.runtime":  # a develop egg: its src directory is on the path
            assert re.search(rf"/{re.escape(egg)}-[\d.]+(post\d+)?-py3", script), egg


@pytest.mark.parametrize("server", [s for s in SERVERS if s not in SERVER_USE])
def test_runner_entry_point_loads_and_reads_the_template_keys(servers_build, server):
    """The ini's entry point resolves in the client's own interpreter (the server egg is
    importable, bjoern's C extension links), and its runner reads exactly the ini's keys."""
    directory, _, _ = servers_build
    section = _ini(directory / "parts" / f"c_{server}" / "etc" / "wsgi.ini")["server:main"]
    code = (
        "import importlib.metadata as m, json, importlib\n"
        "ep, = [e for g in ('paste.server_runner', 'paste.server_factory') for e in m.entry_points(group=g)\n"
        f"       if e.name == {server!r}]\n"
        "mod = importlib.import_module(ep.module)\n"
        f"importlib.import_module({SERVERS[server][-1]!r})\n"
        "print(json.dumps([ep.value, list(mod.KEYS)]))\n"
    )
    out = subprocess.run([str(directory / "parts" / f"c_{server}" / "bin" / "interpreter"), "-c", code],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    value, keys = json.loads(out.stdout.splitlines()[-1])
    assert value.startswith(f"plonedeploy.runtime.servers.{server}:")
    assert set(keys) == set(section) - {"use"}


def test_relstorage_switch_renders_every_client(tmp_path):
    """storage = relstorage in [instance] alone: every client (client2 and uploads through
    "<= instance") gets <relstorage> with the postgresql part's DSN (passfile, no password),
    its own blob cache (relstorage-blobs = database, the default), no ZEO client section,
    the RelStorage and psycopg2 eggs, and still its pool-size; the stack starts PostgreSQL
    in the ZEO server's place, ready when pg_isready says so."""
    result = buildout(tmp_path, PG)
    assert result.returncode == 0, result.stdout + result.stderr
    passfile = tmp_path / "var" / "postgresql" / "pgpass"
    for part, threads in (("instance", 2), ("client2", 3), ("uploads", 1)):
        zope_conf = (tmp_path / "parts" / part / "etc" / "zope.conf").read_text()
        assert "%import relstorage" in zope_conf
        assert (f"dsn host=127.0.0.1 port=18432 dbname=plone user=plone passfile={passfile}\n"
                in zope_conf), zope_conf
        assert f"blob-dir {tmp_path}/var/blobcache/{part}\n" in zope_conf
        assert "shared-blob-dir false" in zope_conf
        assert "<zeoclient>" not in zope_conf and "password" not in zope_conf
        assert f"pool-size {threads}" in zope_conf
        script = (tmp_path / "bin" / part).read_text()
        assert "RelStorage-4.3.0" in script and "psycopg2_binary-2.9.13" in script
    config = json.loads((tmp_path / "parts" / "stack" / "stack.json").read_text())
    first = config["processes"][0]
    assert [p["name"] for p in config["processes"]] == ["postgresql", "instance", "client2", "uploads", "haproxy"]
    assert first["stage"] == 0 and first["argv"] == [str(tmp_path / "bin" / "postgresql"), "fg"]
    assert first["ready"]["tcp"] == ["127.0.0.1", 18432]
    assert first["ready"]["command"][0].endswith("/pg_isready")
    pg_config = json.loads((tmp_path / "parts" / "postgresql" / "postgresql.json").read_text())
    assert pg_config["data_directory"] == str(tmp_path / "var" / "postgresql" / "data")
    # bin/buildout creates no cluster and no password: bin/stack start does (first start).
    assert not (tmp_path / "var" / "postgresql").exists()
    usage = subprocess.run([str(tmp_path / "bin" / "postgresql")], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "fg | init | psql" in usage.stderr


def test_relstorage_tuning_options_reach_zope_conf_the_pipeline_and_postgres(tmp_path):
    """Issue 32's settings: RelStorage's cache keys in every client's <relstorage>,
    transaction-mode = explicit (the RelStorage default) as the explicittx filter right before the Zope app (with
    plonedeploy.runtime among the eggs), and the postgresql part's settings in the
    server's command line after the part's own."""
    result = buildout(tmp_path, PG + "[instance]\nrelstorage-cache-local-mb = 100\n"
                      "relstorage-cache-local-dir = ${buildout:directory}/var/rs-cache\n"
                      "relstorage-blob-cache-size = 512MB\ntransaction-mode = explicit\n"
                      "[postgresql]\nsettings =\n    shared_buffers = 256MB\n    jit = off\n")
    assert result.returncode == 0, result.stdout + result.stderr
    for part in ("instance", "client2", "uploads"):
        zope_conf = (tmp_path / "parts" / part / "etc" / "zope.conf").read_text()
        assert "shared-blob-dir false\n        cache-local-mb 100\n" in zope_conf, zope_conf
        assert f"cache-local-dir {tmp_path}/var/rs-cache\n" in zope_conf
        assert f"blob-cache-size {512 * 2**20}\n" in zope_conf
        ini = _ini(tmp_path / "parts" / part / "etc" / "wsgi.ini")
        assert dict(ini["filter:explicittx"]) == {"use": "egg:plonedeploy.runtime#explicittx"}
        assert ini["pipeline:main"]["pipeline"].split()[-2:] == ["explicittx", "zope"]
        assert "plonedeploy.runtime" in (tmp_path / "bin" / part).read_text()
    pg_config = json.loads((tmp_path / "parts" / "postgresql" / "postgresql.json").read_text())
    assert pg_config["settings"] == {"shared_buffers": "256MB", "jit": "off"}
    # the default: RelStorage's own cache settings, and explicit mode (since 29 Nov 2026;
    # a ZEO client's default, implicit, is test_options' and every ZEO build's)
    result = buildout(tmp_path, PG)
    assert result.returncode == 0, result.stdout + result.stderr
    zope_conf = (tmp_path / "parts" / "instance" / "etc" / "zope.conf").read_text()
    assert "cache-local" not in zope_conf and "blob-cache-size" not in zope_conf
    ini = _ini(tmp_path / "parts" / "instance" / "etc" / "wsgi.ini")
    assert ini["pipeline:main"]["pipeline"].split()[-2:] == ["explicittx", "zope"]


def test_relstorage_shared_blob_directory(tmp_path):
    """shared-directory: the clients and zodbconvert's destination use var/relstorage-blobs."""
    result = buildout(tmp_path, TOOLS + "[instance]\nrelstorage-blobs = shared-directory\n")
    assert result.returncode == 0, result.stdout + result.stderr
    for part in ("instance", "client2"):
        zope_conf = (tmp_path / "parts" / part / "etc" / "zope.conf").read_text()
        assert f"blob-dir {tmp_path}/var/relstorage-blobs\n" in zope_conf
        assert "shared-blob-dir true" in zope_conf
    convert = (tmp_path / "parts" / "relstorage-tools" / "zodbconvert.conf").read_text()
    assert f"    blob-dir {tmp_path}/var/relstorage-blobs\n    shared-blob-dir true\n" in convert


# ZConfig reads the tools' files with RelStorage's own schemas (without opening a storage).
READ_TOOL_CONFIGS = """\
import io, json, sys, ZConfig
from relstorage import zodbconvert, zodbpack
out = {}
for module, path in ((zodbconvert, sys.argv[1]), (zodbpack, sys.argv[2])):
    schema = ZConfig.loadSchemaFile(io.StringIO(module.schema_xml))
    config, _ = ZConfig.loadConfigFile(schema, open(path))
    out[module.__name__] = config
convert, pack = out["relstorage.zodbconvert"], out["relstorage.zodbpack"].storages[0]
print(json.dumps({"source": [convert.source.config.path, convert.source.config.read_only,
                             convert.source.config.blob_dir],
                  "destination": [convert.destination.config.blob_dir,
                                  convert.destination.config.shared_blob_dir,
                                  convert.destination.config.adapter.config.dsn],
                  "pack": [pack.config.pack_gc, pack.config.adapter.config.dsn]}))
"""


def test_relstorage_tools_write_the_configs_of_zodbconvert_and_zodbpack(tmp_path):
    """[relstorage-tools]: zodbconvert's config reads the Data.fs read-only with its blobs and
    writes into the clients' database (their DSN, passfile and no password), blobs through a
    cache of the tools' own; zodbpack's packs that database with garbage collection. RelStorage's
    schemas accept both; bin/zodbconvert and bin/zodbpack are there (the clients' RelStorage egg)."""
    result = buildout(tmp_path, TOOLS)
    assert result.returncode == 0, result.stdout + result.stderr
    location = tmp_path / "parts" / "relstorage-tools"
    script = tmp_path / "read_tool_configs.py"  # the interpreter's -c ignores further arguments
    script.write_text(READ_TOOL_CONFIGS)
    code = subprocess.run([str(tmp_path / "parts" / "instance" / "bin" / "interpreter"), str(script),
                           str(location / "zodbconvert.conf"), str(location / "zodbpack.conf")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert code.returncode == 0, code.stderr
    read = json.loads(code.stdout.splitlines()[-1])
    dsn = f"host=127.0.0.1 port=18432 dbname=plone user=plone passfile={tmp_path}/var/postgresql/pgpass"
    assert read == {"source": [f"{tmp_path}/var/filestorage/Data.fs", True, f"{tmp_path}/var/blobstorage"],
                    "destination": [f"{tmp_path}/var/blobcache/relstorage-tools", False, dsn],
                    "pack": [True, dsn]}
    for name in ("zodbconvert", "zodbpack"):
        assert "RelStorage-4.3.0" in (tmp_path / "bin" / name).read_text()


def test_zeo_stays_the_default(built):
    directory, _ = built
    zope_conf = (directory / "parts" / "instance" / "etc" / "zope.conf").read_text()
    assert "<zeoclient>" in zope_conf and "relstorage" not in zope_conf
    assert "RelStorage" not in (directory / "bin" / "instance").read_text()


# relstorage.cfg itself, built in a directory of its own: only what must point back into
# this checkout (the recipes' source, the eggs, the logrotate template) is overridden.
RELSTORAGE_CFG = checkout_header(os.path.join(ROOT, "relstorage.cfg"), develop_eggs="{develop_eggs}") + """
[logrotate]
input = {root}/templates/logrotate.conf.in
"""


def test_relstorage_cfg_builds_nothing_of_zeo(tmp_path):
    """relstorage.cfg builds no ZEO server and no [backup] (repozo of a Data.fs RelStorage
    does not use): no bin/zeoserver, bin/backup, bin/restore, parts/zeoserver. Its logrotate
    config signals no ZEO pidfile; zodbconvert still reads the ZEO build's var/filestorage;
    the clients are RelStorage clients and the stack starts PostgreSQL."""
    cfg = tmp_path / "buildout.cfg"
    cfg.write_text(RELSTORAGE_CFG.format(root=ROOT, develop_eggs=develop_eggs()))
    result = subprocess.run([BUILDOUT, "-c", str(cfg)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    installed = configparser.ConfigParser(interpolation=None)
    installed.read(tmp_path / ".installed.cfg")
    assert installed["buildout"]["parts"].split() == [
        "postgresql", "instance", "client2", "uploads", "varnish", "haproxy", "stack", "logrotate",
        "upgrade-site", "relstorage-tools"]
    scripts = {path.name for path in (tmp_path / "bin").iterdir()}
    assert {"postgresql", "stack", "zodbconvert", "zodbpack", "upgrade-site"} <= scripts
    assert not scripts & {"zeoserver", "zeopack", "backup", "snapshotbackup", "restore", "snapshotrestore",
                          "repozo"}, scripts
    assert not (tmp_path / "parts" / "zeoserver").exists()
    logrotate = (tmp_path / "parts" / "logrotate" / "logrotate.conf").read_text()
    assert "pidfile=\n" in logrotate and "zeoserver.pid" not in logrotate
    convert = (tmp_path / "parts" / "relstorage-tools" / "zodbconvert.conf").read_text()
    assert f"    path {tmp_path}/var/filestorage/Data.fs\n" in convert
    assert f"    blob-dir {tmp_path}/var/blobstorage\n" in convert
    config = json.loads((tmp_path / "parts" / "stack" / "stack.json").read_text())
    assert config["processes"][0]["name"] == "postgresql"
    assert config["storage"] == "relstorage" and config["zeoserver"] is None  # core.running_zeo_server
    for part in ("instance", "client2", "uploads"):
        zope_conf = (tmp_path / "parts" / part / "etc" / "zope.conf").read_text()
        assert "<relstorage>" in zope_conf and "<zeoclient>" not in zope_conf and "blobstorage" not in zope_conf


def test_wheels_carry_the_templates_and_split_the_namespace(tmp_path):
    """Built as wheels and installed outside this checkout, plonedeploy.recipe finds the
    templates in its own package (copies of the checkout's templates/ and haproxy/ made when
    the wheel was built) and renders the same text from them as from the checkout; and
    plonedeploy.runtime imports beside it in the shared ``plonedeploy`` namespace, with its
    PasteDeploy entry points; neither wheel carries the other's modules."""
    pip = os.path.join(ROOT, ".venv-buildout", "bin", "pip")
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    # Copies: setuptools builds in the source tree and would leave build/ in the checkout.
    # The same layout as the checkout's, whose templates/ and haproxy/ the wheel's build copies.
    checkout = tmp_path / "checkout"
    for folder in ("templates", "haproxy"):
        shutil.copytree(os.path.join(ROOT, folder), checkout / folder)
    sources = [str(shutil.copytree(os.path.join(ROOT, "recipes", name), checkout / "recipes" / name,
                                   ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__")))
               for name in ("plonedeploy.recipe", "plonedeploy.runtime")]
    subprocess.run([pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), *sources],
                   check=True, capture_output=True, timeout=300)
    subprocess.run([pip, "install", "-q", "--no-deps", "--target", str(target), *map(str, wheels.glob("*.whl"))],
                   check=True, capture_output=True, timeout=300)
    assert not (target / "plonedeploy" / "__init__.py").exists()  # PEP 420: no portion owns it
    assert not (target / "plonedeploy" / "recipe" / "servers").exists()
    code = (
        "import json, os, importlib.metadata as m\n"
        "from plonedeploy.recipe import options\n"
        "import plonedeploy.runtime.blobfilter as b\n"
        "eps = {e.group + ':' + e.name: e.value for e in m.distribution('plonedeploy.runtime').entry_points}\n"
        "from plonedeploy.stack.supervisor import write_supervisor_config\n"
        "config = json.loads(os.environ['STACK_CONFIG'])\n"
        "write_supervisor_config(config)\n"
        "print(json.dumps([options.TEMPLATES_DIRECTORY, options.HAPROXY_TEMPLATE, options.__file__, b.__file__,\n"
        "                  sorted(eps.items())]))\n"
    )
    # supervisord's config and a program's, rendered by bin/stack's code from the wheel's
    # templates and from the checkout's: the same text.
    rendered = {}
    for where in ("wheel", "checkout"):
        rendered[where] = run = tmp_path / f"run-{where}"
        os.makedirs(run)
    configs = {where: {"processes": [{"name": "instance", "argv": ["/bin/true"], "stage": 1}],
                       "run_dir": "/srv/run", "log_dir": "/srv/log", "directory": "/srv",
                       "supervisor_config": str(rendered[where] / "supervisord.conf")}
               for where in rendered}
    from plonedeploy.stack.supervisor import write_supervisor_config
    write_supervisor_config(configs["checkout"])
    # The test venv's python: Jinja2 and zc.buildout importable, plonedeploy only from ``target``.
    out = subprocess.run([os.path.join(ROOT, ".venv", "bin", "python"), "-c", code], cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(target), STACK_CONFIG=json.dumps(configs["wheel"])),
                         capture_output=True, text=True, timeout=60, check=True)
    templates, haproxy, options_file, blobfilter, entry_points = json.loads(out.stdout)
    assert templates == str(target / "plonedeploy" / "stack" / "templates")
    assert haproxy == os.path.join(templates, "haproxy.cfg.j2")
    assert options_file.startswith(str(target)) and blobfilter.startswith(str(target))
    names = [f"{server}.ini.in" for server in SERVERS] + ["_common.ini.in", "logrotate.conf.in", "varnish.vcl.j2",
                                                         "supervisord.conf.j2", "program.conf.j2"]
    for name in names:  # the same files as the checkout's
        with (open(os.path.join(templates, name), "rb") as wheel,
              open(os.path.join(TEMPLATES_DIRECTORY, name), "rb") as ours):
            assert wheel.read() == ours.read(), name
    with open(haproxy, "rb") as wheel, open(HAPROXY_TEMPLATE, "rb") as ours:
        assert wheel.read() == ours.read()
    for name, expected in (("supervisord.conf", "[supervisord]"),
                           (os.path.join("supervisor.d", "instance.conf"), "[program:instance]")):
        texts = {where: (run / name).read_text().replace(str(run), "RUN") for where, run in rendered.items()}
        assert texts["wheel"] == texts["checkout"] and expected in texts["wheel"], name
    assert ["paste.filter_factory:blobsendfile", "plonedeploy.runtime.blobfilter:filter_factory"] in entry_points
    assert ["paste.server_factory:gunicorn", "plonedeploy.runtime.servers.gunicorn:server_factory"] in entry_points
