"""What the tests read from a running ZEO client's metrics address: its Prometheus text
(``/metrics``) and its probes (``/livez``, ``/readyz``, ``/startupz``;
plonedeploy.runtime.probes). Used by the tests of several modules (metrics, self-healing,
the memory watchdog, RelStorage, concurrent writes): one copy here instead of imports from
test modules.
"""
import re
import time
import urllib.error
import urllib.request

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(url):
    """``{(name, frozenset(labels.items())): value}`` of one Prometheus text scrape."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return parse(response.read().decode())


def parse(text):
    """``{(name, frozenset(labels.items())): value}`` of Prometheus text format."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        assert match, f"not Prometheus text format: {line!r}"
        labels = frozenset(_LABEL.findall(match.group(3) or ""))
        series[(match.group(1), labels)] = float(match.group(4))
    return series


def value(series, name, **labels):
    """The value of series ``name`` with exactly ``labels``; fails when it is missing."""
    key = (name, frozenset(labels.items()))
    assert key in series, f"no {name}{labels} in scrape; have {sorted({k[0] for k in series})}"
    return series[key]


def probe(url, timeout=5.0):
    """``(status, body, seconds)`` of one GET."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode(), time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), time.monotonic() - started


def readiness(bases):
    """``{client: (status, text)}`` of each client's ``/readyz``; ``bases``: ``{client: its
    metrics base URL}``. A client that does not answer gets ``(None, the error)``, so that
    a wait on it goes on and a failure names it (the grace tests of ZEO and RelStorage)."""
    answers = {}
    for name, base in bases.items():
        try:
            code, body, _ = probe(base + "/readyz")
        except OSError as exc:  # urllib's URLError, a timeout
            code, body = None, repr(exc)
        answers[name] = (code, body.strip())
    return answers
