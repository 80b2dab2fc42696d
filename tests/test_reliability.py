"""The kit's promises under failure and abuse (issue #5), on the real stack.

Short versions for CI; ``loadtests.connections.connections`` and the figures in docs/how-to/operate.md are
the full-length runs. Every test leaves the stack as it found it: all servers UP.
"""
import json
import socket
import sys
import threading
import time

import psutil
import pytest
import requests

from conftest import RESTART_LOAD_RATE, STACK, admin_auth, assert_loaded_throughout, run, while_loaded
from loadtests.edge.blobs import abort_download

pytestmark = pytest.mark.integration

BLOB = "/Plone/blob-5mb/@@download/file"
#: pyruvate's send_timeout (templates/pyruvate.ini.in): how long it keeps an aborted
#: response, seconds.
PYRUVATE_SEND_TIMEOUT = 20


def _process(stack, name):
    return psutil.Process(stack.pids()[name])


def _memory(stack):
    """``{client: (RSS MiB, open fds)}`` of the ZEO clients."""
    out = {}
    for name in stack.client_urls:
        proc = _process(stack, name)
        out[name] = (proc.memory_info().rss / 2**20, proc.num_fds())
    return out


def _all_serve(stack):
    """Assert that each client directly and HAProxy answer /Plone with 200 within 30 s."""
    for label, base in stack.bases.items():
        assert requests.get(base + "/Plone", timeout=30).status_code == 200, label


def _raw(port, data, wait=10.0, source="127.0.0.1"):
    """Send raw bytes from ``source`` to 127.0.0.1:port; return the status line's code,
    ``"closed"`` when the server closed without answering, or ``"open"`` when it neither
    answered nor closed within ``wait`` seconds."""
    with socket.socket() as sock:
        sock.bind((source, 0))
        sock.settimeout(wait)
        sock.connect(("127.0.0.1", port))
        sock.sendall(data)
        try:
            answer = sock.recv(4096)
        except ConnectionResetError:
            return "closed"
        except socket.timeout:
            return "open"
    if not answer:
        return "closed"
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else answer[:40]


