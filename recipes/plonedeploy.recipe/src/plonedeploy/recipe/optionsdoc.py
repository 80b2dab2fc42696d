"""Write the option tables of docs/reference/recipe.md from the recipes' tables
(``optiontables``).

Usage::

    python -m plonedeploy.recipe.optionsdoc [--check] [PATH]

``PATH`` (default ``docs/reference/recipe.md`` of the current directory, the checkout) holds, for
each recipe, a marker pair ``<!-- options: NAME -->`` ... ``<!-- /options -->`` (``NAME`` a key of
``optiontables.TABLES``); the lines between them are replaced by a Markdown table with the
columns option, default, allowed, meaning. The prose around the markers is left alone.
Exit status: 0 when the file is (``--check``: already was) up to date; 1 with ``--check``
when it differs (nothing written); 2 for a missing, unknown or unclosed marker (message
on stderr).
"""
import argparse
import os
import re
import sys

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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m plonedeploy.recipe.optionsdoc",
                                     description="Write docs/reference/recipe.md's option tables from the recipes' "
                                                 "tables.")
    parser.add_argument("path", nargs="?", default=os.path.join("docs", "reference", "recipe.md"),
                        help="the Markdown file with the markers (default: docs/reference/recipe.md of the "
                        "current directory)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the file differs from what would be written")
    args = parser.parse_args(argv)
    with open(args.path, encoding="utf-8") as fp:
        text = fp.read()
    try:
        new = render(text)
    except ValueError as exc:
        print(f"{args.path}: {exc}", file=sys.stderr)
        return 2
    if new == text:
        return 0
    if args.check:
        print(f"{args.path} differs from the recipes' option tables: run "
              "python -m plonedeploy.recipe.optionsdoc", file=sys.stderr)
        return 1
    with open(args.path, "w", encoding="utf-8") as fp:
        fp.write(new)
    print(f"{args.path}: option tables written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
