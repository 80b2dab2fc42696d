"""``python -m loadtests connections`` (``connections``): what N connections per path get,
with wrk or the closed-loop client of ``closedloop``; ``fairness`` is its alias."""