# (case, raw request, answer from HAProxy, from pyruvate directly, from waitress directly).
# HAProxy refuses everything with a 4xx. The clients listen on 127.0.0.1 for HAProxy only;
# what they do when reached directly is pinned here so a server update that changes it is
# noticed (pyruvate hands chunked bodies to Zope undecoded, hence its 200s; "open": it
# waits for the 2 GB body without allocating it).
HOSTILE = [
    ("malformed request line", b"GET\x00/ HTTP/1.1\r\n\r\n", 400, 400, 400),
    ("not HTTP", b"HELLO WORLD\r\n\r\n", 400, 400, 404),
    ("space in a header name", b"GET /Plone HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header: x\r\n\r\n",
     400, 400, 400),
    ("40 header fields", b"GET /Plone HTTP/1.1\r\nHost: 127.0.0.1\r\n"
     + b"".join(b"X-H%d: x\r\n" % i for i in range(40)) + b"\r\n", 431, 400, 200),
    ("64 kB header", b"GET /Plone HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n",
     400, 200, 431),
    ("bad chunk size", b"POST /Plone HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"zz\r\nhello\r\n0\r\n\r\n", 400, 200, 400),
    ("Content-Length and chunked", b"POST /Plone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411, 200, 200),
    ("2 GB body announced", b"POST /Plone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2000000000\r\n\r\n",
     413, "open", 413),
]


def _targets(stack):
    """``[(target label, port, column in HOSTILE)]``: HAProxy, then each client by its server."""
    column = {"pyruvate": 3, "waitress": 4}
    targets = [("haproxy", stack.ports["haproxy"], 2)]
    for name, kind in stack.kinds.items():
        if kind in column:
            targets.append((f"{name} ({kind})", stack.ports[name], column[kind]))
    return targets


def _hostile_round(stack):
    """Send every HOSTILE request to every target; return ``{(case, target): answer}``."""
    answers = {}
    for case in HOSTILE:
        for label, port, col in _targets(stack):
            answers[(case[0], label)] = (_raw(port, case[1], wait=5.0), case[col])
    return answers


def _vanishing_downloads(port, count=30):
    """Start ``count`` blob downloads on ``port`` and reset each after 64 kB."""
    for _ in range(count):
        abort_download(f"http://127.0.0.1:{port}{BLOB}")


def test_hostile_requests_then_memory_and_fds_come_back(stack):
    """Two rounds of hostile requests and vanishing blob downloads against HAProxy and each
    client: every answer as pinned, both clients serve after each round, open fds return to
    where they were once pyruvate's send_timeout has passed, and RSS stops growing: the
    first round may grow it (pyruvate buffers each aborted 5 MiB response until
    send_timeout, and the allocator keeps freed memory: waitress +19-20 MiB in the first
    round, measured), the third must add less than 8 MiB (measured 0-2 MiB), and all three
    less than 48 MiB (measured up to 20 MiB; one round buffers up to 3 x 30 x 5 MiB)."""
    _all_serve(stack)
    baseline = _memory(stack)
    rss_after = []
    for round_number in (1, 2, 3):
        answers = _hostile_round(stack)
        wrong = {k: v for k, v in answers.items() if v[0] != v[1]}
        assert not wrong, f"round {round_number}: (got, expected) {wrong}"
        for _, port, _ in _targets(stack):
            _vanishing_downloads(port)
        _all_serve(stack)
        time.sleep(PYRUVATE_SEND_TIMEOUT + 5)
        _all_serve(stack)
        now = _memory(stack)
        print(f"\nround {round_number}: RSS MiB / fds {now} (baseline {baseline})")
        for name, (_, fds) in now.items():
            assert fds <= baseline[name][1] + 4, f"{name} holds {fds} fds, had {baseline[name][1]}"
        rss_after.append(now)
    for name in baseline:
        grown = rss_after[2][name][0] - rss_after[1][name][0]
        assert grown < 8, f"{name}: RSS grew {grown:.1f} MiB in the third round"
        total = rss_after[2][name][0] - baseline[name][0]
        assert total < 48, f"{name}: RSS {total:.1f} MiB above its baseline after three rounds"


def test_slowloris_is_cut_by_haproxy_and_starves_no_client(stack):
    """50 connections per target trickle one header line per second. HAProxy answers its
    own with 408 after timeout http-request (10 s); meanwhile every target keeps serving."""
    sockets = {label: [] for label, _, _ in _targets(stack)}
    for label, port, _ in _targets(stack):
        for _ in range(50):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /Plone HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            sockets[label].append(sock)
    try:
        started = time.monotonic()
        served = []
        for second in range(14):
            for label, socks in sockets.items():
                for sock in socks:
                    try:
                        sock.sendall(b"X-Slow-%d: x\r\n" % second)
                    except OSError:
                        pass  # closed by the server: that is the point
            if second in (3, 8):
                ok = [requests.get(base + "/Plone/@@ok", timeout=10).status_code
                      for base in stack.bases.values()]
                served.append(ok)
            time.sleep(max(0.0, started + second + 1 - time.monotonic()))
        assert all(code == 200 for row in served for code in row), served
        answers = []
        for sock in sockets["haproxy"]:
            sock.settimeout(2)
            try:
                answers.append(sock.recv(100).split(b" ")[1])
            except (OSError, IndexError):
                answers.append(b"closed")
        assert answers.count(b"408") == 50, answers
    finally:
        for socks in sockets.values():
            for sock in socks:
                sock.close()
    _all_serve(stack)


def test_zmi_only_from_the_admin_network(stack):
    """buildout.cfg sets manage-networks = 127.0.0.1/32: the ZMI from 127.0.0.2 (another
    source address on loopback) gets 403 from HAProxy; the site itself does not."""
    port = stack.ports["haproxy"]
    for path in ("/manage_main", "/Plone/manage_main", "/Plone/manage", "/Plone/folder/manage_workspace"):
        assert _raw(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode(), source="127.0.0.2") == 403, path
    assert _raw(port, b"GET /Plone HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", source="127.0.0.2") == 200
    # not the ZMI: Zope answers (404), HAProxy does not refuse
    assert _raw(port, b"GET /Plone/managers-guide HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", source="127.0.0.2") == 404
    # from the admin network Zope itself answers (asks for credentials)
    assert _raw(port, b"GET /manage_main HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") == 401


def test_zeo_restart_loses_nothing_committed(stack):
    """Write documents through plone.restapi (authenticated POSTs via HAProxy) before and
    during a ZEO restart under read load. Every POST that got 201 is there afterwards, no
    read of /Plone fails (the clients' caches serve it while ZEO is away), writes succeed
    again, and the outage is reported (failed writes, recovery seconds)."""
    auth, url = admin_auth(), stack.frontend_url
    prefix = f"zeo-restart-{int(time.time())}"
    session = requests.Session()
    session.auth = auth
    session.headers["Accept"] = "application/json"

    def post(number):
        try:
            answer = session.post(url + "/Plone", json={"@type": "Document", "id": f"{prefix}-{number}",
                                                         "title": f"ZEO restart {number}"}, timeout=30)
            return answer.status_code
        except requests.RequestException as exc:
            return type(exc).__name__

    created = [n for n in range(10) if post(n) == 201]
    assert len(created) == 10, "writes before the restart must all succeed"
    stop = threading.Event()
    reads, writes = [], []  # (monotonic time, ok)
    write_errors = []  # status code or exception name of each failed POST

    def reader():
        while not stop.is_set():
            try:
                ok = requests.get(url + "/Plone", timeout=30).status_code == 200
            except requests.RequestException:
                ok = False
            reads.append((time.monotonic(), ok))
            time.sleep(0.05)

    def writer():
        number = 100
        while not stop.is_set():
            status = post(number)
            writes.append((time.monotonic(), status == 201))
            if status != 201:
                write_errors.append(status)
            if status == 201:
                created.append(number)
            number += 1
            time.sleep(0.2)

    pool = []  # (monotonic time, {server: HAProxy status}) while ZEO restarts

    def watcher():
        while not stop.is_set():
            try:
                pool.append((time.monotonic(), stack.states()))
            except OSError as exc:
                pool.append((time.monotonic(), repr(exc)))
            time.sleep(0.5)

    threads = [threading.Thread(target=reader) for _ in range(3)] + [threading.Thread(target=writer),
                                                                      threading.Thread(target=watcher)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(3)
        restart_at = time.monotonic()
        run([STACK, "restart", "zeoserver"], timeout=120)
        zeo_up_at = time.monotonic()
        # recovered: a write and the reads after it succeed
        deadline = zeo_up_at + 90
        while time.monotonic() < deadline:
            if writes and writes[-1][1] and writes[-1][0] > zeo_up_at and reads[-1][1]:
                break
            time.sleep(0.5)
        recovered_at = time.monotonic()
        time.sleep(3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    failed_reads = sum(1 for t, ok in reads if not ok and t >= restart_at)
    failed_writes = sum(1 for t, ok in writes if not ok and t >= restart_at)
    print(f"\nZEO restart: {zeo_up_at - restart_at:.1f} s to restart, recovered "
          f"{recovered_at - zeo_up_at:.1f} s after; {len(reads)} reads ({failed_reads} failed), "
          f"{len(writes)} writes ({failed_writes} failed: {write_errors}), {len(created)} documents committed")
    assert recovered_at < deadline, "no successful write and read within 90 s after ZEO came back"
    # Reads of /Plone never fail: while ZEO is away the clients serve it from their caches.
    during = sum(1 for t, _ in reads if restart_at <= t <= zeo_up_at)
    assert during >= 10, f"only {during} reads while ZEO restarted: too few to tell"
    assert failed_reads == 0, f"{failed_reads} reads failed during the ZEO restart"
    # No client left the pool: /readyz counts a ZEO disconnect only after storage-grace (30 s).
    seen = {str(states) for t, states in pool if t >= restart_at}
    assert len(pool) >= 10 and all(isinstance(states, dict) and set(states.values()) == {"UP"}
                                   for t, states in pool if t >= restart_at), seen
    run([STACK, "wait-up", "--timeout", "120"], timeout=180)
    for name, base in stack.client_urls.items():  # each client sees every committed document
        listing = requests.get(base + "/Plone/@search", params={"portal_type": "Document", "b_size": 1000,
                                                                "sort_on": "id"},
                               auth=auth, headers={"Accept": "application/json"}, timeout=60).json()
        present = {item["@id"].rsplit("/", 1)[1] for item in listing["items"]}
        missing = [n for n in created if f"{prefix}-{n}" not in present]
        assert not missing, f"{name} lacks committed documents {missing}"


#: The four paths of the load tests (Locust's names): (path, Accept header).
LOAD_PATHS = (("/", "text/html"), ("/Plone", "text/html"), ("/Plone", "application/json"),
              ("/Plone/blob-5mb/@@download/file", "*/*"))


def test_rolling_restart_under_load_fails_no_request(stack):
    """bin/stack restart (every client in turn, drained in HAProxy first: the rolling restart
    of plonedeploy.stack.rolling) while 4 loops GET the four paths in turn through HAProxy
    (each loop at most RESTART_LOAD_RATE requests/s, the blob's 5 MiB read in full): 0 failed
    requests, every path served meanwhile, every client UP afterwards.

    The load lasts exactly as long as the restart (a fixed-length Locust run had to outlast
    it: 60 s for four clients on a quiet machine, 83-131 s on a loaded one)."""
    def send(session, url, number):
        path, accept = LOAD_PATHS[number % len(LOAD_PATHS)]
        response = session.get(url + path, headers={"Accept": accept}, timeout=60)
        response.content  # the whole body: a cut download is a failure
        return response

    by_path = []
    restart, took, done, failures = while_loaded(
        # --timeout 300 per client: with the other xdist group converging beside it, a client
        # took 62-77 s to start and the upload client more than 120 s (26 Nov, load 5)
        stack.frontend_url, lambda: run([STACK, "restart", "--timeout", "300"], timeout=1000), threads=4,
        send=send, log=by_path, rate=RESTART_LOAD_RATE)
    # Every client HAProxy balances is rolled (plonedeploy.stack.rolling), the upload lane's
    # only one too.
    balanced = stack.config["servers"] + stack.config.get("upload_servers", [])
    assert [line for line in restart.stdout.splitlines() if line.endswith("UP again")] == [
        f"{name}: UP again" for name in balanced], restart.stdout
    print(f"\nrolling restart of {len(balanced)} clients in {took:.0f} s under load: "
          f"{done} requests, {len(failures)} failed")
    served = {LOAD_PATHS[number % len(LOAD_PATHS)] for number, _, _, ok in by_path if ok}
    assert served == set(LOAD_PATHS), served  # every path was served during the restart
    assert done == len(by_path)
    assert_loaded_throughout(by_path, took)
    assert failures == [], failures[:10]
    assert stack.states() == {**{n: "UP" for n in stack.client_urls}, "BACKEND": "UP"}


def test_uploads_get_503_while_the_upload_lane_restarts(stack):
    """bin/stack restart of the upload lane's only client (drained in HAProxy, MAINT,
    restarted, enabled: plonedeploy.stack.rolling) while 2 loops POST 64 KiB bodies (over
    upload-threshold: the upload lane) to /Plone through HAProxy, each at most 10/s: every
    upload gets 200 from the lane or HAProxy's own 503, never a cut connection, a 502 or a
    504; the lane was really away (at least 5 x 503); the uploads succeed again afterwards.
    (test_rolling_restart_under_load_fails_no_request restarts the lane too, under GETs only.)"""
    (lane,) = stack.config["upload_servers"]
    body = b"u" * 65536
    assert len(body) > stack.config["haproxy_context"]["upload_threshold"]
    answers = []  # (status, X-Served-By, start of the body) of every answer

    def send(session, url, number):
        response = session.post(url + "/Plone", data=body, headers={"Content-Type": "application/octet-stream"},
                                timeout=60)
        answers.append((response.status_code, response.headers.get("X-Served-By"), response.text[:200]))
        return response

    restart, took, done, failures = while_loaded(
        stack.frontend_url, lambda: run([STACK, "restart", lane, "--timeout", "120"], timeout=300), threads=2,
        send=send, rate=10)
    assert restart.stdout.splitlines()[-1] == f"{lane}: UP again", restart.stdout
    print(f"\nrestart of {lane} in {took:.1f} s: {done} uploads, {failures.count(503)} x 503, "
          f"other failures {[f for f in failures if f != 503][:5]}")
    assert [f for f in failures if f != 503] == [], failures[:10]
    # 200s from the lane (not from a page client), 503s from HAProxy itself (not from Zope)
    assert {served for status, served, _ in answers if status == 200} == {lane}, answers[:10]
    assert all("No server is available" in text for status, _, text in answers if status == 503), answers[:10]
    assert failures.count(503) >= 5, (done, failures)  # the lane was away, and the loops saw it
    after = [requests.post(stack.frontend_url + "/Plone", data=body, timeout=60) for _ in range(3)]
    assert [(a.status_code, a.headers.get("X-Served-By")) for a in after] == [(200, lane)] * 3  # back


def test_thousand_connections_on_every_path(stack, tmp_path):
    """1,000 concurrent connections per path through HAProxy (short: 8 s per path, enough for
    HAProxy's queue to pass 500): 0 socket errors, 0 non-2xx answers, 0 HAProxy 5xx, every
    path served."""
    result = run([sys.executable, "-m", "loadtests", "connections", "--connections", "1000",
                  "--duration", "8", "--warmup", "2", "--out", str(tmp_path)], timeout=600, check=False)
    print(result.stdout[-3000:])
    (folder,) = list(tmp_path.iterdir())
    data = json.loads((folder / "report.json").read_text())
    assert [p["path"] for p in data["runs"]] == ["/", "/Plone", "@json", "blob"]
    for path in data["runs"]:
        assert path["requests"] > 0, path
        # socket errors (connect, read, write, timeout) and non-2xx/3xx answers, by kind
        assert path["errors"] == {}, path
        assert path["haproxy"]["hrsp_5xx"] == 0, path
        # HAProxy held all 1,000: its queue reached several hundred requests
        assert path["haproxy"]["backend_qmax"] > 500, path
    assert result.returncode == 0, result.stdout + result.stderr
    _all_serve(stack)
