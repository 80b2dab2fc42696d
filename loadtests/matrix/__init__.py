"""``python -m loadtests matrix`` and its presets ``blob``, ``scaling``, ``servers-wrk``: WSGI
servers x threads x paths x connections (wrk). ``matrix`` holds the options and ``main``;
see its docstring for the other modules.
"""
