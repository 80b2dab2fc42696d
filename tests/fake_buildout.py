"""A buildout as plonedeploy.recipe's recipes see it, without bin/buildout: sections as dicts.
For the tests that construct a recipe directly (tests/test_options.py, test_probes.py,
test_ansible.py); tests/test_recipe_buildout.py runs the real bin/buildout instead.
"""


def fake_buildout(tmp_path):
    """``{section: {option: value}}``: ``buildout`` (directories under ``tmp_path``, a
    pathlib.Path), ``zeoserver`` and two resolved client parts, ``instance`` (pyruvate) and
    ``uploads`` (waitress), each with its metrics address, on ports 99xx of 127.0.0.1. The
    caller adds the sections of the recipes it constructs (``haproxy``, ``stack``...)."""
    return {
        "buildout": {"directory": str(tmp_path), "parts-directory": str(tmp_path / "parts"),
                     "bin-directory": str(tmp_path / "bin")},
        "zeoserver": {"zeo-address": "127.0.0.1:9900"},
        "instance": {"http-address": "127.0.0.1:9901", "threads": "2", "wsgi-server": "pyruvate",
                     "metrics-address": "127.0.0.1:9911"},
        "uploads": {"http-address": "127.0.0.1:9902", "threads": "2", "wsgi-server": "waitress",
                    "max-request-body-size": "1073741824", "metrics-address": "127.0.0.1:9913"},
    }
