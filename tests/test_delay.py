"""The ``delay`` WSGI filter (recipe option ``added-delay``, plonedeploy.runtime.delay), a
testing aid of the canary: which requests it slows, by how much, and its options' errors.
Plain WSGI calls in this process, no stack."""
import time

import pytest

from loadtests.ab import canary
from plonedeploy.runtime import delay, pathclass


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def call(wrapped, method, path_info, **environ):
    statuses = []
    body = b"".join(wrapped({"REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": path_info, **environ},
                            lambda status, headers: statuses.append(status)))
    return statuses, body


def test_the_judge_and_the_filter_share_one_rule():
    assert canary.path_class is pathclass.path_class and canary.CLASSES == pathclass.CLASSES


@pytest.mark.parametrize("method, path_info, environ, slept", [
    ("GET", "/Plone", {}, [0.05]),
    ("GET", "/Plone/front-page", {"QUERY_STRING": "x=1"}, [0.05]),
    ("HEAD", "/Plone/++plone++static/plone.css", {}, [0.05]),
    ("GET", "/Plone/++api++", {}, []),
    ("GET", "/Plone/@search", {}, []),
    ("GET", "/Plone/file/@@download/file", {}, []),
    ("POST", "/Plone/login", {}, []),
    # waitress's REQUEST_URI (as HAProxy logs it) decides over the decoded PATH_INFO
    ("GET", "/Plone/file/@@download/file", {"REQUEST_URI": "/Plone/file/%40%40download/file"}, [0.05]),
])
def test_only_page_requests_sleep_before_the_app(method, path_info, environ, slept):
    sleeps = []
    statuses, body = call(delay.added_delay(app, 50, sleep=sleeps.append), method, path_info, **environ)
    assert sleeps == slept
    assert (statuses, body) == (["200 OK"], b"ok")
    target = environ.get("REQUEST_URI") or path_info
    assert (canary.path_class(method, target) == "page") == bool(slept)


def test_the_factory_delays_pages_by_real_time():
    wrapped = delay.filter_factory({}, delay_ms="80")(app)
    started = time.monotonic()
    assert call(wrapped, "GET", "/Plone") == (["200 OK"], b"ok")
    # time.sleep never returns early (PEP 475), so only the lower bound is certain
    assert time.monotonic() - started >= 0.08


@pytest.mark.parametrize("value", ["-5", "5.5", "fast", "", "10001"])
def test_a_wrong_delay_names_the_option_and_the_allowed_values(value):
    with pytest.raises(ValueError) as err:
        delay.parse_delay_ms(value)
    assert str(err.value) == (f"added-delay = {value!r} is invalid: expected a whole number of milliseconds "
                              "from 0 to 10000 (0: no delay)")
    with pytest.raises(ValueError, match=r"^delay_ms = "):
        delay.filter_factory({}, delay_ms=value)


def test_the_factory_refuses_missing_and_unknown_options():
    with pytest.raises(ValueError, match="delay needs delay_ms"):
        delay.filter_factory({})
    with pytest.raises(ValueError, match="delay takes only delay_ms, got: classes"):
        delay.filter_factory({}, delay_ms="5", classes="json")
    assert delay.parse_delay_ms(" 0 ") == 0 and delay.parse_delay_ms(10000) == 10000
