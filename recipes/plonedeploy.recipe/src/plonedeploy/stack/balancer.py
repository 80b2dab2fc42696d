"""The stack's HAProxy as bin/stack reads it: server states and stats over its runtime API
and stats page, the rolling restart of one client (:mod:`plonedeploy.stack.rolling`), and
the waits until every server is UP."""

import csv
import io
import time
import urllib.error
import urllib.request

from plonedeploy.stack import rolling, rules
from plonedeploy.stack.errors import StackError
from plonedeploy.stack.supervisor import start_stage, stop_process


def all_clients(config):
    """Every ZEO client of the stack: the pool's ``servers``, then the upload lane's."""
    return config["servers"] + config.get("upload_servers", [])


def backend_of(config, name):
    """HAProxy backend of client ``name``: the pool's, or the upload lane's."""
    return config["upload_backend"] if name in config.get("upload_servers", []) else config["backend"]


def server_states(config, timeout=2.0):
    """Return ``{client name: status}`` from HAProxy's stats CSV, for every ZEO client.

    Status is HAProxy's ``status`` column (``UP``, ``DOWN``, ``MAINT``, ``UP 1/2`` ...).
    Raises OSError if the stats page does not answer.
    """
    return {name: row["status"] for name, row in _server_rows(config, timeout).items()
            if name in all_clients(config)}


def _stats_rows(config, timeout=2.0):
    """Every row of HAProxy's stats CSV as a dict; raises OSError."""
    with urllib.request.urlopen(config["stats_url"], timeout=timeout) as response:
        text = response.read().decode("utf-8")
    return list(csv.DictReader(io.StringIO(text.lstrip("# "))))


def _server_rows(config, timeout=2.0):
    """``{client name: stats CSV row}`` of each client in its own backend; raises OSError."""
    return {row["svname"]: row for row in _stats_rows(config, timeout)
            if row["svname"] in all_clients(config) and row["pxname"] == backend_of(config, row["svname"])}


def cache_state(config, timeout=2.0):
    """HAProxy's status of the cache tier's server (``UP``, ``DOWN``, ``MAINT`` ...), or None
    without a cache tier. Raises OSError if the stats page does not answer."""
    if not config.get("cache"):
        return None
    return next((row["status"] for row in _stats_rows(config, timeout)
                 if row["pxname"] == "cache" and row["svname"] == "varnish"), None)


def restart_client(config, proc, timeout=rolling.TIMEOUT):
    """Rolling restart of the ZEO client ``proc`` (a ``processes`` entry of ``config``):
    :func:`plonedeploy.stack.rolling.restart_client`, the steps the Ansible playbooks run
    too (drain in HAProxy, restart, health check, enable), with the stop and start through
    the stack's supervisord (:func:`stop_process`, :func:`start_stage`) as the restart step.

    ``timeout``: seconds for each step (drain, start, health, UP). Raises
    rolling.RollingError from the balancer steps, StackError from the restart.
    """
    name = proc["name"]
    health_url = health_url_of(config, name)

    def restart():
        stop_process(config, name)
        start_stage(config, [proc], timeout)

    rolling.restart_client(config["haproxy_socket"], backend_of(config, name), name, restart, health_url,
                           timeout=timeout, say=lambda line: print(line, flush=True))


def health_url_of(config, name):
    """The URL of client ``name``'s health check as HAProxy asks it: its probe on the
    metrics address for a probe path (rules.check_target), else the path on its own URL."""
    path = config["haproxy_context"]["health_check"]
    if path in rules.PROBE_PATHS:
        return config["clients"][name]["metrics_url"].rsplit("/", 1)[0] + path
    return config["clients"][name]["url"] + path


def wait_up(config, timeout):
    """Wait until HAProxy reports every server UP; raise StackError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    states = {}
    while time.monotonic() < deadline:
        try:
            states = server_states(config)
        except OSError:
            states = {}
        if states and all(states.get(s) == "UP" for s in all_clients(config)):
            print("haproxy: all servers UP: " + ", ".join(all_clients(config)), flush=True)
            return
        time.sleep(1)
    answers = {name: health_answer(config, name) for name in all_clients(config) if states.get(name) != "UP"}
    raise StackError(
        f"haproxy: servers not UP after {timeout} s: {states or 'stats not answering'}; "
        f"their health checks answer: {answers}"
    )


def health_answer(config, name, timeout=2.0):
    """``"<status> <first line of the body>"`` of client ``name``'s health check now, or
    the error (for messages: why HAProxy keeps a client out)."""
    url = health_url_of(config, name)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return f"{url}: {response.status} {response.read(200).decode(errors='replace').strip()}"
    except urllib.error.HTTPError as exc:
        return f"{url}: {exc.code} {exc.read(200).decode(errors='replace').strip()}"
    except OSError as exc:
        return f"{url}: {exc}"
