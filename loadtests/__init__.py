"""Load tests and the A/B report of plonedeploy: ``python -m loadtests <subcommand>`` (see
``python -m loadtests --help`` and docs/bench.md); shared helpers in ``loadtests.core``."""
import os
import sys

#: The recipe's source tree: the load tools use its rules (bin/stack's runtime API helpers,
#: the option tables) without the recipe being installed into .venv.
RECIPE_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "recipes", "plonedeploy.recipe", "src")
if RECIPE_SRC not in sys.path:
    sys.path.insert(0, RECIPE_SRC)
