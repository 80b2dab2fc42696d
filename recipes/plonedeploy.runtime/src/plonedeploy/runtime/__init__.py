"""What a plonedeploy ZEO client imports at run time; see setup.py for the entry points.

Nothing here imports zc.buildout, Jinja2 or psutil: those belong to the build
(``plonedeploy.recipe``), which adds this distribution, not itself, to each client's eggs.
"""
