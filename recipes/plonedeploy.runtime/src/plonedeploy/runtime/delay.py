"""WSGI filter ``delay``: a testing aid that makes page requests slower by a fixed time.

Recipe option ``added-delay = <ms>`` (default 0: no filter in the pipeline). It exists for
the canary's tests and its sensitivity benchmark (issue 29; docs/explanation/canary.md): a
"release" that differs from the running one only by this option is a release known to be
slower on pages by exactly that much, so the judge (``loadtests.ab.canary``) must roll it
back and name the page class. Never set it on a site that serves visitors.

Which requests: those of the class ``page`` by :func:`plonedeploy.runtime.pathclass.path_class`,
the judge's own rule (json, blob and write requests are not delayed). The target is the
server's ``REQUEST_URI`` when it gives one (waitress), as HAProxy logs it; else
``SCRIPT_NAME`` + ``PATH_INFO``, which the server has percent-decoded (pyruvate): a view name
sent percent-encoded (``%40%40download``) is then a blob here but a page in HAProxy's log.

The delay is a ``time.sleep`` in the request's worker thread before the application is
called, inside the server's time (HAProxy's ``Tr``) and holding a thread as slow code would.

In a PasteDeploy pipeline (the recipe puts it right before the Zope app)::

    [filter:delay]
    use = egg:plonedeploy.runtime#delay
    delay_ms = 50

    [pipeline:main]
    pipeline = translogger egg:Zope#httpexceptions delay zope
"""
import time

from plonedeploy.runtime.pathclass import path_class

#: The class the filter delays.
DELAYED_CLASS = "page"
#: The largest delay the filter takes, in ms: beyond it a test would only wait for HAProxy's
#: timeouts, not measure the judge.
MAX_DELAY_MS = 10000


def request_target(environ):
    """The request's target as HAProxy logs it, as near as the server lets us (module docstring)."""
    return environ.get("REQUEST_URI") or (environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")) or "/"


def added_delay(app, delay_ms, sleep=time.sleep):
    """Wrap the WSGI ``app``: a request of class :data:`DELAYED_CLASS` first sleeps
    ``delay_ms`` milliseconds (``sleep`` takes seconds; the tests pass their own), then
    ``app`` answers it; other requests go to ``app`` at once."""
    seconds = delay_ms / 1000.0

    def wrapped(environ, start_response):
        if path_class(environ.get("REQUEST_METHOD", "GET"), request_target(environ)) == DELAYED_CLASS:
            sleep(seconds)
        return app(environ, start_response)

    return wrapped


def parse_delay_ms(value, option="added-delay"):
    """``value`` (text or int) as a whole number of milliseconds, 0 to :data:`MAX_DELAY_MS`.
    Raises ``ValueError`` naming ``option`` (the recipe's or the filter's name of it) and the
    allowed values."""
    text = str(value).strip()
    if not text.isdigit() or int(text) > MAX_DELAY_MS:
        raise ValueError(f"{option} = {value!r} is invalid: expected a whole number of milliseconds "
                         f"from 0 to {MAX_DELAY_MS} (0: no delay)")
    return int(text)


def filter_factory(global_conf, delay_ms=None, **local_conf):
    """PasteDeploy filter factory (``egg:plonedeploy.runtime#delay``): ``delay_ms`` (required,
    0 to :data:`MAX_DELAY_MS`). Raises ``ValueError`` naming a missing, wrong or unknown option."""
    if local_conf:
        raise ValueError(f"delay takes only delay_ms, got: {', '.join(sorted(local_conf))}")
    if delay_ms is None:
        raise ValueError("delay needs delay_ms = <milliseconds>")
    milliseconds = parse_delay_ms(delay_ms, "delay_ms")
    return lambda app: added_delay(app, milliseconds)
