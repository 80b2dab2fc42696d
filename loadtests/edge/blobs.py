"""The blob download case: aborted and whole downloads of the 5 MiB blob, the integrity of a
download against the blob file, and the open descriptors of every ZEO client before and
after (``descriptor_check``, ``blob_case``).
"""
import glob
import hashlib
import os
import socket
import struct
import time
import urllib.request

from loadtests.core.stack import BLOB_SIZE, PATHS, ROOT, client_urls, stack_pids
from loadtests.core.wrk import run_wrk
from loadtests.edge.wire import MIB


#: URL path of the 5 MiB blob the site script creates (``core.PATHS["blob"]``).
BLOB_PATH = PATHS["blob"][0]
#: Downloads the descriptor case aborts (RST after 64 KiB) after its whole ones.
ABORTED_DOWNLOADS = 50


# ----------------------------------------------------------------------------- blob downloads

def abort_download(url, keep=65536):
    """Start a download of ``url``, read ``keep`` bytes (or until the server closes), then
    reset the connection (RST, not FIN: the client vanishes, as a closed browser tab or a
    dropped mobile link does). Used here and by tests/test_blob_sendfile.py and
    tests/test_reliability.py; raises ``OSError`` if the server cannot be reached."""
    host_port = url.split("/")[2]
    host, port = host_port.rsplit(":", 1)
    path = "/" + url.split("/", 3)[3]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host_port}\r\nConnection: close\r\n\r\n".encode())
        got = 0
        while got < keep:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += len(chunk)
        # linger on, timeout 0: close() sends RST and drops what is unsent, no FIN handshake
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def reference_blob():
    """The bytes of the newest 5 MiB ``.blob`` file of ``var/blobstorage``: what every
    download of :data:`BLOB_PATH` must equal. Raises RuntimeError when there is none (no site)."""
    files = [p for p in glob.glob(os.path.join(ROOT, "var", "blobstorage", "**", "*.blob"), recursive=True)
             if os.path.getsize(p) == BLOB_SIZE]
    if not files:
        raise RuntimeError("no 5 MiB blob in var/blobstorage: run 'make site'")
    with open(max(files, key=os.path.getmtime), "rb") as fp:
        return fp.read()


def _get(url, headers=None, timeout=60):
    """``(status, headers, body bytes)`` of ``GET url``; headers are case-insensitive.
    Raises ``urllib.error.HTTPError`` for 4xx/5xx and ``OSError`` when unreachable."""
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.status, answer.headers, answer.read()


def blob_integrity(url, reference):
    """Check one whole download and one ``Range: bytes=1000-1999`` of the blob at ``url``
    against ``reference`` (:func:`reference_blob`). Returns the list of problems (empty:
    200 with ``Content-Length`` 5 MiB and the same sha256, then 206 with the right
    ``Content-Range`` and the 1000 bytes of that slice). Raises ``OSError`` (``HTTPError``
    for 4xx/5xx) when a request fails."""
    problems = []
    status, headers, body = _get(url)
    if status != 200 or int(headers.get("Content-Length", -1)) != BLOB_SIZE:
        problems.append(f"status {status}, Content-Length {headers.get('Content-Length')}")
    if hashlib.sha256(body).digest() != hashlib.sha256(reference).digest():
        problems.append("sha256 of the download differs from the blob file")
    status, headers, body = _get(url, {"Range": "bytes=1000-1999"})
    if status != 206 or body != reference[1000:2000] or headers.get("Content-Range") != f"bytes 1000-1999/{BLOB_SIZE}":
        problems.append(f"Range bytes=1000-1999: status {status}, {len(body)} bytes, "
                        f"Content-Range {headers.get('Content-Range')}")
    return problems


def zeo_clients(config):
    """``{part: psutil.Process}`` of every running ZEO client of the stack (the page pool's
    ``servers`` and the ``upload_servers``), whose descriptors the blob case counts."""
    names = list(config["servers"]) + list(config.get("upload_servers", []))
    return {name: proc for name, proc in stack_pids(config).items() if name in names}


def blob_targets(config):
    """``[(label, blob URL)]``: each page-pool client directly (label ``instance (pyruvate)``),
    then the HAProxy frontend (label ``HAProxy``)."""
    kinds = config["server_kinds"]
    targets = [(f"{part} ({kinds[part]})", url + BLOB_PATH) for part, url in client_urls(config).items()]
    return targets + [("HAProxy", config["frontend_url"] + BLOB_PATH)]


