"""Jinja2 filters that give the Ansible roles the recipe's own edge rules.

The rules live once, in ``plonedeploy.recipe.edge`` (plain Python, no zc.buildout; the
recipe's distribution is installed in ansible/.venv): the haproxy role validates and renders with
them exactly as ``plonedeploy.recipe:haproxy`` does.

- ``name | plonedeploy_body_cap``: default ``max-request-body-size`` (bytes) of a client on
  WSGI server ``name``.
- ``page_servers | plonedeploy_body_limit_errors(upload_servers, max_body_size, threshold)``:
  list of error messages (empty when the limits are consistent); servers are dicts with
  ``name``, ``wsgi_server``, ``max_body``.
- ``names | plonedeploy_server_name_errors``: list of messages for invalid host names.
- ``names | plonedeploy_host_regex``: the HAProxy regex of the allowed Host values.
- ``"plonedeploy.stack.rolling" | plonedeploy_module_file``: the file of that module of the
  installed packages (str), for ``ansible.builtin.script`` to ship a stdlib-only module to
  hosts without the kit's eggs (the balancers). Raises an error for a module outside
  ``plonedeploy.`` or one that is not installed.
- ``"intermediate" | plonedeploy_tls_profile``: Mozilla's ciphers, ciphersuites and
  bind options (``tls.profile``); ``name | plonedeploy_san``: its subjectAltName entry.

And the ZEO clients' rules of ``plonedeploy.stack.rules`` (the recipe's ``instance`` and
``haproxy`` apply the same functions):

- ``clients | plonedeploy_threads_errors``: messages for clients whose ``threads`` their
  ``wsgi_server`` cannot run (``clients``: dicts with ``name``, optional ``wsgi_server``
  and ``threads``); empty when all can.
- ``client | plonedeploy_client_threads(cores, clients)``: the threads (int) a client dict
  (optional ``wsgi_server`` and ``threads``: an int or ``auto``) runs with: its own number,
  the server's default when unset, or for ``auto`` the recipe's rule (``rules.auto_threads``)
  for a host of ``cores`` CPUs running ``clients`` ZEO clients. With ``cores`` 0 (the
  host's facts not gathered yet) ``auto`` gives the most the rule can choose, an upper
  bound for the fd-limit check.
- ``maxconn | plonedeploy_fd_limit_needed(servers)``: HAProxy's smallest fd limit for a
  frontend maxconn and servers (dicts with ``maxconn``).
- ``page_servers | plonedeploy_ab_contract(upload_servers, bind, stats_bind, tls_bind,
  balance, run_dir)``: the content of ``abtest.json`` (a dict; servers are dicts with
  ``name`` and ``wsgi_server``), ``rules.ab_contract``: the same document the stack recipe
  writes into ``stack.json`` for the A/B tool.

And the storage rules of ``plonedeploy.stack.storage`` (the recipe's ``instance`` and
``postgresql`` parts apply the same functions; the zeoclient and postgresql roles):

- ``dsn | plonedeploy_dsn_errors``: list of messages (empty when ``dsn``, a libpq
  key=value string, is one the recipe's ``relstorage-dsn`` accepts: ``dbname``, no
  ``password``, known keywords); the messages never repeat a password.
- ``{host, port, database, user, passfile} | plonedeploy_site_dsn``: the site role's DSN
  (str, with the passfile, no password), as the recipe's ``[postgresql]`` part builds it.
- ``name | plonedeploy_identifier_ok``: True when ``name`` is a database/role name the kit
  accepts (lower-case identifier, at most 63 characters).
- ``password | plonedeploy_scram_verifier(current)``: PostgreSQL's SCRAM-SHA-256 verifier
  (str) of ``password``; ``current`` (the stored ``rolpassword``, or empty) is returned
  unchanged when it already verifies ``password``, so a second run changes nothing.
  Raises an error for a password that is not printable ASCII.
"""
import importlib.util

# Installed in ansible/.venv (Makefile's ansible-venv: the recipe's distribution, editable).
from plonedeploy.recipe import edge, tls
from plonedeploy.stack import rules, storage


