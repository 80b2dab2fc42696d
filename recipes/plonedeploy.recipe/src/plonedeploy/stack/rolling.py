#!/usr/bin/env python3
"""Rolling restart of one ZEO client behind HAProxy: the one implementation of its steps,
their order, their rules and their timeouts, for both deploy paths.

The steps, in this order (:data:`STEPS`, :func:`restart_client`):

1. ``drain`` (on each balancer): wait until every other server of B is UP (or in an
   operator's MAINT): never the last one in service while a peer is DOWN, e.g. recycled by
   its memory watchdog; then ``set server B/N state drain`` over HAProxy's runtime API
   (no new requests; in-flight ones finish), wait until the server has no session and no
   queued request, then ``set server B/N state maint``; the same in every other backend
   that has a server of that name (:func:`backends_of`: the write lane's ``writes``, whose
   servers are the page clients under their names), so that no write is sent to the
   client while it restarts and none is cut. MAINT, not DRAIN, while the process
   is down: in DRAIN HAProxy keeps checking the server, marks it DOWN once it stops, and
   the monitoring role's alert on DOWN servers would fire for a planned restart.
2. ``restart`` (on the client's host): the process manager's own step, not in this module
   (bin/stack: supervisord's XML-RPC and the stack's readiness probe; Ansible: the
   process_manager role's tasks, supervisorctl or systemd).
3. ``health`` (on the client's host): wait until the client answers HAProxy's health check
   path (``/Plone/@@ok``) with 200. This must come before ``enable``: HAProxy 2.6 counts a
   server that leaves MAINT as healthy at once (its ``status`` is ``UP`` before any check
   ran; a dead one turns ``UP 1/3`` only after its first failed check), so ``enable``'s
   wait for UP does not prove the client serves.
4. ``enable`` (on each balancer): ``set server B/N state ready``, wait until its status is
   ``UP``; in every backend ``drain`` took it out of.

Rules: a step that does not finish within its timeout (:data:`TIMEOUT` seconds unless
told) raises :class:`RollingError`; a drain that times out puts the server back into
service (``state ready``) unless an operator had taken it out before, so that a failed
restart leaves the pool as it was and the client is not restarted under its requests.
Every client HAProxy balances is drained first, also the only one of its backend (the
upload lane's): its in-flight requests finish, and new ones get HAProxy's 503 instead of
a reset connection.

Why here, and why stdlib only: ``bin/stack restart`` (plonedeploy.stack) imports
this module and runs :func:`restart_client` with its supervisord restart as step 2; the
Ansible playbooks (ansible/tasks/restart-client.yml, used by restart.yml and by the
zeoclient role's handler on a changed build) run this very file with
``ansible.builtin.script`` on each balancer (``drain``, ``enable``) and on the client's
host (``health``), hosts that have python3 but no eggs of this project. So it imports
nothing outside Python's standard library and nothing of its own package.

Command line (each prints one JSON object on stdout and exits 0; a failure exits 1 with
``rolling.py <command>: <message>`` on stderr; bad arguments exit 2)::

    python3 rolling.py drain  --socket PATH --backend B --server N [--timeout SECONDS]
    python3 rolling.py enable --socket PATH --backend B --server N [--timeout SECONDS]
    python3 rolling.py health --url URL [--timeout SECONDS]

``drain``/``enable`` print ``{"server": "B/N", "before": status, "after": status,
"changed": bool, "backends": [B, ...], "seconds": float}`` (``status``: HAProxy's ``show
stat`` column in backend B, e.g. ``UP``, ``MAINT``, ``DRAIN``, ``DOWN``; ``changed``:
whether it differs, which Ansible's ``changed_when`` reads; ``backends``: B and the other
backends that have server N, in which the step ran too); ``health`` prints ``{"url": URL, "seconds": float}``.
"""
import argparse
import csv
import io
import json
import socket
import sys
import time
import urllib.error
import urllib.request

