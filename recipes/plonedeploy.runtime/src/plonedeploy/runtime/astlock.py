"""WSGI filter ``astlock``: on CPython before 3.12, one thread at a time turns Python source
into an ``ast`` tree, so that two request threads compiling templates at once cannot break
each other's compile.

Why: CPython 3.11's AST constructor (``ast2obj``, what ``compile(..., ast.PyCF_ONLY_AST)``
and ``ast.parse`` run) keeps its recursion depth in one counter per interpreter, not per
thread. When a thread in it lets another run (a garbage collection inside it runs a
finalizer's Python code, which may give up the GIL) and that thread parses too, the counter
of both is wrong at the end and the compile raises ``SystemError: AST constructor recursion
depth mismatch (before=144, after=139)`` (CPython issue gh-106905; 3.12 keeps the depth per
call). Chameleon parses every Python expression of a page template when it compiles the
template, RestrictedPython every script; both happen in the request's thread on first use.
The kit saw it in rehearsal CI: a logged-in edit form answered 500 because
``plone.app.z3cform``'s ``layout.pt`` failed to compile in a waitress thread while another
thread compiled. A 3.11 reproducer (four threads parsing while cyclic garbage with
finalizers is collected) gets such errors in 3.11.2 and 3.11.7, none in 3.12.1 and 3.13.0,
and none in 3.11 with this filter (tests/test_astlock.py).

How: ``builtins.compile`` is replaced by :func:`locked_compile`, which takes a process-wide
re-entrant lock around the compiles that build an AST (``flags & ast.PyCF_ONLY_AST``) and
passes every other compile straight through. ``compile``, not ``ast.parse``: Chameleon calls
``compile`` itself (``chameleon.astutil.parse``), and callers that imported ``parse`` by
name hold the old function, while every caller looks ``compile`` up in the builtins when it
calls it. Re-entrant because a finalizer run by the collection inside a parse may parse in
the same thread. The compiler inherits the ``__future__`` flags of its caller's code (unless
``dont_inherit``): the wrapper merges its caller's flags itself so that callers compile as
before. The lock costs nothing per request once the templates are compiled (they are cached)
and serialises only the parses, not the rest of a template's compile.

The filter returns the application unchanged: the work is done once, when the pipeline is
loaded (before the server takes requests), and nothing is done on 3.12 or later. The recipe
puts it in the pipeline when the part's Python is older than 3.12::

    [filter:astlock]
    use = egg:plonedeploy.runtime#astlock

    [pipeline:main]
    pipeline = translogger egg:Zope#httpexceptions astlock zope
"""
import __future__
import ast
import builtins
import sys
import threading

#: The Python versions whose AST constructor shares its depth counter between threads.
AFFECTED = sys.version_info < (3, 12)

#: The ``co_flags`` bits a compile inherits from its caller (CPython's ``PyCF_MASK``: the
#: ``__future__`` features).
FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    FUTURE_FLAGS |= getattr(__future__, _name).compiler_flag

_LOCK = threading.RLock()
_builtin_compile = builtins.compile


def locked_compile(source, filename, mode, flags=0, dont_inherit=False, optimize=-1, **kwargs):
    """``builtins.compile`` with the same arguments and result, holding the module's lock
    while it builds an AST (``flags & ast.PyCF_ONLY_AST``). Raises what ``compile`` raises."""
    if not dont_inherit:
        flags |= sys._getframe(1).f_code.co_flags & FUTURE_FLAGS
    if flags & ast.PyCF_ONLY_AST:
        with _LOCK:
            return _builtin_compile(source, filename, mode, flags, True, optimize, **kwargs)
    return _builtin_compile(source, filename, mode, flags, True, optimize, **kwargs)


def install():
    """Replace ``builtins.compile`` by :func:`locked_compile` if this Python is
    :data:`AFFECTED`; idempotent. Returns True if the locked compile is in place."""
    if AFFECTED and builtins.compile is not locked_compile:
        builtins.compile = locked_compile
    return builtins.compile is locked_compile


def filter_factory(global_conf, **local_conf):
    """PasteDeploy filter factory (``egg:plonedeploy.runtime#astlock``): :func:`install`, then
    a filter that returns the application unchanged. Takes no options and raises
    ``ValueError`` naming any given."""
    if local_conf:
        raise ValueError(f"astlock takes no options, got: {', '.join(sorted(local_conf))}")
    install()
    return lambda app: app
