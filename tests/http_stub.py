"""A small HTTP server of a test's own, the one copy the suite's stand-ins share (a ZEO client
behind a real HAProxy, a site for Locust, abslots' warm-up or the soak, certbot's standalone
ACME client): it answers what the test's function says, on an ephemeral 127.0.0.1 port, in a
thread of the test's process.

Servers that do something else are their own: tests/test_probes.py's binds late on a fixed
port and counts the requests inside it at once; tests/multihost/resilience.py's webhook
receiver listens on the control host's bridge address for the whole run;
tests/test_dead_client_retry.py's dying client resets connections and stops listening the way
a killed process does.
"""
import collections
import contextlib
import http.server
import sys
import threading

#: One request as the answer function gets it: ``method`` (``GET`` or ``POST``), ``path`` (with
#: its query), ``headers`` (an ``email.message.Message``), ``body`` (bytes, ``b""`` without a
#: ``Content-Length``).
Request = collections.namedtuple("Request", "method path headers body")


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # HAProxy's health checks and a client that timed out close without reading the
        # answer: a reset, not the test's failure. Anything else is printed (socketserver's way).
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def answering_server(answer, keep_alive=False):
    """Serve ``answer`` on ``http://127.0.0.1:PORT`` (PORT ephemeral) until the block ends;
    yields that base URL, without a trailing slash.

    ``answer(request)`` gets each GET or POST as a :data:`Request` (the body read) and returns
    ``(status, {header: value}, body bytes)``; the server adds ``Content-Length``. It runs in
    the request's own thread (requests are answered concurrently): it may sleep to be a slow
    server, and it records what it needs itself (e.g. append ``request.path`` to a list). An
    exception in it is printed and the connection closed without an answer.

    ``keep_alive``: False (default, http.server's own) answers as HTTP/1.0, one request per
    connection; True as HTTP/1.1, the connection kept for the client's next request.
    """
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def do_GET(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, headers, content = answer(Request(self.command, self.path, self.headers, body))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        do_POST = do_GET  # noqa: N815

        def log_message(self, *_args):
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
