"""Ansible, for real: lint, the roles' rules against the recipe's, bad variables refused
before any change, and the checks of the shared converge (``deployed``, tests/ansible_deploy.py):
the processes, Prometheus, the paths through HAProxy, cron, a changed build rolled under
load, idempotence, check mode, TLS and the cache, a rolling restart.
"""
import base64
import hashlib
import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import requests

from ansible_deploy import (ANSIBLE, BIN, BLOB_SIZE, CRON_FILES, FRONTEND, PROMETHEUS, PROMETHEUS_TARGETS,
                            TLS_FRONTEND, VARNISH, current_release, playbook, recap, record, render_units)
from conftest import RESTART_LOAD_RATE, ROOT, assert_loaded_throughout, run, while_loaded
from fake_buildout import fake_buildout
from loadtests.core import haproxy_stats
from plonedeploy.recipe import optiontables, varnish
from plonedeploy.stack import rules, storage

pytestmark = pytest.mark.ansible

def test_lint_and_syntax():
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"])
    run([os.path.join(BIN, "yamllint"), "--strict", "."], timeout=120, cwd_override=ANSIBLE, env=env)
    lint = run([os.path.join(BIN, "ansible-lint"), "--profile", "production"], timeout=600,
               cwd_override=ANSIBLE, env=env)
    assert "passed" in lint.stdout + lint.stderr
    for book in ("site.yml", "restart.yml", "rollback.yml"):
        run([os.path.join(BIN, "ansible-playbook"), book, "--syntax-check"], timeout=120,
            cwd_override=ANSIBLE, env=env)


def test_buildout_venv_pins_match_requirements():
    defaults = open(os.path.join(ANSIBLE, "roles", "buildout", "defaults", "main.yml")).read()
    pins = set(re.findall(r"^\s+- ([\w.-]+==[\w.]+)$", defaults, re.MULTILINE))
    assert len(pins) == 6, pins
    requirements = {line.strip() for line in open(os.path.join(ROOT, "requirements-buildout.txt"))
                    if "==" in line and not line.startswith("#")}
    assert pins <= requirements


def test_varnish_rules_match_the_recipe():
    """The roles' copies of plonedeploy.recipe's varnish rules (health path, cookies, defaults)."""
    def text(*path):
        with open(os.path.join(ANSIBLE, "roles", *path), encoding="utf-8") as fp:
            return fp.read()

    def value(source, name):
        return re.search(rf"^{name}: (.*)$", source, re.MULTILINE).group(1).strip()

    defaults = text("varnish", "defaults", "main.yml")
    assert value(text("varnish", "vars", "main.yml"), "varnish_health_path") == varnish.HEALTH_PATH
    assert value(text("haproxy", "vars", "main.yml"), "haproxy_cache_health_path") == varnish.HEALTH_PATH
    # (the defaults of the varnish options: test_role_defaults_and_choices_are_the_recipes)
    # the monitoring role scrapes the exporter at the varnish role's default address
    prometheus = text("monitoring", "templates", "prometheus.yml.j2")
    assert prometheus.count(f"varnish_metrics_listen | default('{value(defaults, 'varnish_metrics_listen')}')") == 1
    haproxy = text("haproxy", "defaults", "main.yml")
    assert f"default('{varnish.DEFAULT_BIND}')" in value(haproxy, "haproxy_cache_server")
    assert f"default('{varnish.DEFAULT_BACKEND}')" in value(haproxy, "haproxy_cache_fill_bind")


def _yaml(path):
    """A YAML file of ansible/ as Python data (PyYAML of Ansible's venv; .venv has none)."""
    out = run([os.path.join(BIN, "python"), "-c",
               "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
               os.path.join(ANSIBLE, path)], timeout=60).stdout
    return json.loads(out)


#: Role variables named like a recipe option (``<role>_<option with _>``) whose default
#: differs from the recipe's on purpose.
ROLE_DEFAULTS_OF_THEIR_OWN = {
    # a deployed site blocks the ZMI but from localhost (buildout.cfg sets the same)
    "haproxy_manage_networks",
    # a deployed site serves HTTPS on :443 of the frontend's address
    "haproxy_tls_bind",
    # a switch for the varnish role on the same host, where the recipe names a varnish part
    "haproxy_cache",
    # the deployment's prefix, not ${buildout:directory}
    "haproxy_run_directory",
    # a deployed balancer always drops to Debian's haproxy user and group; the recipe only when
    # its buildout names one (buildout.cfg: [service] balancer-user, set by make build as root)
    "haproxy_user",
    "haproxy_group",
    # ... confined to Debian's empty /var/lib/haproxy; the recipe's "auto" is an empty
    # directory of its part, and only with a user (a chroot as root confines nothing)
    "haproxy_chroot",
    # a deployed varnish always runs in Debian's unix jail; the recipe's stack only as root
    # with a service user (buildout.cfg: [service] varnish-jail), else as whoever starts it
    "varnish_jail",
}


def _as_option(value):
    """A role default (YAML) as the text of a buildout option: lists whitespace-separated,
    booleans on/off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return " ".join(str(item) for item in value)
    return str(value)


def test_role_defaults_and_choices_are_the_recipes():
    """Every haproxy_*/varnish_* role default and argument_specs choice named after a recipe
    option (optiontables) is the recipe's, but the few that differ on purpose; and the
    zeoclient role's per-client options are the instance recipe's."""
    compared = set()
    for role, table in (("haproxy", optiontables.HAPROXY), ("varnish", optiontables.VARNISH)):
        defaults = _yaml(f"roles/{role}/defaults/main.yml")
        spec = _yaml(f"roles/{role}/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
        for option in table:
            variable = f"{role}_{option.name.replace('-', '_')}"
            if "choices" in spec.get(variable, {}):
                assert tuple(spec[variable]["choices"]) == option.allowed, variable
                compared.add(f"{variable} choices")
            if variable in defaults and variable not in ROLE_DEFAULTS_OF_THEIR_OWN and option.default is not None:
                assert _as_option(defaults[variable]) == option.default, variable
                compared.add(variable)
    client = _yaml("roles/zeoclient/meta/argument_specs.yml")["argument_specs"]["main"]["options"][
        "zeoclient_clients"]["options"]
    wsgi_server = next(option for option in optiontables.INSTANCE if option.name == "wsgi-server")
    assert (tuple(client["wsgi_server"]["choices"]), client["wsgi_server"]["default"]) == (
        wsgi_server.allowed, wsgi_server.default)
    # the allocator: the role's default for every client, a client's own choice without one
    zeoclient = _yaml("roles/zeoclient/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    zeoclient_defaults = _yaml("roles/zeoclient/defaults/main.yml")
    for name in ("malloc", "malloc-arena-max"):
        option = next(option for option in optiontables.INSTANCE if option.name == name)
        variable = name.replace("-", "_")
        assert _as_option(zeoclient_defaults[f"zeoclient_{variable}"]) == option.default, name
        if isinstance(option.allowed, tuple):
            assert tuple(zeoclient[f"zeoclient_{variable}"]["choices"]) == option.allowed, name
            assert tuple(client[variable]["choices"]) == option.allowed and "default" not in client[variable], name
    assert len(compared) == 26, sorted(compared)  # a renamed variable must not drop out unseen


def test_client_rules_are_the_recipes():
    """The zeoclient role offers the recipe's WSGI servers with its default, leaves threads
    to the recipe's default, and its filters give the recipe's thread and fd-limit rules."""
    spec = _yaml("roles/zeoclient/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    client = spec["zeoclient_clients"]["options"]
    assert client["wsgi_server"]["choices"] == list(rules.SERVERS)
    assert client["wsgi_server"]["default"] == rules.DEFAULT_SERVER
    assert "default" not in client["threads"]  # unset: the recipe's default_threads
    assert client["malloc"]["choices"] == spec["zeoclient_malloc"]["choices"] == list(rules.MALLOCS)
    assert "default" not in client["malloc"]  # unset: zeoclient_malloc, whose default is the recipe's
    env = dict(os.environ, PYTHONPATH=os.path.join(ANSIBLE, "filter_plugins"))
    out = run([os.path.join(BIN, "python"), "-c", """