#: The steps of a rolling restart of one client, in the order both paths run them.
STEPS = ("drain", "restart", "health", "enable")
#: Seconds each waiting step (drain, health, enable; bin/stack's start too) may take by default.
TIMEOUT = 120.0
#: Seconds between two looks at HAProxy's stats or the client's health path.
POLL_INTERVAL = 0.25
#: Seconds one runtime API command or one health request may take.
REQUEST_TIMEOUT = 5.0


class RollingError(Exception):
    """A step failed: HAProxy's runtime API refused or did not answer, the server is not in
    the backend, or a wait ran out of time. The message names the server and the reason."""


def runtime_api(socket_path, command, timeout=REQUEST_TIMEOUT):
    """Send one command to HAProxy's runtime API at the unix socket ``socket_path`` and
    return its answer (stripped text). Meant for commands that answer nothing when they
    succeed (``set server ...``) or CSV (``show stat``).

    ``timeout``: seconds for connecting and for each read. Raises RollingError when the
    socket does not answer, or when the answer is neither empty nor CSV (HAProxy's error
    message, e.g. ``No such server.``).
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(socket_path)
            sock.sendall(command.encode("ascii") + b"\n")
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError as exc:
        raise RollingError(f"haproxy runtime API {socket_path}: {exc}") from exc
    answer = b"".join(chunks).decode("utf-8", "replace").strip()
    if answer and not answer.startswith("#"):
        raise RollingError(f"haproxy runtime API: {command!r}: {answer}")
    return answer


def _stat_rows(socket_path):
    """Every row of ``show stat`` as a dict of strings; raises RollingError as :func:`runtime_api`."""
    text = runtime_api(socket_path, "show stat")
    return list(csv.DictReader(io.StringIO(text.lstrip("# "))))


def server_stats(socket_path, backend, server):
    """Return the ``show stat`` row of ``backend/server`` as a dict of strings (``status``,
    ``scur`` current sessions, ``qcur`` queued requests, ...). Raises RollingError as
    :func:`runtime_api`, and when the backend has no such server."""
    for row in _stat_rows(socket_path):
        if row["pxname"] == backend and row["svname"] == server:
            return row
    raise RollingError(f"haproxy {socket_path}: no server {server} in backend {backend}")


def backends_of(socket_path, backend, server):
    """``backend`` and then every other backend of HAProxy with a server named ``server``
    (a list of names): a server name stands for one client in every backend of the kit's
    config (the write lane ``writes`` lists the page clients under their own names).
    Raises RollingError as :func:`server_stats` when ``backend`` has no such server."""
    names = [row["pxname"] for row in _stat_rows(socket_path)
             if row["svname"] == server and row["svname"] not in ("FRONTEND", "BACKEND")]
    if backend not in names:
        raise RollingError(f"haproxy {socket_path}: no server {server} in backend {backend}")
    return [backend] + [name for name in dict.fromkeys(names) if name != backend]


def _wait(condition, timeout, failure):
    """Call ``condition()`` every POLL_INTERVAL seconds until it returns a true value, and
    return that value; raise RollingError(``failure()``) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RollingError(failure())
        time.sleep(POLL_INTERVAL)


def _peers_in_service(socket_path, backend, server, waiting):
    """True when every other server of ``backend`` is ``UP`` (or in MAINT, an operator's);
    else False, with ``waiting["text"]`` naming the others and their status."""
    others = {row["svname"]: row["status"] for row in _stat_rows(socket_path)
              if row["pxname"] == backend and row["svname"] not in (server, "FRONTEND", "BACKEND")}
    out = {name: status for name, status in others.items() if status != "UP" and not status.startswith("MAINT")}
    waiting["text"] = ", ".join(f"{name} {status}" for name, status in sorted(out.items()))
    return not out


