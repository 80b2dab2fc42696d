"""Traffic-shape weights of the locustfile, parsed without importing Locust.

(Importing Locust monkey-patches the process with gevent, which the report tools must not
have; so this parser lives apart from ``locustfile.py``.)
"""

#: Shape names of the locustfile's user classes, in report order.
SHAPE_NAMES = ("root", "plone", "json", "blob", "logged-in")
#: The logged-in shape is opt-in (weight 0 unless named): it needs the editors and
#: documents of scripts/create_site.py and their password, and its saves grow the database.
DEFAULT_WEIGHTS = "root=1,plone=1,json=1,blob=1"


def parse_weights(text):
    """Parse ``"root=1,plone=2"`` into ``{"root": 1, "plone": 2}``; unnamed shapes get 0.

    Raises ValueError naming the bad item and the allowed shape names, or when every
    weight is 0.
    """
    weights = dict.fromkeys(SHAPE_NAMES, 0)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if name not in SHAPE_NAMES or not sep or not value.isdigit():
            raise ValueError(
                f"--weights item {item!r} is invalid: expected NAME=INTEGER with NAME one of "
                + ", ".join(SHAPE_NAMES)
            )
        weights[name] = int(value)
    if not any(weights.values()):
        raise ValueError("--weights gives every shape weight 0: nothing to run")
    return weights
