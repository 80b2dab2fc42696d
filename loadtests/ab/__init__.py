"""``python -m loadtests ab``: the A/B of the two WSGI servers through HAProxy (Locust).

``abtest`` (options, ``main``) -> ``plan`` -> one module per mode (``rounds``, ``deployed``,
``balance``) -> ``measure`` (a Locust run and its measurements) -> ``abstats`` (statistics,
rounds) -> ``report``, ``rounds_report``, ``modes_report`` (the reports); ``abslots`` builds
the rounds' slot clients. Each stage hands the next plain lists and dicts; ``measure`` still
returns a run's measurements as ``report.build``'s dict, built there.
"""
