"""Load tests and the A/B report of plonedeploy: ``python -m loadtests <subcommand>`` (see
``python -m loadtests --help`` and docs/reference/loadtests.md); shared helpers in ``loadtests.core``.

The kit's rules and bin/stack's API come from the installed distributions (plonedeploy.stack,
plonedeploy.recipe, plonedeploy.runtime: editable installs in .venv, Makefile's venv target)."""
