"""The option tables of docs/reference/recipe.md, rendered from the recipes' tables
(``optiontables``); ``scripts/gen_reference.py`` writes and checks the page with
:func:`render`, as it does every generated reference page.

The page holds, for each recipe, a marker pair ``<!-- options: NAME -->`` ...
``<!-- /options -->`` (``NAME`` a key of ``optiontables.TABLES``); the lines between them
become a Markdown table with the columns option, default, allowed, meaning. The prose
around the markers is left alone.
"""
import re

from plonedeploy.recipe.optiontables import TABLES

_MARKER_RE = re.compile(r"^<!-- options: ([a-z-]+) -->\n(.*?)^<!-- /options -->$", re.MULTILINE | re.DOTALL)


def _code(text):
    return f"`{text}`"


def table(options):
    """The Markdown table (text, ending in a newline) of a tuple of ``optiontables.Option``."""
    lines = ["| option | default | allowed | meaning |", "|---|---|---|---|"]
    for option in options:
        if option.shown_default:
            default = option.shown_default
        else:
            default = _code(option.default) if option.default else "empty"
        if isinstance(option.allowed, tuple):
            allowed = ", ".join(_code(value) for value in option.allowed)
        else:
            allowed = option.allowed
        lines.append(f"| `{option.name}` | {default} | {allowed} | {option.doc} |")
    return "\n".join(lines) + "\n"


def render(text):
    """``text`` with every marked table rewritten; raises ValueError for an unknown name,
    a recipe without a marker, or a marker without its closing ``<!-- /options -->``."""
    found = _MARKER_RE.findall(text)
    unknown = sorted({name for name, _ in found} - set(TABLES))
    missing = sorted(set(TABLES) - {name for name, _ in found})
    if unknown or missing:
        raise ValueError(f"option table markers: unknown {unknown}, missing {missing}")
    if text.count("<!-- options: ") != len(found):
        raise ValueError("an '<!-- options: NAME -->' marker has no '<!-- /options -->' after it")
    return _MARKER_RE.sub(lambda m: f"<!-- options: {m.group(1)} -->\n{table(TABLES[m.group(1)])}"
                                    "<!-- /options -->", text)
