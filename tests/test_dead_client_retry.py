"""A GET that reaches a ZEO client at the moment it dies is answered by another client, also
when every other client is at maxconn: a real HAProxy of the project's template
(haproxy/haproxy.cfg.j2) over two stand-in clients.

Why this needs its own ``retries``: HAProxy 2.6's leastconn, asked to redispatch while every
other server is at maxconn, falls back to the server it was told to avoid (lb_fwlc.c,
``fwlc_get_next_server``): the dead client, whose connections died with it, has the free
slots. So a request is retried on it, at once, until ``observe layer4 error-limit 3`` marks
it DOWN; and a first attempt whose connection the kernel accepted just before the process
died resets that count (a successful connection clears ``consecutive_errors``). That is
1 + 3 attempts on the dead client before one can go elsewhere: with ``retries 3`` (4
attempts) the request ended in a 503 (CI rehearsal of 28 Nov: ``SC--``, 3 retries, no
redispatch flag, logged right after "Detected 3 consecutive errors"); ``retries 5`` leaves
one to spare.
"""
import shutil
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
import requests

from http_stub import answering_server
from loadtests.core import haproxy_log
from loadtests.core.balancers import TemporaryBalancer, free_port_pair
from stack_like import stack_like

requires_haproxy = pytest.mark.skipif(not shutil.which("haproxy"), reason="no haproxy binary")

#: Seconds the surviving client takes over each of the two requests that fill its maxconn;
#: the probe waits in HAProxy's queue for one of them (timeout queue set to 10 s below).
BUSY_SECONDS = 4.0


class DyingClient:
    """A stand-in ZEO client on an ephemeral 127.0.0.1 port that answers 200 (after
    ``delay`` seconds for ``/slow``) until :meth:`die_on` is called; then requests for that
    path kill it the way ``kill -9`` does: each connection that carried one is reset
    unanswered, and after ``accepted`` of them (the connections a dying process's listen
    backlog still took) the listening socket stops, so further connections are refused.
    ``finished`` counts the ``/slow`` requests answered."""

    def __init__(self, delay=0.2):
        self.delay, self.finished, self.fatal_path, self.accepted = delay, 0, None, 0
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def die_on(self, path, accepted=1):
        self.accepted, self.fatal_path = accepted, path

    def _accept(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # the listener stopped: dead
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection):
        with connection:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = connection.recv(4096)
                if not chunk:
                    return
                head += chunk
            path = head.split(b" ", 2)[1].decode()
            if path == self.fatal_path:
                with self.lock:
                    self.accepted -= 1
                    if self.accepted == 0:
                        self.close()
                # SO_LINGER 0: close sends a reset, as the kernel does for a killed process
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                return
            if path == "/slow":
                time.sleep(self.delay)
            connection.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\ndead")
            if path == "/slow":
                with self.lock:
                    self.finished += 1

    def close(self):
        """Stop listening at once: shutdown, not only close, because close() leaves the
        socket listening while the accepting thread is still inside accept()."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:  # already stopped
            pass
        self.listener.close()


@requires_haproxy
@pytest.mark.parametrize("accepted", [1, 2])
def test_get_sent_to_a_client_as_it_dies_is_answered_elsewhere(tmp_path, accepted):
    busy = []  # the survivor's /slow requests, appended as they arrive

    def survivor(request):
        if request.path == "/slow":
            busy.append(request.path)
            time.sleep(BUSY_SECONDS)
        return 200, {}, b"survivor"

    dying = DyingClient(delay=1.0)  # a second for all four slow requests to be placed
    try:
        with answering_server(survivor) as alive:
            config = stack_like(tmp_path, [dying.port, urlsplit(alive).port])
            config["haproxy_context"]["timeout_queue"] = 10
            balancer = TemporaryBalancer(config["haproxy_binary"], config, "leastconn", str(tmp_path / "lb"),
                                         free_port_pair())
            with balancer:
                balancer.start("zeoclients", config["servers"])
                # Four slow requests fill both clients' maxconn (2 each); the dying client
                # answers its two first, so the survivor is full and the dying one idle.
                slow = [threading.Thread(target=requests.get, args=(balancer.frontend_url + "/slow",),
                                         kwargs={"timeout": 30}) for _ in range(4)]
                for thread in slow:
                    thread.start()
                # Both conditions: on a slow machine a late request could otherwise reach the
                # dying client after it answered two, and leave the survivor a free slot.
                deadline = time.monotonic() + 10
                while dying.finished < 2 or len(busy) < 2:
                    assert time.monotonic() < deadline, (dying.finished, len(busy))
                    time.sleep(0.02)
                dying.die_on("/page", accepted)
                started = time.monotonic()
                answer = requests.get(balancer.frontend_url + "/page", timeout=30)
                waited = time.monotonic() - started
                for thread in slow:
                    thread.join(30)
            page = [line for line in haproxy_log.lines(balancer.log_path, "zeoclients") if line["path"] == "/page"]
            assert (answer.status_code, answer.text) == (200, "survivor"), page
            # It waited in the queue for the survivor's slot, not in retries' turnarounds.
            assert waited < BUSY_SECONDS + 1, waited
            # It ended on the survivor ("+": redispatched) after exactly one retry per
            # connection the dying client took and 3 refused ones (observe's error-limit):
            # the count the template's retries must exceed (retries 3 lost the 1-taken case).
            assert [(line["server"], line["retries"]) for line in page] == [("client2", f"+{accepted + 3}")], page
    finally:
        dying.close()
