"""``python -m loadtests ab``: the A/B of the two WSGI servers through HAProxy (Locust).

``abtest`` (options, ``main``) -> ``plan`` -> one module per mode (``rounds``, ``deployed``,
``balance``) -> ``measure`` (a Locust run and its measurements) -> ``abstats`` (statistics)
-> ``report``, ``rounds_report``, ``modes_report``; ``abslots`` builds the rounds' slot clients.
"""