def descriptor_check(label, url, clients, downloads, settle=20.0):
    """``downloads`` whole downloads of ``url`` (wrk, 4 connections, in runs of 2-30 s until
    at least that many completed) and :data:`ABORTED_DOWNLOADS` aborted ones
    (:func:`abort_download`); the open descriptors (``num_fds``) and RSS (MiB) of ``clients``
    (``{name: psutil.Process}``) before, and after once every count is back at its value
    before or ``settle`` seconds passed.

    Returns ``{"target", "downloads" (completed, wrk's count), "aborted", "errors" (wrk's
    counts by kind: connect, read, write, status = non-2xx/3xx, timeout), "max_s" (slowest
    completed download, s), "seconds", "settle_s" (s until the descriptors were back),
    "fds_before", "fds_after", "rss_mib_before", "rss_mib_after" ({name: value}), "ok"}``;
    ``ok``: no error and no client more than 2 descriptors above its count before (a log
    file rotated or a ZODB connection opened in the meantime is not a leak; one per
    download would be thousands). Raises RuntimeError when wrk fails, ``OSError`` when the
    target cannot be reached.
    """
    def snapshot():
        return ({n: p.num_fds() for n, p in clients.items()},
                {n: round(p.memory_info().rss / MIB, 1) for n, p in clients.items()})

    _get(url)  # warm up: a ZODB connection and the blob's cache entry exist before counting
    fds_before, rss_before = snapshot()
    done, max_s, started = 0, 0.0, time.monotonic()
    errors = {}
    chunk_seconds = 2  # short first run: it measures the rate the next runs are sized by
    while done < downloads:
        out = run_wrk(url, 4, chunk_seconds)
        done += out["requests"]
        max_s = max(max_s, out["latency_us"]["max"] / 1e6)
        for kind, count in out["errors"].items():
            errors[kind] = errors.get(kind, 0) + count
        if not out["requests"] and sum(out["errors"].values()):
            break  # nothing completes: more runs would only add errors
        rate = max(done / (time.monotonic() - started), 1.0)
        chunk_seconds = int(min(max((downloads - done) / rate + 1, 2), 30))
        print(f"  {label}: {done}/{downloads} downloads, {time.monotonic() - started:.0f} s", flush=True)
    for _ in range(ABORTED_DOWNLOADS):
        abort_download(url)
    aborted_at = time.monotonic()
    deadline = aborted_at + settle
    while True:
        fds_after, rss_after = snapshot()
        if all(fds_after[n] <= fds_before[n] for n in clients) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    leaked = {n: fds_after[n] - fds_before[n] for n in clients}
    return {
        "target": label, "downloads": done, "aborted": ABORTED_DOWNLOADS,
        "errors": {k: v for k, v in errors.items() if v}, "max_s": round(max_s, 2),
        "seconds": round(time.monotonic() - started, 1), "settle_s": round(time.monotonic() - aborted_at, 1),
        "fds_before": fds_before, "fds_after": fds_after,
        "rss_mib_before": rss_before, "rss_mib_after": rss_after,
        "ok": not any(errors.values()) and all(v <= 2 for v in leaked.values()),
    }


def blob_case(label, url, clients, downloads, reference):
    """The blob case on one target: :func:`blob_integrity`, then :func:`descriptor_check`.

    Returns the descriptor check's dict plus what the report table shows: ``answers``
    (``{"2xx": completed downloads without a status error, "aborted": ..., <error kind>:
    count}``), ``answer_s`` (the slowest completed download, s), ``identical`` (no
    integrity problem), ``integrity_problems``, ``descriptors`` (``{name: [before,
    after]}``); ``ok`` is False also when a download was not the blob. Raises as those two.
    """
    problems = blob_integrity(url, reference)
    check = descriptor_check(label, url, clients, downloads)
    errors = check["errors"]
    answers = {"2xx": check["downloads"] - errors.get("status", 0), "aborted": check["aborted"]}
    answers.update(errors)
    check.update({
        "answers": answers, "answer_s": check["max_s"], "identical": not problems,
        "integrity_problems": problems,
        "descriptors": {n: [check["fds_before"][n], check["fds_after"][n]] for n in clients},
        "ok": check["ok"] and not problems,
    })
    return check