import json, plonedeploy_edge
f = plonedeploy_edge.FilterModule().filters()
servers = {SERVERS}
print(json.dumps({{
    "defaults": {{s: f["plonedeploy_client_threads"]({{"wsgi_server": s}}) for s in servers}},
    "errors": {{s: f["plonedeploy_threads_errors"]([{{"name": "c", "wsgi_server": s, "threads": 2}}])
               for s in servers}},
    "fd": f["plonedeploy_fd_limit_needed"](100, [{{"maxconn": 2}}, {{"maxconn": 1}}]),
    "auto": {{f"{{s}} {{cores}} {{n}}":
             f["plonedeploy_client_threads"]({{"wsgi_server": s, "threads": "auto"}}, cores, n)
              for s in servers for cores in (0, 1, 2, 8) for n in (1, 2, 3)}},
    "given": f["plonedeploy_client_threads"]({{"wsgi_server": "waitress", "threads": 4}}, 1, 3),
    "unset": f["plonedeploy_client_threads"]({{"wsgi_server": "gevent"}}, 8, 1),
    "auto_errors": f["plonedeploy_threads_errors"]([{{"name": "c", "wsgi_server": "bjoern", "threads": "auto"}}]),
}}))""".format(SERVERS=list(rules.SERVERS))], timeout=60, env=env).stdout
    got = json.loads(out)
    # threads: auto is the recipe's rule for the host's cores and clients; before the facts
    # (cores 0) the most it can choose
    assert got["auto"] == {f"{s} {cores} {n}":
                           (rules.auto_threads(s, cores, n)[0] if cores else rules.default_threads(s))
                           for s in rules.SERVERS for cores in (0, 1, 2, 8) for n in (1, 2, 3)}
    assert (got["given"], got["unset"], got["auto_errors"]) == (4, 1, [])
    assert got["defaults"] == {s: rules.default_threads(s) for s in rules.SERVERS}
    assert {s for s, errors in got["errors"].items() if errors} == set(rules.SINGLE_THREADED)
    assert got["fd"] == rules.fd_limit_needed(100, [{"maxconn": 2}, {"maxconn": 1}])


def test_abtest_json_is_the_stack_recipes(tmp_path):
    """The haproxy role's abtest.json task, run by Ansible with its filter plugin, writes the
    document that plonedeploy.recipe:stack writes into stack.json for the same stack
    (``rules.ab_contract``), but for ``processes``, which supervisord keeps."""
    from plonedeploy.recipe import haproxy, stack

    run_dir = str(tmp_path / "var" / "run")
    buildout = fake_buildout(tmp_path)
    buildout["haproxy"] = {"backends": "instance", "upload-backends": "uploads", "bind": "127.0.0.1:9903",
                           "stats-bind": "127.0.0.1:9904", "tls-bind": "127.0.0.1:9905", "balance": "roundrobin",
                           "max-body-size": "1048576000"}
    haproxy.Recipe(buildout, "haproxy", buildout["haproxy"])
    recipe = stack.Recipe(buildout, "stack", {"zeoserver": "zeoserver", "clients": "instance",
                                              "upload-clients": "uploads", "haproxy": "haproxy"})
    tasks = _yaml("roles/haproxy/tasks/main.yml")
    task = next(t for t in tasks if t["name"].startswith("Describe the stack for the A/B report"))
    written = tmp_path / "abtest.json"
    play = [{"hosts": "localhost", "gather_facts": False, "connection": "local", "vars": {
        "haproxy_page_servers": [{"name": "instance", "wsgi_server": "pyruvate", "lane": "pages"}],
        "haproxy_upload_servers": [{"name": "uploads", "wsgi_server": "waitress", "lane": "uploads"}],
        "haproxy_bind": "127.0.0.1:9903", "haproxy_stats_bind": "127.0.0.1:9904",
        "haproxy_tls_bind": "127.0.0.1:9905", "haproxy_balance": "roundrobin", "haproxy_run_directory": run_dir,
        "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [{"ansible.builtin.copy": dict(task["ansible.builtin.copy"], dest=str(written))}]}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_FILTER_PLUGINS=os.path.join(ANSIBLE, "filter_plugins"),
               ANSIBLE_CONFIG=os.path.join(ANSIBLE, "ansible.cfg"))
    run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", str(tmp_path / "play.yml")],
        timeout=120, env=env)
    document = json.loads(written.read_text())
    assert set(document) == set(rules.ab_contract([], [], "", "", "", "", ""))
    assert recipe.config["run_dir"] == run_dir  # the stack's var/run, given to Ansible as its own
    assert document == dict({key: recipe.config[key] for key in document}, processes=[])
    assert document["tls_url"] == "https://127.0.0.1:9905" and document["server_kinds"] == {"instance": "pyruvate"}


def test_storage_rules_are_the_recipes():
    """The zeoclient role's storage switch offers the recipe's storages and blob modes with
    its defaults, and the filter plugin gives the recipe's DSN, DSN check and verifier."""
    spec = _yaml("roles/zeoclient/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = _yaml("roles/zeoclient/defaults/main.yml")
    assert spec["zeoclient_storage"]["choices"] == list(storage.STORAGES)
    assert defaults["zeoclient_storage"] == storage.DEFAULT_STORAGE
    assert spec["zeoclient_relstorage_blobs"]["choices"] == list(storage.RELSTORAGE_BLOBS)
    assert defaults["zeoclient_relstorage_blobs"] == storage.DEFAULT_RELSTORAGE_BLOBS
    pg_defaults = _yaml("roles/postgresql/defaults/main.yml")
    assert storage.IDENTIFIER_RE.match(pg_defaults["postgresql_database"])
    assert storage.IDENTIFIER_RE.match(pg_defaults["postgresql_user"])
    env = dict(os.environ, PYTHONPATH=os.path.join(ANSIBLE, "filter_plugins"))
    config = {"host": "10.0.0.6", "port": "5432", "database": "plone", "user": "plone", "passfile": "/srv/pgpass"}
    out = run([os.path.join(BIN, "python"), "-c", """
import json, sys, plonedeploy_edge
f = plonedeploy_edge.FilterModule().filters()
config = json.loads(sys.argv[1])
first = f["plonedeploy_scram_verifier"]("pencil")
print(json.dumps({
    "dsn": f["plonedeploy_site_dsn"](config),
    "errors": [f["plonedeploy_dsn_errors"](d)
               for d in ("host=a dbname=b", "host=a user=b", "host=a dbname=b password=x")],
    "ids": [f["plonedeploy_identifier_ok"](n) for n in ("plone", "Plone", "a-b", "x" * 64)],
    "first": first,
    "kept": f["plonedeploy_scram_verifier"]("pencil", first),
    "other": f["plonedeploy_scram_verifier"]("pencil2", first),
}))""", json.dumps(config)], timeout=60, env=env).stdout
    got = json.loads(out)
    assert got["dsn"] == storage.site_dsn(config) == (
        "host=10.0.0.6 port=5432 dbname=plone user=plone passfile=/srv/pgpass")
    storage.parse_dsn(got["dsn"])  # the recipe accepts what the role builds
    assert got["errors"][0] == [] and "(dbname is missing)" in got["errors"][1][0]
    assert "password=***" in got["errors"][2][0] and "password=x" not in got["errors"][2][0]
    assert got["ids"] == [True, False, False, False]
    # the stored verifier is kept while it verifies the password (a second run changes
    # nothing); another password gets a new verifier with a new salt
    assert got["kept"] == got["first"] and got["other"] != got["first"]
    iterations, salt = re.match(r"SCRAM-SHA-256\$(\d+):([^$]+)\$", got["first"]).groups()
    assert storage.scram_verifier("pencil", base64.b64decode(salt), int(iterations)) == got["first"]
    assert storage.scram_verifier_for("pencil2", got["first"]) != got["first"]


BAD = [
    ({"zeoclient_clients": [{"name": "c1", "port": 18081, "wsgi_server": "tornado"}]},
     "value of wsgi_server must be one of: " + ", ".join(rules.SERVERS) + ", got: tornado"),
    # the recipe's thread rule (rules.threads_error through filter_plugins/plonedeploy_edge.py)
    ({"zeoclient_clients": [{"name": "c1", "port": 18081, "wsgi_server": "bjoern", "threads": 2}]},
     "client c1: threads 2 on bjoern; allowed: 1 for wsgi-server = bjoern"),
    ({"zeoclient_clients": [{"name": "c1", "port": 18081}, {"name": "c2", "port": 18081}]},
     "a unique\nport 1-65535"),
    ({"zeoclient_clients": [{"name": "c1", "port": 18081, "threads": 0}]}, "threads >= 1"),
    ({"zeoclient_clients": [{"name": "c1", "port": 18081, "threads": "many"}]}, "threads >= 1 or auto"),
    ({"zeoclient_clients": [{"name": "instance", "port": 18081}]}, "not one of buildout, versions"),
    ({"zeoclient_bind_address": "0.0.0.0"}, "zeoclient_bind_address\nmust not be 0.0.0.0"),
    ({"haproxy_balance": "fastest"}, "value of haproxy_balance must be one of: leastconn"),
    ({"haproxy_manage_networks": ["intranet"]},
     'haproxy_manage_networks a list of CIDR networks such as 127.0.0.1/32 (got ["intranet"])'),
    ({"zeoserver_address": "0.0.0.0:18100"}, "not 0.0.0.0"),
    ({"zeoserver_backup_keep": -1}, "zeoserver_backup_keep must be >= 0"),
    ({"zeoserver_logrotate_rotate": 0}, "zeoserver_logrotate_rotate >= 1"),
    # releases side by side: the running one and one to roll back to
    ({"zeoserver_releases_keep": 1}, "zeoserver_releases_keep >= 2 (the running release and one before it)"),
    ({"zeoclient_releases_keep": 1}, "zeoclient_releases_keep >= 2 (the running release and one to roll back to)"),
    ({"zeoclient_clients": [{"name": "backup", "port": 18081}]}, "not one of buildout, versions"),
    ({"process_manager_kind": "runit"}, "value of process_manager_kind must be one of: supervisor, systemd"),
    ({"process_manager_environments": {"client1": {"1X": "1"}}},
     'values without quotes, backslashes, control characters, " ;" or " #"; got {"client1": {"1X": "1"}}'),
    # supervisor's INI parser would cut the value at " #" (an inline comment)
    ({"process_manager_environments": {"client1": {"X": "a #b"}}}, 'got {"client1": {"X": "a #b"}}'),
    # the recipe's own edge rules (edge.py through filter_plugins/plonedeploy_edge.py)
    ({"zeoclient_clients": [{"name": "c1", "port": 18081},
                            {"name": "up", "port": 18079, "wsgi_server": "pyruvate", "lane": "uploads"}]},
     "[up] is in upload-backends but runs pyruvate"),
    ({"zeoclient_clients": [{"name": "c1", "port": 18081}]},
     "[c1] max-request-body-size = 1048576 is smaller than max-body-size"),
    ({"haproxy_upload_threshold": 20000}, "upload-threshold = 20000 is larger than HAProxy can buffer"),
    ({"haproxy_server_names": ["www.example.org:443"]}, "'www.example.org:443' has a port"),
    ({"haproxy_per_source_exempt": ["everyone"]}, 'haproxy_per_source_exempt CIDR networks, got ["everyone"]'),
    ({"haproxy_tls_bind": "443"}, "haproxy_tls_bind must be host:port (or empty for no TLS)"),
    ({"zeoclient_clients": [{"name": "c1", "port": 18081, "lane": "fast"}]},
     "value of lane must be one of: pages, uploads, got: fast"),
    ({"zeoclient_clients": [{"name": "c1", "port": 18081, "metrics_port": 18091},
                            {"name": "c2", "port": 18082, "metrics_port": 18091}]},
     "(metrics_port, if set, another unique one)"),
    ({"monitoring_disk_used_percent": 120}, "0 < monitoring_disk_used_percent < 100"),
    ({"monitoring_conflicts_per_minute": 0}, "monitoring_conflicts_per_minute must be > 0"),
    # the probes: their settings (the recipe's rules) and HAProxy's check on them
    ({"zeoclient_warmup_paths": ["/Plone", "Plone/@@search"]},
     "zeoclient_warmup_paths must be URL paths starting with / without spaces"),
    ({"zeoclient_stall_timeout": 0}, "zeoclient_stall_timeout and zeoclient_storage_grace seconds > 0"),
    # the memory watchdog (the recipe's memory-limit rules)
    ({"zeoclient_memory_limit": "lots"},
     "zeoclient_memory_limit and each client's memory_limit must be empty (the recipe's rule), off, or bytes"),
    ({"zeoclient_clients": [{"name": "c1", "port": 18081, "metrics_port": 18091, "wsgi_server": "waitress",
                             "memory_limit": "0"}]},
     "zeoclient_memory_limit and each client's memory_limit must be empty (the recipe's rule), off, or bytes"),
    ({"zeoclient_memory_limit_grace": 0}, "zeoclient_memory_limit_grace seconds > 0 (got 0)"),
    ({"zeoclient_clients": [{"name": "c1", "port": 18081, "wsgi_server": "waitress",
                             "max_request_body_size": 1073741824}]},
     "haproxy_health_check /readyz: client c1 has no metrics address"),
    # the allocator (the recipe's malloc and malloc-arena-max rules)
    ({"zeoclient_malloc": "tcmalloc"}, "value of zeoclient_malloc must be one of: system, jemalloc, got: tcmalloc"),
    ({"zeoclient_malloc_arena_max": 0},
     "zeoclient_malloc_arena_max and each client's malloc_arena_max must be empty (glibc's default) or an integer"),
    ({"zeoclient_clients": [{"name": "c1", "port": 18081, "metrics_port": 18091, "wsgi_server": "waitress",
                             "malloc": "jemalloc", "malloc_arena_max": 2}]},
     "and empty for a client with malloc jemalloc (MALLOC_ARENA_MAX is glibc's; jemalloc ignores it)"),
    ({"zeoclient_max_conflict_retries": 9},
     "value of zeoclient_max_conflict_retries must be one of: 0, 1, 2, 3, 4, 5, 6, got: 9"),
    ({"monitoring_queue_for": "soon"}, "monitoring_queue_for a duration such as 1m"),
    ({"varnish_cache_size": "lots"}, "varnish_cache_size is a size such as 256M or 2G, got lots"),
    ({"varnish_backend": "127.0.0.1:16081"}, "not varnish's own"),
    ({"varnish_metrics_listen": "127.0.0.1:16081"}, "varnish_metrics_listen is empty or a host:port"),
    ({"varnish_cookie_allowlist": ["__ac", "a.b"]}, "varnish_cookie_allowlist names are letters"),
    ({"haproxy_tls_bind": ""}, "haproxy_cache needs haproxy_tls_bind"),
    ({"haproxy_tls_redirect_exempt": ["anyone"]}, "haproxy_tls_redirect_exempt a list of CIDR networks"),
    # the storage switch: the recipe's values (storage.py), its DSN rule through the filter plugin
    ({"zeoclient_storage": "s3"}, "value of zeoclient_storage must be one of: zeo, relstorage, got: s3"),
    ({"zeoclient_storage": "relstorage", "zeoclient_relstorage_blobs": "nfs"},
     "value of zeoclient_relstorage_blobs must be one of: database, shared-directory, got: nfs"),
    # (the group's name follows: each refusal case has a databases group of its own)
    ({"zeoclient_storage": "relstorage"}, "zeoclient_storage = relstorage needs a database: a host in group '"),
    ({"zeoclient_storage": "relstorage", "zeoclient_relstorage_dsn": "host=db1 dbname=plone password=Sekr1t"},
     "zeoclient_relstorage_dsn: 'host=db1 dbname=plone password=***' is invalid: expected libpq key=value pairs"),
    ({"zeoclient_storage": "relstorage", "zeoclient_relstorage_dsn": "host=db1 user=plone"}, "(dbname is missing)"),
    ({"haproxy_write_lane": "maybe"},
     "argument 'haproxy_write_lane' is of type str and we were unable to convert to bool"),
    # the hosts (issue 26): the firewall's networks, the service users, supervisord's umask
    ({"firewall_admin_networks": []}, "firewall_admin_networks must name at least one address or CIDR network"),
    ({"firewall_admin_networks": ["intranet"]}, "'intranet' is no IPv4/IPv6 address or CIDR network"),
    ({"firewall_refuse": "bounce"}, "value of firewall_refuse must be one of: reject, drop, got: bounce"),
    ({"zeoserver_user": "root"}, "zeoserver_user must be a system user name other than root"),
    ({"zeoclient_user": "root"}, "zeoclient_user must be a system user name other than root"),
    ({"haproxy_user": "root"}, "haproxy_user and haproxy_group must name a user and group other than root"),
    ({"monitoring_prometheus_user": "root"},
     "monitoring_prometheus_user and monitoring_node_exporter_user must be system user names other than root"),
    ({"varnish_exporter_user": "root"}, "varnish_exporter_user must be a system user name other than root"),
    ({"process_manager_umask": "000"}, "process_manager_umask must be an octal umask that keeps others from writing"),
    # alerts that reach someone (issue 27): Alertmanager, its receivers, the blackbox probe
    ({"monitoring_alertmanager_listen": "127.0.0.1:18190"},
     "monitoring_alertmanager_listen and monitoring_blackbox_listen must be host:port, and differ"),
    ({"monitoring_alert_webhook_urls": ["hooks.example.org/alerts"]},
     "monitoring_alert_webhook_urls must be http:// or https:// URLs"),
    ({"monitoring_alert_smtp_smarthost": "mail.example.org:587", "monitoring_alert_smtp_from": "ops@example.org"},
     "monitoring_alert_smtp_to a list of at least one"),
    ({"monitoring_alert_smtp_smarthost": "mail.example.org:587", "monitoring_alert_smtp_from": "ops@example.org",
      "monitoring_alert_smtp_to": ["ops@example.org"], "monitoring_alert_smtp_auth_username": "ops",
      "monitoring_alert_smtp_auth_password": "Sekr1t", "monitoring_alert_group_wait": "soon"},
     "monitoring_alert_group_wait, monitoring_alert_group_interval, monitoring_site_down_for must be durations"),
    ({"monitoring_cert_expiry_days": 0}, "monitoring_cert_expiry_days and monitoring_probe_timeout > 0"),
    ({"monitoring_probe_urls": ["http://www.example.org/"]}, "monitoring_probe_urls must be https:// URLs"),
    ({"monitoring_alertmanager_user": "root"},
     "monitoring_alertmanager_user and monitoring_blackbox_user must be system user names other than root"),
    # certificates from ACME (issue 27, item 6); inventories/local's names are 127.0.0.1 and
    # localhost, neither a DNS name HTTP-01 can certify
    ({"haproxy_acme_directory": "http://acme.example.org/directory"},
     "haproxy_acme_directory must be the https:// URL of an ACME directory, and ACME needs haproxy_tls_bind, "
     "no haproxy_tls_certificate of your own, and at least one DNS name to certify"),
    ({"haproxy_acme_directory": "https://acme.example.org/directory"},
     'names [] of ["127.0.0.1", "localhost"]'),
    ({"haproxy_acme_directory": "https://acme.example.org/directory", "haproxy_acme_domains": ["www.example.org"]},
     'names ["www.example.org"] of ["127.0.0.1", "localhost"]'),
    ({"haproxy_acme_directory": "https://acme.example.org/directory", "haproxy_server_names": ["www.example.org"],
      "haproxy_tls_certificate": "/etc/ssl/private/site.pem"},
     "certificate '/etc/ssl/private/site.pem', names [\"www.example.org\"]"),
    ({"haproxy_acme_user": "root"}, "haproxy_acme_user must be a system user name other than root and haproxy_user"),
    ({"haproxy_acme_challenge_bind": "127.0.0.1:80"}, "'3,15', '41', '127.0.0.1:80'"),
    ({"haproxy_acme_cron_file": "acme.renew"}, "got 'acme', 'acme.renew', '3,15'"),
    ({"haproxy_acme_timer": "anacron"}, "value of haproxy_acme_timer must be one of: cron, systemd, got: anacron"),
    # the canary deploy (issue 29): checked with plonedeploy_canary only, before the build
    ({"canary_weight": 0, "plonedeploy_canary": True}, "canary_weight must be 1-256 (got 0)"),
    ({"canary_max_slowdown": 0, "plonedeploy_canary": True}, "canary_max_slowdown a fraction > 0 and < 10 (got 0"),
    ({"canary_settle": -1, "plonedeploy_canary": True}, "canary_settle >= 0 s (got -1)"),
    ({"canary_window": 30, "canary_duration": 20, "plonedeploy_canary": True},
     "canary_window > 0 s and at most the duration (got 30)"),
    ({"canary_classes": ["html"], "plonedeploy_canary": True}, "canary_classes"),
    ({"canary_duration": "long", "plonedeploy_canary": True},
     "argument 'canary_duration' is of type str and we were unable to convert to int"),
    # inventories/local's page clients are pyruvate and waitress: none has a peer of its server
    ({"plonedeploy_canary": True}, "no page client has another page client of its WSGI server to be compared with"),
    ({"canary_client": "uploads", "plonedeploy_canary": True},
     "canary_client = 'uploads' is not a page client (lane pages) of the pool"),
]

#: The postgresql role's checks: localhost joins the databases group (below).
DATABASE_BAD = [
    ({"postgresql_address": "0.0.0.0:5432"}, "postgresql_address = 0.0.0.0:5432 is invalid"),
    ({"postgresql_address": "*:5432"}, "postgresql_address = *:5432 is invalid"),
    ({"postgresql_address": "10.0.0.2"}, "expected host:port with a port 1-65535"),
    ({"postgresql_database": "Plone-Site"},
     "postgresql_database = 'Plone-Site' / postgresql_user = 'plone' is invalid"),
    ({"postgresql_user": "1st"}, "expected a lower-case identifier such as plone"),
    ({"postgresql_backup_keep": 0}, "postgresql_backup_keep must be >= 1"),
    ({"postgresql_cron_file": "pg.dump"}, "postgresql_cron_file empty or letters"),
    ({"postgresql_client_networks": ["everyone"]}, "postgresql_client_networks addresses or CIDRs"),
    ({"postgresql_process_manager": "runit"},
     "value of postgresql_process_manager must be one of: supervisor, systemd"),
]

#: The loadgenerator role's checks: localhost joins the loadgenerators group (below).
LOADGENERATOR_BAD = [
    ({"loadgenerator_master_host": ""}, "loadgenerator_master_host must name the control host"),
    ({"loadgenerator_master_host": "10.0.0.1", "loadgenerator_workers": 0}, "loadgenerator_workers >= 1"),
    ({"loadgenerator_master_host": "10.0.0.1", "loadgenerator_locust_version": "2.47"},
     "loadgenerator_locust_version an exact version such as 2.47.0"),
    ({"loadgenerator_master_host": "10.0.0.1", "loadgenerator_user": "root"},
     "loadgenerator_user must be a system user name other than root"),
]


def test_systemd_units_verify(tmp_path):
    """process_manager_kind: systemd, as far as a machine without systemd allows: the unit
    the process_manager role writes, rendered by Ansible's template module for HAProxy (with
    its reload signal), a ZEO client, varnish, a Locust worker and PostgreSQL (User=,
    KillSignal=SIGINT) passes
    ``systemd-analyze verify`` (syntax, known directives, executable ExecStart)."""
    varnish_dir = tmp_path / "varnish"
    varnish_dir.mkdir()
    programs = [
        {"name": "haproxy", "command": ["/usr/sbin/haproxy", "-W", "-db", "-f", str(tmp_path / "haproxy.cfg")],
         "signal": "USR2", "directory": str(tmp_path)},
        {"name": "client1", "command": [os.path.join(ROOT, "bin", "instance"), "console"], "signal": "",
         "directory": ROOT, "env": {"MALLOC_ARENA_MAX": 2, "TZ": "Europe/Zurich", "PCT": "100%"}},
        {"name": "varnish", "command": ["/usr/sbin/varnishd", "-F", "-j", "unix", "-n", str(varnish_dir / "work"),
                                        "-f", str(varnish_dir / "varnish.vcl"), "-a", "127.0.0.1:6081"],
         "signal": "", "directory": str(varnish_dir)},
        {"name": "locust-worker-1", "command": [os.path.join(ROOT, ".venv", "bin", "locust"), "-f",
                                                os.path.join(ROOT, "loadtests", "locustfile.py"), "--worker",
                                                "--master-host", "10.0.0.1"],
         "signal": "", "directory": str(tmp_path)},
        # the postgresql role's: as its own user, stopped by SIGINT (fast shutdown)
        {"name": "postgresql", "command": ["/usr/lib/postgresql/15/bin/postgres", "-D", str(tmp_path / "data")],
         "signal": "", "directory": str(tmp_path), "user": "postgres", "stop": "INT"},
    ]
    render_units(programs, tmp_path)
    units = sorted(str(p) for p in tmp_path.glob("plonedeploy-*.service"))
    assert len(units) == len(programs)
    haproxy_unit = (tmp_path / "plonedeploy-haproxy.service").read_text()
    assert "ExecReload=/bin/kill -USR2 $MAINPID" in haproxy_unit
    client_unit = (tmp_path / "plonedeploy-client1.service").read_text()
    assert "ExecReload" not in client_unit
    # sorted; % doubled (systemd's specifiers)
    assert 'Environment="MALLOC_ARENA_MAX=2"\nEnvironment="PCT=100%%"\nEnvironment="TZ=Europe/Zurich"\n' in client_unit
    assert "Environment=" not in haproxy_unit
    postgresql_unit = (tmp_path / "plonedeploy-postgresql.service").read_text()
    assert "User=postgres\n" in postgresql_unit and "KillSignal=SIGINT\n" in postgresql_unit
    assert "User=" not in haproxy_unit and "KillSignal" not in haproxy_unit
    result = run(["systemd-analyze", "verify", *units], timeout=60, check=False)
    # An unknown directive is only a warning ("Unknown key ..., ignoring"), exit status 0.
    assert result.returncode == 0 and "ignoring" not in result.stderr, result.stdout + result.stderr


def test_acme_renewal_command_and_timer_units(tmp_path):
    """haproxy_acme_*: the renewal command (certbot renew as the ACME user, then the deploy
    hook as root: copy, haproxy -c, reload) and the systemd timer that runs it, rendered by
    Ansible with the role's defaults and vars: ``sh -n``, ``systemd-analyze verify`` and
    ``calendar``. Running them against a CA: make multihost (cron there: no systemd runs)."""
    book = tmp_path / "acme.yml"
    prefix = tmp_path / "srv"
    role = os.path.join(ANSIBLE, "roles", "haproxy")
    # after the role's files: a later vars file wins (play vars would lose to vars_files)
    (tmp_path / "overrides.json").write_text(json.dumps({
        "haproxy_prefix": str(prefix), "haproxy_process_manager": "{{ item }}",
        "haproxy_acme_ca_bundle": "/etc/ssl/private ca/test.pem"}))
    book.write_text(json.dumps([{
        "name": "Render the haproxy role's ACME files", "hosts": "localhost", "gather_facts": False,
        "vars_files": [os.path.join(role, "defaults", "main.yml"), os.path.join(role, "vars", "main.yml"),
                       str(tmp_path / "overrides.json")],
        "tasks": [{"name": "Write the renewal command",
                   "ansible.builtin.template": {"src": os.path.join(role, "templates", "acme-renew.sh.j2"),
                                                "dest": str(tmp_path) + "/acme-renew-{{ item }}", "mode": "0700",
                                                "validate": "sh -n %s"},
                   "loop": ["supervisor", "systemd"]},
                  {"name": "Write the units",
                   "ansible.builtin.template": {"src": os.path.join(role, "templates", "acme-renew.{{ item }}.j2"),
                                                "dest": str(tmp_path) + "/{{ haproxy_acme_unit }}.{{ item }}",
                                                "mode": "0644"},
                   "vars": {"haproxy_acme_renew_command": str(tmp_path / "acme-renew-systemd")},
                   "loop": ["service", "timer"]}]}]))
    playbook(str(book), extra={}, timeout=120)
    script = (tmp_path / "acme-renew-supervisor").read_text()
    state = f"{prefix}/haproxy/acme"
    assert (f"runuser -u acme -- env HOME={state} \\\n    REQUESTS_CA_BUNDLE='/etc/ssl/private ca/test.pem' \\\n"
            f"    certbot renew --quiet --cert-name haproxy --config-dir {state}/config") in script
    assert "runuser -u acme -- cat \"$live/privkey.pem\" > \"$crt.key.new\"" in script
    assert f"crt={prefix}/haproxy/tls/acme.pem\n" in script and "chown haproxy:haproxy " in script
    assert f"haproxy -c -q -f {prefix}/haproxy/haproxy.cfg" in script
    assert f"supervisorctl -c {prefix}/etc/supervisord.conf signal USR2 haproxy" in script
    assert "systemctl reload plonedeploy-haproxy.service" in (tmp_path / "acme-renew-systemd").read_text()
    units = sorted(str(p) for p in tmp_path.glob("plonedeploy-acme-renew-*"))
    assert [os.path.splitext(u)[1] for u in units] == [".service", ".timer"], units
    timer = (tmp_path / os.path.basename(units[1])).read_text()
    assert "OnCalendar=*-*-* 3,15:41:00\n" in timer and "WantedBy=timers.target" in timer
    result = run(["systemd-analyze", "verify", *units], timeout=60, check=False)
    assert result.returncode == 0 and "ignoring" not in result.stderr, result.stdout + result.stderr
    calendar = run(["systemd-analyze", "calendar", "*-*-* 3,15:41:00"], timeout=60, check=False)
    assert calendar.returncode == 0 and "Next elapse" in calendar.stdout, calendar.stdout + calendar.stderr


def test_loadgenerator_locust_is_the_projects():
    """The workers run the Locust of requirements.txt: master and workers must match."""
    defaults = open(os.path.join(ANSIBLE, "roles", "loadgenerator", "defaults", "main.yml")).read()
    pinned = re.search(r'^loadgenerator_locust_version: "([^"]+)"$', defaults, re.MULTILINE).group(1)
    requirements = open(os.path.join(ROOT, "requirements.txt")).read()
    assert f"\nlocust=={pinned}\n" in requirements


#: Every refusal case: ``(label, group the host joins besides the four of inventories/local,
#: bad variables, message)``. The label is the test's id.
REFUSALS = ([(f"{next(iter(b))}-{i}", None, b, m) for i, (b, m) in enumerate(BAD)]
            + [(f"database-{i}", "databases", b, m) for i, (b, m) in enumerate(DATABASE_BAD)]
            + [(f"loadgenerator-{i}", "loadgenerators", b, m) for i, (b, m) in enumerate(LOADGENERATOR_BAD)])

#: The variables that name the group whose hosts a role's checks read (haproxy's backends,
#: varnish's purge ACL, the zeoclient's database and cache, monitoring's targets): each
#: refusal host gets groups of its own, so that no case sees another case's variables.
GROUP_VARIABLES = {"haproxy_backend_group": "clients", "varnish_zeoclient_group": "clients",
                   "monitoring_zeoclient_group": "clients", "postgresql_client_group": "clients",
                   "zeoclient_database_group": "databases", "zeoclient_cache_group": "balancers",
                   "monitoring_haproxy_group": "balancers", "canary_group": "clients"}


def _failure_blocks(output):
    """``{host: text}``: the ``fatal: [host]`` / ``failed: [host]`` result blocks of a
    playbook's output (the line and the indented lines after it), joined per host."""
    blocks, current = {}, None
    for line in output.splitlines():
        started = re.match(r"^(?:fatal|failed): \[([^\]]+)\]", line)
        if started:
            current = started.group(1)
            blocks.setdefault(current, [])
        elif line and not line[0].isspace():
            current = None
        if current:
            blocks[current].append(line)
    return {host: "\n".join(lines) for host, lines in blocks.items()}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """site.yml run once for every case of REFUSALS, each case a host of its own (local
    connection) with its bad variables as host variables and its own prefix: one
    ansible-playbook instead of one per case (47 runs took ~120 s, 2-5 s each).

    Each host is in the four groups of inventories/local (and the case's extra group), with
    its group_vars, and reads only groups of its own (GROUP_VARIABLES). Returns
    ``(output, {label: (host's failure text, its PLAY RECAP counters, its prefix)})``.
    """
    directory = tmp_path_factory.mktemp("refusals")
    (directory / "group_vars").mkdir()
    (directory / "group_vars" / "all.yml").symlink_to(os.path.join(ANSIBLE, "inventories", "local", "group_vars",
                                                                    "all.yml"))
    groups = {name: {} for name in ("zeoservers", "zeoclients", "loadbalancers", "monitoring", "databases",
                                    "loadgenerators")}
    hosts, prefixes = {}, {}
    for number, (label, group, bad, _message) in enumerate(REFUSALS):
        host = f"refusal{number:02d}"
        prefix = directory / host / "srv"
        own = {kind: f"{host}_{kind}" for kind in ("clients", "balancers", "databases")}
        # firewall_address: the firewall role checks first that every other host of the
        # inventory has an IP address (its rules name hosts by address)
        hosts[host] = {"plonedeploy_prefix": str(prefix), "postgresql_prefix": str(prefix),
                       "firewall_address": f"127.0.1.{number + 1}",
                       **{variable: own[kind] for variable, kind in GROUP_VARIABLES.items()}, **bad}
        for name in ("zeoservers", "zeoclients", "loadbalancers", "monitoring") + ((group,) if group else ()):
            groups[name][host] = None
        groups[own["clients"]] = {host: None}
        groups[own["balancers"]] = {host: None}
        if group == "databases":
            groups[own["databases"]] = {host: None}
        prefixes[label] = (host, prefix)
    inventory = {"all": {"vars": {"ansible_connection": "local",
                                  "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                         "hosts": hosts,
                         "children": {name: {"hosts": members} for name, members in groups.items() if members}}}
    (directory / "hosts.yml").write_text(json.dumps(inventory))
    result = playbook("-i", str(directory / "hosts.yml"), "site.yml", extra={}, timeout=600, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    blocks = _failure_blocks(output)
    recaps = {host: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
              for host, line in re.findall(r"^(refusal\d+)\s+:\s+(.*)$", output, re.MULTILINE)}
    return output, {label: (blocks.get(host, ""), recaps.get(host, {}), prefix)
                    for label, (host, prefix) in prefixes.items()}


@pytest.mark.parametrize("label, message", [(label, message) for label, _g, _b, message in REFUSALS],
                         ids=[label for label, *_ in REFUSALS])
def test_bad_variables_fail_before_any_change(refusals, label, message):
    """Each case fails site.yml's first play with its message (folding ignored), changes
    nothing, creates no prefix; a password in a refused DSN is never repeated."""
    output, cases = refusals
    failure, counts, prefix = cases[label]
    # the YAML callback may fold the message over lines and doubles quotes in 'strings'
    assert re.sub(r"\s+", " ", message) in re.sub(r"\s+", " ", failure).replace("''", "'"), (
        failure[-3000:] or output[-3000:])
    assert counts.get("failed") == 1 and counts.get("changed") == 0, counts
    assert not prefix.exists()
    assert "Sekr1t" not in output


def test_processes_run_under_supervisor(deployed):
    names = ("zeoserver", "client1", "client2", "client3", "uploads", "varnish", "varnish-exporter", "haproxy",
             "prometheus", "node-exporter", "alertmanager", "blackbox-exporter")
    for _ in range(30):  # supervisor says STARTING for its first startsecs (5 s)
        status = run(deployed["supervisorctl"] + ["status"], timeout=60).stdout
        if all(re.search(rf"^{n}\s+RUNNING", status, re.MULTILINE) for n in names):
            break
        time.sleep(1)
    for name in names:
        assert re.search(rf"^{name}\s+RUNNING", status, re.MULTILINE), status


def test_prometheus_scrapes_every_target_up(deployed):
    """Prometheus (monitoring role) finds HAProxy's exporter, varnish's, the three clients'
    exporters, node-exporter and itself, all up, and has loaded the alert rules."""
    expected = PROMETHEUS_TARGETS
    for _ in range(60):  # the first scrape of each target comes within one interval (15 s)
        with urllib.request.urlopen(PROMETHEUS + "/api/v1/targets", timeout=10) as response:
            targets = json.load(response)["data"]["activeTargets"]
        health = {(t["labels"]["job"], t["labels"]["instance"]): t["health"] for t in targets}
        if set(health) == expected and set(health.values()) == {"up"}:
            break
        time.sleep(1)
    assert set(health) == expected and set(health.values()) == {"up"}, health
    with urllib.request.urlopen(PROMETHEUS + "/api/v1/rules", timeout=10) as response:
        rules = [r["name"] for g in json.load(response)["data"]["groups"] for r in g["rules"]]
    # varnish's counters through its exporter (the varnish role's, scraped above)
    query = urllib.parse.quote("varnish_main_cache_hit")
    with urllib.request.urlopen(f"{PROMETHEUS}/api/v1/query?query={query}", timeout=10) as response:
        series = json.load(response)["data"]["result"]
    assert [s["metric"]["job"] for s in series] == ["varnish"], series
    assert sorted(rules) == ["CertificateExpiresSoon", "DiskAlmostFull", "HAProxyQueueing", "HAProxyServerDown",
                             "HTTP5xxRate", "ScrapeTargetDown", "SiteDown", "ZODBConflictRate",
                             "ZopeClientMemoryNotRecycled"]
    # Prometheus sends its alerts to the role's Alertmanager (no receiver in this inventory:
    # the role warned; Alertmanager still holds the alerts)
    with urllib.request.urlopen(PROMETHEUS + "/api/v1/alertmanagers", timeout=10) as response:
        managers = [a["url"] for a in json.load(response)["data"]["activeAlertmanagers"]]
    assert managers == ["http://127.0.0.1:18192/api/v2/alerts"], managers


def test_four_paths_through_haproxy(deployed):
    rows = haproxy_stats.fetch("http://127.0.0.1:18404/stats;csv")
    states = {r["svname"]: r["status"] for r in rows if r["pxname"] == "zeoclients"}
    assert states == {"client1": "UP", "client2": "UP", "client3": "UP", "BACKEND": "UP"}, states
    uploads = {r["svname"]: r["status"] for r in rows if r["pxname"] == "uploads"}
    assert uploads == {"uploads": "UP", "BACKEND": "UP"}, uploads
    assert requests.get(FRONTEND + "/", timeout=30).status_code == 200
    page = requests.get(FRONTEND + "/Plone", timeout=30)
    assert page.status_code == 200 and "<html" in page.text[:2000].lower()
    data = requests.get(FRONTEND + "/Plone", headers={"Accept": "application/json"}, timeout=30)
    assert data.json()["@id"] == FRONTEND + "/Plone"
    blobs = [requests.get(FRONTEND + "/Plone/blob-5mb/@@download/file", timeout=60) for _ in range(4)]
    assert {len(b.content) for b in blobs} == {BLOB_SIZE}
    assert len({hashlib.sha256(b.content).hexdigest() for b in blobs}) == 1
    assert {b.headers["X-Served-By"] for b in blobs} <= {"client1", "client2", "client3"}


def test_clients_run_the_configured_servers(deployed):
    prefix = deployed["prefix"]
    ini = open(os.path.join(prefix, "zeoclient", "current", "parts", "client1", "etc", "wsgi.ini")).read()
    assert "use = egg:pyruvate#main" in ini and "socket = 127.0.0.1:18081" in ini
    ini = open(os.path.join(prefix, "zeoclient", "current", "parts", "client2", "etc", "wsgi.ini")).read()
    assert "use = egg:waitress#main" in ini and "listen = 127.0.0.1:18082" in ini


def test_cron_jobs_run_as_cron_runs_them(deployed):
    """The schedule the roles install (zeopack weekly, bin/backup daily, bin/snapshotbackup
    weekly, logrotate daily for the ZEO server and the clients), read back from its
    /etc/cron.d files and each job run the way cron runs it (``/bin/sh -c`` with cron's
    minimal environment) -- the jobs, not only the scripts, work: the backup lands in
    zeoserver_backup_directory, the snapshot beside it, logrotate accepts its config."""
    prefix = deployed["prefix"]
    build = os.path.join(prefix, "zeoserver", "current")
    for script in ("backup", "snapshotbackup", "restore"):
        assert os.access(os.path.join(build, "bin", script), os.X_OK), script
    jobs = {}
    for part, name in CRON_FILES.items():
        with open(os.path.join("/etc/cron.d", name), encoding="utf-8") as fp:
            lines = [line.split(None, 6) for line in fp if line.strip() and not line.startswith("#")]
        for minute, hour, _day, _month, weekday, user, command in lines:
            assert user == "root" and minute.isdigit() and hour.isdigit(), (part, command)
            jobs[command.split()[0].rsplit("/", 1)[-1] + ("-" + part if "logrotate" in command else "")] = (
                weekday, command.strip())
    assert sorted(jobs) == ["backup", "logrotate-zeoclient", "logrotate-zeoserver", "snapshotbackup", "zeopack"]
    assert jobs["zeopack"][0] == "0" and jobs["snapshotbackup"][0] == "6" and jobs["backup"][0] == "*"
    cron_env = {"SHELL": "/bin/sh", "PATH": "/usr/bin:/bin", "HOME": "/root", "LOGNAME": "root"}
    for label in ("backup", "snapshotbackup", "zeopack", "logrotate-zeoserver", "logrotate-zeoclient"):
        result = subprocess.run(["/bin/sh", "-c", jobs[label][1]], env=cron_env, cwd="/root" if os.path.isdir("/root")
                                else "/", capture_output=True, text=True, timeout=300, check=False)
        # -q and logrotate print nothing unless something fails (cron would mail it)
        assert result.returncode == 0 and "error" not in result.stderr.lower(), (label, result.stderr[-2000:])
    backups = os.path.join(prefix, "backups")
    assert [n for n in os.listdir(os.path.join(backups, "backups")) if n.endswith(".fsz")]
    assert os.path.islink(os.path.join(backups, "blobstoragebackups", "latest"))
    assert [n for n in os.listdir(os.path.join(backups, "snapshotbackups")) if n.endswith(".fsz")]
    for part in ("zeoserver", "zeoclient"):
        assert os.path.exists(os.path.join(prefix, part, "var", "logrotate.state")), part


def changed_tasks(output):
    """The ``TASK [...]`` lines of the tasks that reported ``changed:`` in a playbook's output."""
    tasks, current = [], None
    for line in output.splitlines():
        if line.startswith("TASK ["):
            current = line.rstrip(" *")
        elif line.startswith("changed:") and current and current not in tasks:
            tasks.append(current)
    return tasks


def _site_under_load(deployed, extra, what, timeout=1200):
    """site.yml with the extra variables ``extra`` (a dict) under request loops through
    HAProxy (conftest.while_loaded), recorded as ``site.yml, <what> under load``; ``extra``
    then becomes ``deployed["extra"]``, with which the later runs (idempotence, check mode)
    run. Returns ``(result, seconds, done, failures, log)`` of while_loaded."""
    # 2 paced loops: unpaced loops took the CPU from the build and the restarts (4 loops:
    # 247 s; 2 unpaced loops: 333 s and 126,275 requests on a quiet machine).
    log = []
    result, seconds, done, failures = while_loaded(
        FRONTEND + "/Plone/@@ok", lambda: playbook("site.yml", extra=extra, timeout=timeout), threads=2,
        log=log, rate=RESTART_LOAD_RATE)
    deployed["extra"] = extra
    record(f"site.yml, {what} under load", result, seconds)
    return result, seconds, done, failures, log


# Longer than pytest.ini's 1,200 s: a rebuild and a rolling restart under load (247-333 s on a
# quiet machine before the load was paced); its playbook alone is allowed 1,200 s.
@pytest.mark.timeout(1500)
def test_changed_build_rolls_the_clients_under_load(deployed):
    """site.yml with a changed client build (zodb-cache-size) restarts the clients one at a
    time, drained in HAProxy (the zeoclient role's handlers run tasks/restart-client.yml, as
    restart.yml does): GETs through HAProxy meanwhile fail none, every client gets a new PID.

    The changed variable stays in ``deployed["extra"]``: the idempotence and check-mode runs
    after this test use it (a run with the old value would rebuild again).
    """
    before = _client_pids(deployed["supervisorctl"])
    result, seconds, done, failures, log = _site_under_load(
        deployed, dict(deployed["extra"], zeoclient_zodb_cache_size=25000), "changed build")
    after = _client_pids(deployed["supervisorctl"])
    print(f"\nchanged build: {seconds:.0f} s, {done} requests, {len(failures)} failed")
    for name in before:  # the included tasks print their names only when they run
        assert f"Drain in HAProxy and wait for the sessions to end of {name}" in result.stdout, name
    # bin/upgrade-site ran once, before the first client was drained, and found nothing
    # pending (ok, not changed: the build changed no profile).
    # (?:...)?: the timing line ansible.posix.profile_tasks prints under each task, when enabled
    upgrade = re.search(r"TASK \[zeoclient : Run the site's pending upgrade steps[^\n]*\n"
                        r"(?:[^\n]*\*\*\*[^\n]*\n)?(\w+): ", result.stdout)
    assert upgrade and upgrade.group(1) == "ok", upgrade and upgrade.group(0)
    assert upgrade.start() < result.stdout.index("Drain in HAProxy and wait for the sessions to end of")
    assert recap(result.stdout)["failed"] == 0
    assert all(after[name] != before[name] for name in before), (before, after)
    for name in before:
        conf = os.path.join(deployed["prefix"], "zeoclient", "current", "parts", name, "etc", "zope.conf")
        assert re.search(r"cache-size\s+25000\b", open(conf, encoding="utf-8").read()), conf
    # a new release of the clients beside the first, served by all; the ZEO server's build
    # did not change, so neither did its release
    releases = deployed["first_releases"]
    assert current_release(deployed["prefix"]) != releases["zeoclient"]
    assert sorted(os.listdir(os.path.join(deployed["prefix"], "zeoclient", "releases"))) == sorted(
        [releases["zeoclient"], current_release(deployed["prefix"])])
    assert current_release(deployed["prefix"], "zeoserver") == releases["zeoserver"]
    assert _served_releases() == dict.fromkeys(CLIENT_METRICS, current_release(deployed["prefix"]))
    assert_loaded_throughout(log, seconds)
    assert failures == [], failures[:10]


def _environ(pid):
    """``{name: value}``: the environment a process was started with (/proc/<pid>/environ)."""
    with open(f"/proc/{pid}/environ", "rb") as fp:
        return dict(item.decode().split("=", 1) for item in fp.read().split(b"\0") if item)


# pytest.ini's 1,200 s: site.yml without a build and a rolling restart under load.
@pytest.mark.timeout(1200)
def test_changed_program_rolls_the_clients_under_load(deployed):
    """site.yml in which only a ZEO client's program definition changed (an environment
    variable of client1 through process_manager_environments; no build): supervisord would
    run client1 with the definition it loaded until the program is added anew, so the
    zeoclient role's rolling restart (drained in HAProxy) restarts it onto the new one
    (supervisorctl update client1): the new process has the variable, client2 has none, GETs
    through HAProxy meanwhile fail none.

    The variable stays in ``deployed["extra"]``: the second run after this test
    (test_second_run_changes_nothing) must change nothing, its check-mode run neither.
    """
    prefix = deployed["prefix"]
    running = current_release(prefix)
    before = _client_pids(deployed["supervisorctl"], r"client\d|uploads")
    token = f"plonedeploy-test-{os.getpid()}-{time.time_ns()}"
    result, seconds, done, failures, log = _site_under_load(
        deployed, dict(deployed["extra"], process_manager_environments={"client1": {"PLONEDEPLOY_TEST_TOKEN": token}}),
        "a changed program definition", timeout=1100)
    print(f"\nchanged program: {seconds:.0f} s, {done} requests, {len(failures)} failed")
    after = _client_pids(deployed["supervisorctl"], r"client\d|uploads")
    assert recap(result.stdout)["failed"] == 0
    assert current_release(prefix) == running  # no build: the definition alone restarted it
    assert "Drain in HAProxy and wait for the sessions to end of client1" in result.stdout
    assert after["client1"] != before["client1"], (before, after)
    assert _environ(after["client1"]).get("PLONEDEPLOY_TEST_TOKEN") == token
    assert "PLONEDEPLOY_TEST_TOKEN" not in _environ(after["client2"])
    assert f'environment = PLONEDEPLOY_TEST_TOKEN="{token}"' in open(
        os.path.join(prefix, "etc", "supervisor.d", "client1.conf"), encoding="utf-8").read()
    rows = haproxy_stats.fetch("http://127.0.0.1:18404/stats;csv")
    states = {r["svname"]: r["status"] for r in rows if r["pxname"] == "zeoclients"}
    assert "client1" in states and set(states.values()) == {"UP"}, states
    assert_loaded_throughout(log, seconds)
    assert failures == [], failures[:10]


@pytest.fixture(scope="module")
def unchanged_runs(deployed):
    """``{"second": CompletedProcess, "check": CompletedProcess}``: site.yml run a second time
    and in ``--check --diff`` mode, both with the variables of the last run, side by side.

    Both must change nothing, so neither can disturb the other; together they take the
    time of the longer one instead of the sum (58 s + 46 s apart on a quiet machine): most
    of a no-op run is Ansible's own overhead per task, on both cores. If one does change
    something, both tests fail and say which tasks did.
    """
    from concurrent.futures import ThreadPoolExecutor

    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        second = pool.submit(playbook, "site.yml", extra=deployed["extra"], timeout=900)
        check = pool.submit(playbook, "site.yml", "--check", "--diff", extra=deployed["extra"], timeout=900)
        runs = {"second": second.result(), "check": check.result()}
    record("site.yml, second run and check mode side by side", runs["second"], time.monotonic() - started)
    return runs


def test_second_run_changes_nothing(unchanged_runs):
    second = unchanged_runs["second"]
    counts = recap(second.stdout)
    assert counts["changed"] == 0 and counts["failed"] == 0, (counts, changed_tasks(second.stdout))


def test_check_diff_reports_no_change(unchanged_runs):
    result = unchanged_runs["check"]
    counts = recap(result.stdout)
    assert counts["changed"] == 0 and counts["failed"] == 0, (counts, changed_tasks(result.stdout))


def test_ab_report_against_deployed_stack(deployed, tmp_path):
    config = os.path.join(deployed["prefix"], "haproxy", "abtest.json")
    run([os.path.join(ROOT, ".venv", "bin", "python"), "-m", "loadtests", "ab", "--stack-config", config,
         "--duration", "10", "--users", "4", "--spawn-rate", "4", "--out", str(tmp_path)], timeout=120)
    (folder,) = list(tmp_path.iterdir())
    report = json.loads((folder / "report.json").read_text())
    assert {n: s["wsgi_server"] for n, s in report["servers"].items()} == {
        "client1": "pyruvate", "client2": "waitress", "client3": "pyruvate"}
    assert all(s["requests"] > 0 and s["failures"] == 0 for s in report["servers"].values())


def test_edge_rules_deployed(deployed):
    """The Ansible HAProxy applies the same edge as the buildout one: Host allowlist, the
    upload lane for large bodies, per-source limits (from 127.0.0.2; 127.0.0.1 is exempt)."""
    from loadtests.edge import attacks

    assert attacks.send("127.0.0.1", 18080, attacks.request_head("GET", "/Plone", host="evil.example")).status == 421
    assert attacks.send("127.0.0.1", 18080, attacks.request_head("GET", "/Plone", host=None)).status == 400
    big = requests.post(FRONTEND + "/Plone/@@ok", data=b"x" * 100_000, timeout=30)
    small = requests.post(FRONTEND + "/Plone/@@ok", data=b"x" * 100, timeout=30)
    assert big.headers["X-Served-By"] == "uploads" and small.headers["X-Served-By"] in ("client1", "client2", "client3")
    # the 1,008 between the first and the last are misdirected (421 from HAProxy itself),
    # counted by the same per-source rate: the check does not hang on Zope's speed
    answers = attacks.rate_limit("127.0.0.1", 18080, 1010, source="127.0.0.2", misdirected=True)
    assert answers[0].status == 200 and {a.status for a in answers[1:-1]} == {421} and answers[-1].status == 429


def test_https_with_generated_certificate(deployed):
    """haproxy_tls_bind with no certificate given: a self-signed one made on the host
    (key 0600); HTTP/2 over TLS; Zope builds https links."""
    key = os.path.join(deployed["prefix"], "haproxy", "tls", "haproxy.pem.key")
    assert oct(os.stat(key).st_mode & 0o777) == "0o600"
    result = run(["curl", "-sk", "--http2", "-o", "/dev/null", "-w", "%{http_version} %{http_code}",
                  "https://127.0.0.1:18443/Plone"], timeout=60)
    assert result.stdout == "2 200", result.stdout
    data = run(["curl", "-sk", "-H", "Accept: application/json", "https://127.0.0.1:18443/Plone"], timeout=60)
    assert json.loads(data.stdout)["@id"] == "https://127.0.0.1:18443/Plone"


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # the self-signed certificate
def test_cache_hit_over_tls(deployed):
    """The varnish role's cache on the HTTPS listener: the second anonymous GET of /Plone is a
    hit (plone.app.caching, enabled by create_site.py with the role's PLONEDEPLOY_CACHING_PROXIES);
    the plain frontend is never cached; PURGE from outside the ACL is refused."""
    rows = haproxy_stats.fetch("http://127.0.0.1:18404/stats;csv")
    assert {r["svname"]: r["status"] for r in rows if r["pxname"] == "cache"} == {"varnish": "UP", "BACKEND": "UP"}
    answers = [requests.get(TLS_FRONTEND + "/Plone", verify=False, timeout=60) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[1].headers["X-Cache"] == "HIT", answers[1].headers
    assert "s-maxage=" in answers[1].headers["Cache-Control"]
    assert f'href="{TLS_FRONTEND}/Plone' in answers[1].text
    assert "X-Cache" not in requests.get(FRONTEND + "/Plone", timeout=60).headers
    # 127.0.0.5 is this host but not a ZEO client's address (the ACL is 127.0.0.1).
    foreign = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PURGE",
                              "--interface", "127.0.0.5", VARNISH + "/Plone"],
                             capture_output=True, text=True, timeout=30, check=False)
    assert foreign.stdout == "405", foreign
    assert requests.request("PURGE", TLS_FRONTEND + "/Plone", verify=False, timeout=30).status_code == 405
    assert requests.get(TLS_FRONTEND + "/Plone", verify=False, timeout=60).headers["X-Cache"] == "HIT"


def _client_pids(supervisorctl, pattern=r"client\d"):
    status = run(supervisorctl + ["status"], timeout=60).stdout
    return {m.group(1): int(m.group(2))
            for m in re.finditer(rf"^({pattern})\s+RUNNING\s+pid (\d+)", status, re.MULTILINE)}


#: The metrics ports of the converge's clients (ansible_deploy.CLIENTS).
CLIENT_METRICS = {"client1": 18091, "client2": 18092, "client3": 18094, "uploads": 18093}


def _served_releases():
    """``{client: release id}``: the ``release`` label of ``plonedeploy_release_info`` on each
    client's metrics port (None for a client that has no such series)."""
    served = {}
    for name, port in CLIENT_METRICS.items():
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        found = re.findall(r'^plonedeploy_release_info\{release="([^"]*)"\} 1\.0$', text, re.MULTILINE)
        served[name] = found[0] if len(found) == 1 else None
    return served


def test_rolling_restart_under_load(deployed):
    before = _client_pids(deployed["supervisorctl"])
    log = []
    result, seconds, done, failures = while_loaded(
        FRONTEND + "/Plone/@@ok", lambda: playbook("restart.yml", extra=deployed["extra"], timeout=900),
        log=log, rate=RESTART_LOAD_RATE)
    after = _client_pids(deployed["supervisorctl"])
    print(f"\nrolling restart: {seconds:.0f} s, {done} requests, {len(failures)} failed")
    assert recap(result.stdout)["failed"] == 0
    assert set(after) == {"client1", "client2", "client3"}
    assert all(after[name] != before[name] for name in before), (before, after)
    assert_loaded_throughout(log, seconds)
    assert failures == [], failures[:10]


def _failing_site_run_under_load(extra, title):
    """site.yml with ``extra`` under 2 paced GET loops of HAProxy's /Plone/@@ok, a run that
    must fail on its one host (asserted): its recap recorded as ``title``. Returns ``(its
    output, white space collapsed to one space; seconds; the loops' log; their failures)``."""
    log = []
    result, seconds, done, failures = while_loaded(
        FRONTEND + "/Plone/@@ok", lambda: playbook("site.yml", extra=extra, timeout=1200, check=False), threads=2,
        log=log, rate=RESTART_LOAD_RATE)
    record(f"site.yml, {title}, under load", result, seconds)
    print(f"\n{title}: {seconds:.0f} s, {done} requests, {len(failures)} failed")
    output = re.sub(r"\s+", " ", result.stdout + result.stderr)
    assert result.returncode != 0 and recap(result.stdout)["failed"] == 1, output[-3000:]
    return output, seconds, log, failures


# Longer than pytest.ini's 1,200 s on a loaded machine: site.yml up to the clients' build.
@pytest.mark.timeout(1500)
def test_failed_build_changes_nothing_that_runs(deployed):
    """site.yml with a clients' build that bin/buildout refuses (the recipe's error for a
    wsgi-server it does not know), under request loops through HAProxy: the play fails with
    the recipe's message, the half-built release is removed, ``current``, the kept
    releases, the clients' PIDs and the release in their metrics stay as they were, 0 failed
    requests."""
    prefix = deployed["prefix"]
    running = current_release(prefix)
    kept = sorted(os.listdir(os.path.join(prefix, "zeoclient", "releases")))
    before = _client_pids(deployed["supervisorctl"], r"client\d|uploads")
    assert _served_releases() == dict.fromkeys(CLIENT_METRICS, running)
    extra = dict(deployed["extra"], zeoclient_buildout_overrides="[client1]\nwsgi-server = tornado\n")
    output, seconds, log, failures = _failing_site_run_under_load(extra, "a build that fails")
    assert f"in {prefix}/zeoclient failed and was removed" in output, output[-3000:]
    assert "wsgi-server = 'tornado' is invalid" in output.replace("''", "'"), output[-3000:]
    assert current_release(prefix) == running
    assert sorted(os.listdir(os.path.join(prefix, "zeoclient", "releases"))) == kept
    assert _client_pids(deployed["supervisorctl"], r"client\d|uploads") == before
    assert _served_releases() == dict.fromkeys(CLIENT_METRICS, running)
    assert_loaded_throughout(log, seconds)
    assert failures == [], failures[:10]


def test_rollback_returns_to_the_previous_release_under_load(deployed):
    """rollback.yml after the changed build: ``current`` back to the first converge's
    release, without a build, each client restarted once (drained in HAProxy), every
    client's metrics naming that release and its zope.conf the first build's cache size;
    0 failed requests meanwhile."""
    prefix = deployed["prefix"]
    first = deployed["first_releases"]["zeoclient"]
    if current_release(prefix) == first:
        pytest.skip("needs the second release of test_changed_build_rolls_the_clients_under_load (run the module)")
    kept = sorted(os.listdir(os.path.join(prefix, "zeoclient", "releases")))
    before = _client_pids(deployed["supervisorctl"], r"client\d|uploads")
    log = []
    result, seconds, done, failures = while_loaded(
        FRONTEND + "/Plone/@@ok", lambda: playbook("rollback.yml", extra=deployed["extra"], timeout=900),
        log=log, rate=RESTART_LOAD_RATE)
    record("rollback.yml under load", result, seconds)
    print(f"\nrollback: {seconds:.0f} s, {done} requests, {len(failures)} failed")
    after = _client_pids(deployed["supervisorctl"], r"client\d|uploads")
    assert recap(result.stdout)["failed"] == 0
    assert current_release(prefix) == first
    # no build, no release removed: the newer one stays for a roll forward
    assert sorted(os.listdir(os.path.join(prefix, "zeoclient", "releases"))) == kept
    assert set(after) == set(before) == set(CLIENT_METRICS)
    assert all(after[name] != before[name] for name in before), (before, after)
    for name in before:  # one drain per client: one rolling restart
        assert result.stdout.count(f"Drain in HAProxy and wait for the sessions to end of {name}") == 1, name
    assert _served_releases() == dict.fromkeys(CLIENT_METRICS, first)
    conf = os.path.join(prefix, "zeoclient", "current", "parts", "client1", "etc", "zope.conf")
    assert re.search(r"cache-size\s+30000\b", open(conf, encoding="utf-8").read()), conf
    assert_loaded_throughout(log, seconds)
    assert failures == [], failures[:10]


#: The canary test's phases: 2 s windows, 10 of them at least per phase (the judge's
#: MIN_WINDOWS), in 30 s phases; at RESTART_LOAD_RATE a loop, 2 loops, leastconn over three
#: page clients, the canary answers ~100-200 requests a phase (the slow one fewer).
CANARY_TEST = {"plonedeploy_canary": True, "canary_duration": 30, "canary_window": 2, "canary_min_requests": 50,
               "canary_settle": 5}


# Longer than pytest.ini's 1,200 s on a loaded machine: site.yml with a build.
@pytest.mark.timeout(1500)
def test_canary_with_slower_pages_is_rolled_back_under_load(deployed):
    """site.yml -e plonedeploy_canary=true with a release that differs only by 50 ms added
    to page requests (the recipe's added-delay, a testing aid): client1 (pyruvate; client3 is
    its comparison) serves the running release, then the new one; the judge on the balancer
    rolls it back naming the page class; the play fails saying so, the canary is back on the
    running release (its link, its metrics), ``current`` and the other clients unchanged, the
    report kept; GETs through HAProxy meanwhile fail none."""
    prefix = deployed["prefix"]
    running = current_release(prefix)
    before = _client_pids(deployed["supervisorctl"], r"client\d|uploads")
    delay = "".join(f"[{c}]\nadded-delay = 50\n" for c in ("client1", "client2", "client3"))
    extra = dict(deployed["extra"], zeoclient_buildout_overrides=delay, **CANARY_TEST)
    output, seconds, log, failures = _failing_site_run_under_load(extra, "a canary of 50 ms slower pages")
    assert "not promoted: rollback: page Tr p50 of the canary is " in output, output[-3000:]
    assert f"The canary is back on release {running}" in output, output[-3000:]
    report = re.search(r"Report on localhost: (\S+)/report\.md", output)
    assert report and os.path.isfile(os.path.join(report.group(1), "report.json")), output[-3000:]
    judged = json.load(open(os.path.join(report.group(1), "report.json"), encoding="utf-8"))
    assert judged["verdict"] == "rollback" and judged["classes"]["page"]["verdict"] == "worse", judged["reasons"]
    # the canary went to the new release and came back: restarted (twice), the others not
    after = _client_pids(deployed["supervisorctl"], r"client\d|uploads")
    assert after["client1"] != before["client1"]
    assert {n: p for n, p in after.items() if n != "client1"} == {n: p for n, p in before.items() if n != "client1"}
    assert os.readlink(os.path.join(prefix, "zeoclient", "clients", "client1")) == "../current"
    assert current_release(prefix) == running
    assert _served_releases() == dict.fromkeys(CLIENT_METRICS, running)
    rows = haproxy_stats.fetch("http://127.0.0.1:18404/stats;csv")
    assert {r["svname"]: (r["status"], r["weight"]) for r in rows if r["pxname"] == "zeoclients"
            and r["svname"] != "BACKEND"} == dict.fromkeys(("client1", "client2", "client3"), ("UP", "1"))
    assert_loaded_throughout(log, seconds)
    assert failures == [], failures[:10]
