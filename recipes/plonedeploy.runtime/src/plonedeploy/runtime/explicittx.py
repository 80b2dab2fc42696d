"""WSGI filter ``explicittx``: each request's thread uses the ``transaction`` package's
explicit mode, so a RelStorage client polls PostgreSQL for invalidations once per request
instead of three times (recipe option ``transaction-mode = explicit``).

Why (ZODB 6.4, transaction 5.1, Zope 6.3, RelStorage 4.3.0): in the default (implicit)
mode a ZODB ``Connection`` calls ``newTransaction`` -- ``storage.sync()`` and
``storage.poll_invalidations()`` -- when it is opened (``Connection.open``), when the
transaction begins (the synchronizer of ``TransactionManager.begin``) and again after the
transaction ended (``Connection.afterCompletion``). Zope's publisher opens the connection
(``ZPublisher.WSGIPublisher.load_app``) and begins the transaction
(``transaction_pubevents``) for every request, so each request makes all three. For ZEO a
poll is a local look at invalidations the server pushed; for RelStorage each is a round trip
with queries (RelStorage issue #159: "that extra poll_invalidations that we get in implicit
transaction mode is certainly visible in benchmarks"). In explicit mode
(``TransactionManager.explicit``) ``Connection.open`` and ``afterCompletion`` skip it and
only ``begin`` polls.

Explicit mode is a property of the thread's transaction manager (``transaction.manager`` is
thread-local), and Zope offers no setting for it, hence this filter: it sets
``transaction.manager.explicit = True`` in the thread that serves the request, before Zope
opens its connection. Startup and ``bin/instance run`` scripts, in other threads, stay
implicit. The cost of explicit mode is its rule: code that calls ``transaction.get()``,
``commit()`` or ``abort()`` without a ``begin()`` raises ``NoTransaction``; within Zope's
publisher every request is begun, and the kit's tests on a RelStorage build exercise Plone
under it (docs/how-to/relstorage.md, "Tuning").

In a PasteDeploy pipeline, anywhere before the Zope app (the recipe puts it last)::

    [filter:explicittx]
    use = egg:plonedeploy.runtime#explicittx

    [pipeline:main]
    pipeline = translogger egg:Zope#httpexceptions explicittx zope
"""
import transaction


def explicit_transactions(app):
    """Wrap the WSGI ``app``: every call first puts the calling thread's transaction manager
    into explicit mode (idempotent, a per-thread attribute), then calls ``app``."""

    def wrapped(environ, start_response):
        transaction.manager.explicit = True
        return app(environ, start_response)

    return wrapped


def filter_factory(global_conf, **local_conf):
    """PasteDeploy filter factory (``egg:plonedeploy.runtime#explicittx``); takes no options
    and raises ``ValueError`` naming any given."""
    if local_conf:
        raise ValueError(f"explicittx takes no options, got: {', '.join(sorted(local_conf))}")
    return explicit_transactions
