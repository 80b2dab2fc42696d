"""HAProxy log lines of the kit's format for the canary's tests (tests/test_canary_judge.py,
test_canary_deploy.py, test_canary_play.py): one line from its fields (:func:`httplog_line`)
and back (:func:`httplog_fields`), and the synthetic log of a whole canary deploy
(:func:`deploy_log`: an A/A phase, the canary's restart, an A/B phase, three servers).

The format is HAProxy's ``option httplog`` (:data:`HTTPLOG`), that of the kit's template
(haproxy/haproxy.cfg.j2: ``option httplog``, no header captures, ``log stdout format raw``);
tests/test_canary_judge.py's test_real_haproxy_logs_lines_of_that_format checks it against the
lines a real HAProxy logs.
"""
import re
from datetime import datetime

import numpy as np

#: HAProxy 2.6's ``option httplog`` (configuration.txt, 8.2.3 "HTTP log format"). ``%hr`` and
#: ``%hs`` (captured headers) are empty without ``capture`` lines, and HAProxy then writes one
#: space where two separators meet; :func:`httplog_line` does the same.
HTTPLOG = ("%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %CC %CS %tsc %ac/%fc/%bc/%sc/%rc %sq/%bq "
           "%hr %hs %{+Q}r")
_TOKEN = re.compile(r"%(?:\{[^}]*\})?(\w+)")
#: Patterns of the tokens, for reading a real line back into its fields.
_TOKEN_PATTERNS = {"ci": r"[\d.]+", "cp": r"\d+", "tr": r"\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d\.\d{3}", "ft": r"\S+",
                   "b": r"[^/\s]+", "s": r"\S+", "TR": r"-?\d+", "Tw": r"-?\d+", "Tc": r"-?\d+", "Tr": r"-?\d+",
                   "Ta": r"\+?-?\d+", "ST": r"-?\d+", "B": r"\+?\d+", "CC": r"\S+", "CS": r"\S+", "tsc": r"\S{4}",
                   "ac": r"\d+", "fc": r"\d+", "bc": r"\d+", "sc": r"\d+", "rc": r"\+?\d+", "sq": r"\d+",
                   "bq": r"\d+", "hr": r"", "hs": r"", "r": r'"[^"]*"'}
DEFAULTS = {"ci": "127.0.0.1", "cp": 40000, "ft": "plone", "b": "zeoclients", "TR": 0, "Tw": 0, "Tc": 0,
            "ST": 200, "B": 2186, "CC": "-", "CS": "-", "tsc": "----", "ac": 4, "fc": 4, "bc": 3, "sc": 1,
            "rc": 0, "sq": 0, "bq": 0, "hr": "", "hs": ""}


#: :data:`HTTPLOG` as a ``str.format`` template, its empty fields left out with their separator.
_FORMAT = " ".join(_TOKEN.sub(lambda m: "{%s}" % m.group(1), field) for field in HTTPLOG.split(" ")
                   if any(DEFAULTS.get(name, True) != "" for name in _TOKEN.findall(field)))


def httplog_line(**values):
    """One log line of :data:`HTTPLOG`: ``values`` by token name (``s`` the server, ``Tr`` ms,
    ``ST`` the status, ``tr`` a datetime or HAProxy's date text, ``r`` the request line
    unquoted, e.g. ``GET /Plone HTTP/1.1``); ``Ta`` defaults to Tr + 1, the rest to
    :data:`DEFAULTS`. Empty fields are left out with their separator, as HAProxy does."""
    values = dict(DEFAULTS, **values)
    assert values["hr"] == values["hs"] == "", "header captures: not in the kit's template"
    values.setdefault("Ta", values["Tr"] + 1 if values["Tr"] >= 0 else 0)
    if isinstance(values["tr"], datetime):
        values["tr"] = values["tr"].strftime("%d/%b/%Y:%H:%M:%S.") + f"{values['tr'].microsecond // 1000:03d}"
    values["r"] = f'"{values["r"]}"' if not str(values["r"]).startswith('"') else values["r"]
    return _FORMAT.format(**values)


