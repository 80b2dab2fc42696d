"""Measurements read from a temporary HAProxy's log (``option httplog``, HAProxy 2.6).

A line, as the kit's template logs it (``log stdout format raw``)::

    127.0.0.1:39368 [22/Nov/2026:09:51:49.917] plone zeoclients/instance 0/13/0/37/50 200 2186
    - - ---- 10/10/9/1/0 0/1 "GET /Plone HTTP/1.1"

fields: client, accept date (HAProxy's local time, ms), frontend, backend/server,
``TR/Tw/Tc/Tr/Ta`` (ms), status, bytes, cookies, termination state, connection counts,
``srv_queue/backend_queue`` positions, request line (HAProxy's format reference,
"8.2.3. HTTP log format"). Lines that are not of this shape (HAProxy's NOTICE and ALERT
lines on the same stdout) are skipped.

Read a log once its HAProxy has stopped: then it is complete. Readers: the A/B's queue waits
and server-time windows (below) and the canary's judge (``loadtests.ab.canary``), which
reads every backend's lines and their termination state.
"""
import functools
import re
import time
from datetime import datetime

import numpy as np

#: HAProxy logs the URL, not the Accept header: /Plone as a page and as JSON are one row.
LOG_PATHS = {"/": "/", "/Plone": "/Plone + @json", "/Plone/blob-5mb/@@download/file": "blob 5MB"}

_LINE = re.compile(
    r"\[(?P<date>\d+/\w+/\d+:\d+:\d+:\d+\.\d+)\] \S+ (?P<backend>[^/\s]+)/(?P<server>\S+) "
    r"-?\d+/(?P<Tw>-?\d+)/-?\d+/(?P<Tr>-?\d+)/\+?-?\d+ (?P<status>-?\d+) \+?\d+ \S+ \S+ (?P<termination>\S+) "
    r"\d+/\d+/\d+/\d+/(?P<retries>\+?\d+) (?P<srv_queue>\d+)/(?P<backend_queue>\d+) "
    r'(?:.*"(?P<method>[A-Z]+) (?P<path>\S+) HTTP)?')


def lines(log_path, backend=None):
    """The log lines of ``backend`` (None: of every backend) as dicts: ``date`` (str,
    HAProxy's local time; :func:`accepted_epoch`), ``backend``, ``server``, ``Tw`` and ``Tr``
    (int, ms; -1 when HAProxy did not get that far), ``status`` (int), ``termination`` (the
    termination state, e.g. ``----``, ``SD--``), ``retries`` (str: the connection retries,
    ``+`` first when the request was redispatched to another server, e.g. ``0``, ``+4``),
    ``srv_queue`` and ``backend_queue`` (int), ``method`` and ``path`` (None on a line without
    a request). With a ``backend``, lines of other proxies (the stats page) are skipped."""
    with open(log_path, encoding="utf-8", errors="replace") as fp:
        for text in fp:
            match = _LINE.search(text)
            if not match or backend is not None and match.group("backend") != backend:
                continue
            line = match.groupdict()
            for key in ("Tw", "Tr", "status", "srv_queue", "backend_queue"):
                line[key] = int(line[key])
            yield line


def accepted_epoch(line):
    """When HAProxy accepted the request of ``line`` (a :func:`lines` dict), epoch seconds.

    HAProxy logs its local time (localtime_r: TZ, else /etc/localtime), which a naive
    datetime's timestamp() reads back the same way; a CI host behind UTC dropped every line
    as "before the warm-up" when this assumed UTC."""
    second, _, millis = line["date"].partition(".")
    return _second_epoch(second, time.tzname, time.timezone, time.altzone) + int(millis) / 1000


@functools.lru_cache(maxsize=1024)
def _second_epoch(second, *zone):
    """Epoch seconds of HAProxy's ``28/Nov/2026:10:00:00`` in local time; cached, as a busy
    log has many lines a second and strptime is most of the time spent reading one (``zone``:
    the time module's idea of the local zone, so that a change of TZ is not served stale)."""
    return datetime.strptime(second, "%d/%b/%Y:%H:%M:%S").timestamp()


def time_summary(values):
    """``{"n", "p50_ms", "p99_ms"}`` of server times ``values`` (ms, not empty): the shape of
    one server and path in a window (:func:`server_time_windows`), p50 and p99 by
    ``numpy.percentile`` (linear interpolation)."""
    p50, p99 = np.percentile(values, [50, 99])
    return {"n": len(values), "p50_ms": float(p50), "p99_ms": float(p99)}


def queue_waits(log_path, backend):
    """Count the requests of ``backend`` that queued.

    Returns ``(requests, queued)``: ``queued`` counts the log lines whose ``Tw`` (ms spent
    in HAProxy's queues) is above 0 or whose ``srv_queue``/``backend_queue`` position is
    above 0, i.e. requests that waited for a free ``maxconn`` slot instead of being sent
    at once to the server the balance algorithm chose. (HAProxy hands a queued request in
    the backend queue to whichever server frees a slot first.)
    """
    requests = queued = 0
    for line in lines(log_path, backend):
        requests += 1
        queued += line["Tw"] > 0 or line["srv_queue"] > 0 or line["backend_queue"] > 0
    return requests, queued


def server_time_windows(log_path, backend, warm_epoch, window_s):
    """Per-window server times of ``backend``'s answered GETs (status 200).

    ``Tr`` (ms from the request sent to the server until its response headers arrived) is
    the server's own time: without HAProxy's queue (``Tw``) and without the transfer of the
    body to Locust (``Ta - Tr``), which on this machine is set by Locust's reading speed.
    Requests accepted before ``warm_epoch`` (the warm-up mark, epoch seconds) are left out;
    ``window_s`` (seconds) cuts the rest into windows from that mark.
    Returns windows shaped like the locustfile's (``[{"start_s", "servers": {server:
    {path: {"n", "p50_ms", "p99_ms"}}}}]``, p50/p99 of Tr by ``numpy.percentile``), with
    the paths of ``LOG_PATHS`` and "all".
    """
    times = {}  # (window, server, path) -> [Tr ms]
    for line in lines(log_path, backend):
        if line["status"] != 200 or line["method"] != "GET":
            continue
        accepted = accepted_epoch(line)
        if accepted < warm_epoch:
            continue
        path = LOG_PATHS.get(line["path"])
        window = int((accepted - warm_epoch) // window_s)
        for name in (path, "all") if path else ("all",):
            times.setdefault((window, line["server"], name), []).append(line["Tr"])
    windows = {}
    for (window, server, path), values in times.items():
        windows.setdefault(window, {}).setdefault(server, {})[path] = time_summary(values)
    return [{"start_s": w * window_s, "servers": windows[w]} for w in sorted(windows)]
