"""``python -m loadtests ab``: the A/B of the two WSGI servers through HAProxy (Locust).

``abtest`` (options, ``main``) -> ``plan`` -> one module per mode (``rounds``, ``deployed``,
``balance``) -> ``measure`` (a Locust run and its measurements) -> ``abstats`` (statistics,
rounds) -> ``report``, ``rounds_report``, ``modes_report`` (the reports); ``abslots`` builds
the rounds' slot clients, ``budget`` gives each an equal CPU budget. Each stage hands the
next plain lists and dicts: ``measure`` returns a run's measurement (Locust's per-server
statistics, HAProxy's counters, CPU), ``loadtests.core.haproxy_log`` reads the temporary
HAProxy's log (server times, queue waits), and the run module hands both to the statistics and
report stages.

``python -m loadtests canary-judge`` (``canary``, ``canary_judge``, ``canary_report``) judges a canary deploy
with the same statistics (``abstats``) from the deployed HAProxy's own log: no load of its
own, the canary's phases against its comparison clients.
"""