def drain(socket_path, backend, server, timeout=TIMEOUT):
    """Step 1: take ``backend/server`` out of HAProxy's rotation without cutting a request,
    in ``backend`` and in every other backend that has the server (:func:`backends_of`):
    first wait (at most ``timeout`` seconds) until every other server of ``backend`` is UP
    (or in MAINT: an operator's), so that a client is never taken out while a peer is DOWN
    (a memory watchdog's recycle, docs/how-to/operate.md#memory-watchdog); then state drain,
    wait (at most ``timeout`` seconds) until it holds no session and has no queued request in
    any of them, then state maint, and wait as long again for a session begun in between (a
    drained server still gets the requests that persist to it: haproxy.cfg.j2's read after
    a write). Where it is in MAINT already it only gets the waits.

    Returns ``(status before, status after)`` in ``backend`` (``after`` is ``MAINT``).
    Raises RollingError as :func:`server_stats`, when a peer stays DOWN for ``timeout``
    seconds (the server is then left as it was), and when sessions remain after ``timeout``
    seconds; the server is then put back in service (state ready) in each backend where it
    was not in DRAIN or MAINT before.
    """
    backends = backends_of(socket_path, backend, server)
    # Never the last one in service: a peer DOWN (e.g. drained by its memory watchdog, whose
    # /readyz says "recycling") comes back first. MAINT is an operator's choice: not waited for.
    waiting = {}
    _wait(lambda: _peers_in_service(socket_path, backend, server, waiting), timeout,
          lambda: f"{backend}/{server}: not drained: {waiting['text']} {timeout:g} s after asking; "
                  f"taking it out would leave the backend without them (put a dead server in "
                  f"MAINT by hand: set server {backend}/<name> state maint)")
    before = {name: server_stats(socket_path, name, server)["status"] for name in backends}
    for name in backends:
        if not before[name].startswith("MAINT"):
            runtime_api(socket_path, f"set server {name}/{server} state drain")
    last = {}

    def idle():
        for name in backends:
            row = server_stats(socket_path, name, server)
            if int(row["scur"] or 0) or int(row["qcur"] or 0):
                last.update(row, name=f"{name}/{server}")
                return False
        return True

    try:
        _wait(idle, timeout, lambda: f"{last['name']}: still {last['scur']} session(s) and {last['qcur']} queued "
                                     f"request(s) {timeout:g} s after the drain")
    except RollingError as exc:
        back = [name for name in backends if not before[name].startswith(("MAINT", "DRAIN"))]
        if not back:
            raise
        for name in back:
            runtime_api(socket_path, f"set server {name}/{server} state ready")
        raise RollingError(f"{exc}; put back in service (state ready), not restarted") from exc
    for name in backends:
        runtime_api(socket_path, f"set server {name}/{server} state maint")
    # HAProxy still sends a drained server the requests that persist to it (the read after a
    # write, haproxy.cfg.j2's use-server): one may have come between the wait and MAINT.
    _wait(idle, timeout, lambda: f"{last['name']}: still {last['scur']} session(s) and {last['qcur']} queued "
                                 f"request(s) {timeout:g} s after MAINT")
    return before[backend], server_stats(socket_path, backend, server)["status"]


def enable(socket_path, backend, server, timeout=TIMEOUT):
    """Step 4: put ``backend/server`` back into HAProxy's rotation (state ready), in
    ``backend`` and every other backend that has the server (:func:`backends_of`), and wait
    at most ``timeout`` seconds until its status is ``UP`` in all of them. Run it only after
    :func:`wait_healthy` passed (see the module docstring: leaving MAINT counts as healthy
    at once).

    Returns ``(status before, status after)`` in ``backend``. Raises RollingError as
    :func:`server_stats`, and when the server is not UP after ``timeout`` seconds.
    """
    backends = backends_of(socket_path, backend, server)
    before = server_stats(socket_path, backend, server)["status"]
    for name in backends:
        runtime_api(socket_path, f"set server {name}/{server} state ready")
    last = {}

    def up():
        for name in backends:
            row = server_stats(socket_path, name, server)
            last.update(row, name=f"{name}/{server}")
            if row["status"] != "UP":
                return False
        return True

    _wait(up, timeout, lambda: f"{last['name']}: not UP {timeout:g} s after state ready (status {last['status']})")
    return before, server_stats(socket_path, backend, server)["status"]


