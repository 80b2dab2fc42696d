"""The upgrade step 1 -> 2 of the test add-on: it records each run twice over."""
import os
import time

RECORD = "plonedeploy_upgradetest.upgrade_runs"
#: Environment variable naming a file the step appends a line to each time it runs.
LOG_VARIABLE = "PLONEDEPLOY_UPGRADETEST_LOG"
#: Environment variable: seconds the step takes (default 0), so that a test can start a
#: second run while the first one still holds the lock.
SECONDS_VARIABLE = "PLONEDEPLOY_UPGRADETEST_SECONDS"
#: Environment variable: when set (non-empty), the step raises after recording its run,
#: as a broken upgrade would.
FAIL_VARIABLE = "PLONEDEPLOY_UPGRADETEST_FAIL"


def count_run(setup_tool):
    """Add one to the registry record ``RECORD`` (transactional: counts the commits of this
    step) and, when ``$PLONEDEPLOY_UPGRADETEST_LOG`` names a file, append ``"ran pid PID uid UID"``
    to it (outside the transaction: counts every execution, also one whose commit a
    conflict undid, which the record cannot show); then take ``$PLONEDEPLOY_UPGRADETEST_SECONDS``
    seconds (default 0). With ``$PLONEDEPLOY_UPGRADETEST_FAIL`` set it then raises
    RuntimeError."""
    from plone.registry.interfaces import IRegistry
    from zope.component import getUtility

    registry = getUtility(IRegistry)
    registry[RECORD] = (registry[RECORD] or 0) + 1
    path = os.environ.get(LOG_VARIABLE)
    if path:
        with open(path, "a", encoding="utf-8") as fp:
            fp.write(f"ran pid {os.getpid()} uid {os.getuid()}\n")
    time.sleep(float(os.environ.get(SECONDS_VARIABLE) or 0))
    if os.environ.get(FAIL_VARIABLE):
        raise RuntimeError(f"{FAIL_VARIABLE} is set: the test add-on's upgrade step fails")
