"""PasteDeploy server runners for WSGI servers that ship none usable with Zope.

Every ZEO client is started the same way: ``bin/<part> console`` (or ``fg``) runs Zope's
``runwsgi`` on the part's ``etc/wsgi.ini``. runwsgi (Zope2/Startup/serve.py) first calls
``loadserver`` (the ini's ``[server:main]``), then ``loadapp`` (Zope: opens the ZEO
client), then ``server(app)``. The modules here plug into that in one of two ways:

in-process runners (``paste.server_runner``: cheroot, bjoern, uwsgi, gevent)
    serve the app runwsgi loaded, in runwsgi's own process: one process, one ZEO client.

supervisor factories (``paste.server_factory``: gunicorn, granian, mod_wsgi)
    these servers always fork their worker from a supervisor process. A ZEO client must
    not be forked: its network I/O runs in a thread of its own (ZEO's client thread),
    which does not exist in a forked child, and parent and child would share one ZEO
    connection. So the factory starts the server already when runwsgi *loads* it, before
    Zope is loaded: the supervisor never loads Zope; its one worker process loads the app
    from the same ini (:func:`load_app`). When the server stops, the factory exits the
    process, so runwsgi never reaches its own ``loadapp``. mod_wsgi replaces the process
    (``execve``) with Apache (``mod_wsgi-express``), whose one daemon process loads the app.

Each runner reads only the keys the recipe's template writes and refuses any other key
(pyruvate silently ignores unknown keys; a typo here should stop the client instead).
"""
import os


def take(conf, server, known):
    """Return ``conf`` (the ``[server:main]`` keys) if every key is in ``known``.

    Raises ``ValueError`` naming the unknown keys and the ones ``server``'s runner reads.
    """
    unknown = sorted(set(conf) - set(known))
    if unknown:
        raise ValueError(
            f"[server:main] of {server}: unknown key(s) {', '.join(unknown)}; "
            f"this runner reads: {', '.join(sorted(known))}"
        )
    return conf


def as_int(conf, key):
    """``int(conf[key])``; raises ``ValueError`` naming the key if it is not an integer."""
    try:
        return int(conf[key])
    except (KeyError, ValueError):
        raise ValueError(f"[server:main] {key} = {conf.get(key)!r}: expected an integer") from None


def as_bool(conf, key):
    """``True``/``False`` for ``true``/``false`` (also on/off, yes/no, 1/0)."""
    value = str(conf[key]).strip().lower()
    if value in ("true", "on", "yes", "1"):
        return True
    if value in ("false", "off", "no", "0"):
        return False
    raise ValueError(f"[server:main] {key} = {conf[key]!r}: expected true or false")


def load_app(ini_path, name="main"):
    """Load the WSGI application ``name`` (the Zope pipeline) from the ini at ``ini_path``.

    Used by the workers of supervisor factories; this is what runwsgi's own ``loadapp``
    does (``config:`` URI, relative to the ini's directory).
    """
    from paste.deploy import loadapp

    return loadapp("config:" + os.path.abspath(ini_path), name=name)


def close_zope_databases():
    """Close the ZODB databases Zope opened in this process (what runwsgi does on exit)."""
    import Zope2

    for db in getattr(Zope2, "opened", ()):
        db.close()