def wait_healthy(url, timeout=TIMEOUT):
    """Step 3: wait at most ``timeout`` seconds until a GET of ``url`` (the client's own
    address and HAProxy's health check path, e.g. ``http://127.0.0.1:8081/Plone/@@ok``)
    answers 200, asked directly (no proxy); each request may take REQUEST_TIMEOUT seconds.
    Raises RollingError with the last answer or error when it does not."""
    last = ["no answer"]
    # The client itself, never through an http_proxy of the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def healthy():
        try:
            with opener.open(url, timeout=REQUEST_TIMEOUT) as response:
                last[0] = f"status {response.status}"
                return response.status == 200
        except urllib.error.HTTPError as exc:
            last[0] = f"status {exc.code}"
        except (OSError, ValueError) as exc:
            last[0] = str(exc)
        return False

    _wait(healthy, timeout, lambda: f"{url}: not healthy after {timeout:g} s ({last[0]})")


def restart_client(socket_path, backend, server, restart, health_url, timeout=TIMEOUT, say=print):
    """Run the rolling restart of one client against one HAProxy, the steps of STEPS in
    their order: :func:`drain`, ``restart()`` (the caller's stop and start of the process),
    :func:`wait_healthy` on ``health_url``, :func:`enable`. ``timeout``: seconds for each
    waiting step. ``say``: called with one progress line per step (``<server>: drained``,
    ``<server>: healthy``, ``<server>: UP again``).

    Raises RollingError from the steps (the server stays in MAINT when the restart or the
    health wait failed, so that no request reaches a broken client), and whatever
    ``restart()`` raises.
    """
    started = time.monotonic()
    drain(socket_path, backend, server, timeout)
    say(f"{server}: drained after {time.monotonic() - started:.1f} s")
    restart()
    wait_healthy(health_url, timeout)
    say(f"{server}: healthy ({health_url})")
    enable(socket_path, backend, server, timeout)
    say(f"{server}: UP again")


def main(argv=None):
    """The command line (module docstring); returns the exit status: 0, or 1 with a message
    on stderr when a step raised RollingError. argparse exits 2 on bad arguments."""
    parser = argparse.ArgumentParser(
        prog="rolling.py",
        description="The balancer-side steps of a rolling restart of one ZEO client, over HAProxy's "
        "runtime API (drain, enable) and the client's health check path (health). Prints one JSON "
        "object; exit status 1 with a message on stderr when a step fails.")
    sub = parser.add_subparsers(dest="command", required=True)
    timeout_help = f"seconds the step may wait (default {TIMEOUT:g})"
    for command, text in (("drain", "state drain, wait until the server has no session, state maint"),
                          ("enable", "state ready, wait until HAProxy has the server UP")):
        step = sub.add_parser(command, help=text, description=text)
        step.add_argument("--socket", required=True, metavar="PATH", help="HAProxy's runtime API (stats) socket")
        step.add_argument("--backend", required=True, help="HAProxy backend, e.g. zeoclients")
        step.add_argument("--server", required=True, help="server name in the backend, e.g. client1")
        step.add_argument("--timeout", type=float, default=TIMEOUT, metavar="SECONDS", help=timeout_help)
    health = sub.add_parser("health", help="wait until the client's health check URL answers 200",
                            description="wait until a GET of URL answers 200")
    health.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8081/Plone/@@ok")
    health.add_argument("--timeout", type=float, default=TIMEOUT, metavar="SECONDS", help=timeout_help)
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    started = time.monotonic()
    try:
        if args.command == "health":
            wait_healthy(args.url, args.timeout)
            result = {"url": args.url}
        else:
            step = drain if args.command == "drain" else enable
            before, after = step(args.socket, args.backend, args.server, args.timeout)
            result = {"server": f"{args.backend}/{args.server}", "before": before, "after": after,
                      "changed": before != after,
                      "backends": backends_of(args.socket, args.backend, args.server)}
    except RollingError as exc:
        print(f"rolling.py {args.command}: {exc}", file=sys.stderr)
        return 1
    result["seconds"] = round(time.monotonic() - started, 2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
