"""Load tests and the A/B report of plonedeploy: ``python -m loadtests <subcommand>`` (see
``python -m loadtests --help`` and docs/bench.md); shared helpers in ``loadtests.core``."""
import os
import sys

#: The recipe's source tree: the load tools use its rules (bin/stack's runtime API helpers,
#: the option tables) without the recipe being installed into .venv; and the runtime's,
#: which the recipe imports (plonedeploy.runtime.access, when bin/stack's code starts the
#: load tools' extra clients).
_RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")
RECIPE_SRC = os.path.join(_RECIPES, "plonedeploy.recipe", "src")
RUNTIME_SRC = os.path.join(_RECIPES, "plonedeploy.runtime", "src")
for _path in (RECIPE_SRC, RUNTIME_SRC):
    if _path not in sys.path:
        sys.path.insert(0, _path)
