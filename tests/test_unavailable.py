"""tests/unavailable.py: a missing tool or permission skips a test here and fails it in CI."""
import pytest

from unavailable import in_ci, unavailable


@pytest.mark.parametrize("value, ci", [("true", True), ("TRUE", True), ("1", True), ("", False),
                                       ("false", False), (None, False)])
def test_ci_is_read_from_the_environment(monkeypatch, value, ci):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert in_ci() is ci


def test_skips_outside_ci_and_fails_in_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="strace not installed"):
        unavailable("strace not installed")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="strace not installed .CI=true"):
        unavailable("strace not installed")