def httplog_fields(line):
    """The fields of a real line by token name (None unless ``line`` is of :data:`HTTPLOG`)."""
    parts = []
    for field in HTTPLOG.split(" "):
        names = _TOKEN.findall(field)
        if names and all(not _TOKEN_PATTERNS[name] for name in names):
            continue  # an empty capture: no field, no separator
        pattern, last = "", 0
        for match in _TOKEN.finditer(field):
            pattern += re.escape(field[last:match.start()]) + f"(?P<{match.group(1)}>{_TOKEN_PATTERNS[match.group(1)]})"
            last = match.end()
        parts.append(pattern + re.escape(field[last:]))
    match = re.fullmatch(" ".join(parts), line)
    return match and match.groupdict()


# -- synthetic logs of a canary deploy ------------------------------------------------------------

#: The A/A phase from T0 for PHASE_S seconds, the canary's restart (GAP_S), then the A/B phase.
T0 = datetime(2026, 11, 28, 10, 0, 0).timestamp()
PHASE_S, GAP_S = 300, 20
PHASES = {"aa": (T0, T0 + PHASE_S), "ab": (T0 + PHASE_S + GAP_S, T0 + 2 * PHASE_S + GAP_S)}
#: Requests per second each server gets of a class, and the class's median server time (ms).
RATES = {"page": 2.0, "json": 1.0, "blob": 1.0, "write": 1.0}
MEDIANS = {"page": 80.0, "json": 40.0, "blob": 20.0, "write": 150.0}
REQUESTS = {"page": "GET /Plone/news HTTP/1.1", "json": "GET /Plone/++api++/news HTTP/1.1",
            "blob": "GET /Plone/report.pdf/@@download/file HTTP/1.1", "write": "POST /Plone/news/@@edit HTTP/1.1"}
SERVERS = ("instance", "client2", "client3")  # the canary first


def _same(phase, server, cls, tr, rng):
    """No difference: the server time as drawn, status 200."""
    return tr, 200


def deploy_log(path, change=_same, seed=1, rates=RATES, servers=SERVERS, write_to=None):
    """Write a log of both phases and the gap between them to ``path``: per second, server and
    class a Poisson number of requests (``rates``), server times log-normal around the class's
    median (sigma 0.5). ``change(phase, server, cls, tr, rng)`` returns the ``(Tr, status)``
    logged instead (the canary's new release, a noisy host...). ``write_to``: the one server that
    gets every write (the kit's write lane), else writes go to all. Returns ``path``."""
    rng = np.random.default_rng(seed)
    lines = []
    for second in range(2 * PHASE_S + GAP_S):
        phase = "aa" if second < PHASE_S else "ab" if second >= PHASE_S + GAP_S else None
        for server in servers:
            for cls, rate in rates.items():
                if cls == "write" and write_to and server != write_to:
                    continue
                for offset in np.sort(rng.uniform(0, 1, rng.poisson(rate))):
                    tr = float(rng.lognormal(np.log(MEDIANS[cls]), 0.5))
                    if phase is None:  # the canary restarting: refused connections, left out
                        tr, status = (-1, 503) if server == servers[0] else (tr, 200)
                    else:
                        tr, status = change(phase, server, cls, tr, rng)
                    tsc = "SC--" if tr < 0 else "----"
                    lines.append((T0 + second + offset, httplog_line(
                        tr=datetime.fromtimestamp(T0 + second + offset), b="writes" if cls == "write" else "zeoclients",
                        s=server, Tr=int(round(tr)), ST=status, tsc=tsc, r=REQUESTS[cls])))
    lines.append((T0 + 2 * PHASE_S + GAP_S, httplog_line(  # a line of another proxy, and one of no server
        tr=datetime.fromtimestamp(T0 + 2 * PHASE_S + GAP_S), ft="stats", b="stats", s="<STATS>", Tr=0,
        tsc="LR--", r="GET /stats;csv HTTP/1.1")))
    path.write_text("".join(text + "\n" for _, text in sorted(lines)))
    return path


def slower_pages(phase, server, cls, tr, rng):
    """A :func:`deploy_log` change: the new release adds 50 ms to every page on the canary
    (:data:`SERVERS`' first)."""
    return (tr + 50 if phase == "ab" and server == SERVERS[0] and cls == "page" else tr), 200