def module_file(name):
    if not str(name).startswith("plonedeploy."):
        raise ValueError(f"plonedeploy_module_file: {name!r} is not a module of the kit (plonedeploy.*)")
    spec = importlib.util.find_spec(str(name))
    if spec is None or not spec.origin:
        raise ValueError(f"plonedeploy_module_file: {name!r} is not installed in the controller's venv "
                         "(make ansible-venv installs the kit's distribution)")
    return spec.origin


def body_limit_errors(page_servers, upload_servers, max_body_size, upload_threshold):
    return edge.body_limit_errors(int(max_body_size), int(upload_threshold),
                                  [dict(s, max_body=int(s["max_body"])) for s in page_servers],
                                  [dict(s, max_body=int(s["max_body"])) for s in upload_servers])


def server_name_errors(names):
    return [error for error in (edge.server_name_error(str(n)) for n in names) if error]


def client_threads(client, cores=0, clients=1):
    server = client.get("wsgi_server", rules.DEFAULT_SERVER)
    threads = client.get("threads", rules.default_threads(server))
    if str(threads) != "auto":
        return int(threads)
    if not int(cores):
        return rules.default_threads(server)  # auto never chooses more
    return rules.auto_threads(server, int(cores), int(clients))[0]


def threads_errors(clients):
    errors = []
    for client in clients:
        server = client.get("wsgi_server", rules.DEFAULT_SERVER)
        try:  # auto gives what the server can run; unset, its default
            threads = client_threads(client)
        except (TypeError, ValueError):
            continue  # neither a number nor auto: validate.yml's own check names it
        error = rules.threads_error(server, threads)
        if error:
            errors.append(f"client {client.get('name')}: threads {threads} on {server}; allowed: {error}")
    return errors


def _check(server, health_check):
    """``(rules.check_target's dict or {}, its refusal as a message or None)`` for ``server``
    (a dict with ``name`` and ``metrics_address``, "" when none)."""
    try:
        return rules.check_target(str(health_check), server["name"], server.get("metrics_address", "")), None
    except ValueError as exc:
        return {}, f"haproxy_health_check {health_check}: {exc}"


def check_errors(servers, health_check):
    """What rules.check_target refuses for ``servers``, as messages; [] when every check
    has its target."""
    return [error for error in (_check(server, health_check)[1] for server in servers) if error]


def with_check(servers, health_check):
    """``servers`` with rules.check_target's ``check_addr``/``check_port`` added to each
    (and ``metrics_address`` removed): the template's server list. A server it refuses gets
    none: :func:`check_errors` names it in validate.yml's last check."""
    return [dict({k: v for k, v in server.items() if k != "metrics_address"}, **_check(server, health_check)[0])
            for server in servers]


def dsn_errors(dsn):
    try:
        storage.parse_dsn(str(dsn))
    except ValueError as exc:
        return [f"{storage.redact_dsn(str(dsn))!r} is invalid: expected {exc}"]
    return []


class FilterModule:
    """plonedeploy's edge filters (see the module docstring)."""

    def filters(self):
        return {
            "plonedeploy_body_cap": edge.default_body_cap,
            "plonedeploy_body_limit_errors": body_limit_errors,
            "plonedeploy_server_name_errors": server_name_errors,
            "plonedeploy_host_regex": lambda names: edge.host_regex([str(n) for n in names]),
            "plonedeploy_tls_profile": tls.profile,
            "plonedeploy_san": lambda name: tls.san_entry(str(name)),
            "plonedeploy_threads_errors": threads_errors,
            "plonedeploy_client_threads": client_threads,
            "plonedeploy_check_errors": check_errors,
            "plonedeploy_with_check": with_check,
            "plonedeploy_fd_limit_needed": lambda maxconn, servers: rules.fd_limit_needed(int(maxconn), servers),
            "plonedeploy_ab_contract": rules.ab_contract,
            "plonedeploy_module_file": module_file,
            "plonedeploy_dsn_errors": dsn_errors,
            "plonedeploy_site_dsn": storage.site_dsn,
            "plonedeploy_identifier_ok": lambda name: bool(storage.IDENTIFIER_RE.match(str(name))),
            "plonedeploy_scram_verifier": lambda password, current="": storage.scram_verifier_for(
                str(password), str(current or "")),
        }
