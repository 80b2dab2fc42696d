"""Write the generated reference pages of docs/reference/ from their one source each.

Usage (from the checkout, with .venv's Python)::

    .venv/bin/python scripts/gen_reference.py           # rewrite the pages
    .venv/bin/python scripts/gen_reference.py --check   # write nothing; exit 1 naming each page that differs
    .venv/bin/python scripts/gen_reference.py --check docs/reference/recipe.md   # one page

The pages and their sources:

- ``docs/reference/recipe.md``: the option tables between ``<!-- options: NAME -->`` and
  ``<!-- /options -->``, from the recipes' ``optiontables`` (``plonedeploy.recipe.optionsdoc``,
  the one renderer; the prose around the markers is hand-written);
- ``docs/reference/ansible-variables.md``: every role's variables, from
  ``ansible/roles/*/meta/argument_specs.yml`` (type, required, default, choices, description;
  the default of a variable the spec gives none is the role's ``defaults/main.yml``);
- ``docs/reference/loadtests.md``: every subcommand's ``python -m loadtests <sub> --help``
  (``COLUMNS=100``, run from the checkout), the subcommands as ``python -m loadtests --help``
  lists them; the prose above the marker is hand-written.

Generated text sits between ``<!-- generated: NAME -->`` and ``<!-- /generated -->``; the rest of
a page is left alone. Exit status: 0 up to date (or written), 1 with ``--check`` when a page
differs (each named on stderr), 2 for a page without its markers.

PyYAML: this Python's if it has one, else Ansible's venv (``ansible/.venv``) or the system's
``/usr/bin/python3`` (Debian's python3-yaml), as the tests read ansible/'s YAML.
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RECIPE_PAGE = os.path.join("docs", "reference", "recipe.md")
ANSIBLE_PAGE = os.path.join("docs", "reference", "ansible-variables.md")
LOADTESTS_PAGE = os.path.join("docs", "reference", "loadtests.md")
COLUMNS = "100"

_GENERATED_RE = re.compile(r"^<!-- generated: ([a-z-]+) -->\n(.*?)^<!-- /generated -->$", re.MULTILINE | re.DOTALL)


class MarkerError(ValueError):
    pass


def replace_generated(text, name, body):
    """``text`` with the block ``name`` holding ``body`` (ending in a newline)."""
    found = [m for m in _GENERATED_RE.finditer(text) if m.group(1) == name]
    if len(found) != 1:
        raise MarkerError(f"expected one '<!-- generated: {name} -->' ... '<!-- /generated -->' block, "
                          f"found {len(found)}")
    match = found[0]
    return text[:match.start()] + f"<!-- generated: {name} -->\n{body}<!-- /generated -->" + text[match.end():]


# -- YAML ---------------------------------------------------------------------------------------

def _yaml_python():
    try:
        import yaml  # noqa: F401
        return sys.executable
    except ImportError:
        pass
    for python in (os.path.join(ROOT, "ansible", ".venv", "bin", "python"), "/usr/bin/python3"):
        if os.path.exists(python) and subprocess.run([python, "-c", "import yaml"], capture_output=True,
                                                     check=False).returncode == 0:
            return python
    raise RuntimeError("no Python with PyYAML: make ansible-venv, or apt-get install python3-yaml")


def load_yaml_files(paths):
    """``{path: data}`` of YAML files, read by one Python with PyYAML (as JSON)."""
    code = ("import json, sys, yaml\n"
            "print(json.dumps({p: yaml.safe_load(open(p, encoding='utf-8')) for p in sys.argv[1:]}))")
    out = subprocess.run([_yaml_python(), "-c", code, *paths], capture_output=True, text=True, check=True,
                         timeout=120).stdout
    return json.loads(out)


# -- Ansible variables --------------------------------------------------------------------------

def _cell(text):
    return re.sub(r"\s+", " ", str(text)).strip().replace("|", "\\|")


def _value(value):
    if isinstance(value, str):
        return f"`{_cell(value)}`" if value != "" else "`''`"
    return f"`{_cell(json.dumps(value))}`"


def _rows(options, defaults, prefix=""):
    for name, spec in options.items():
        full = prefix + name
        kind = spec.get("type", "str")
        if kind == "list" and spec.get("elements"):
            kind = f"list of {spec['elements']}"
        if "default" in spec:
            default = _value(spec["default"])
        elif not prefix and name in defaults:
            default = _value(defaults[name]) + " (defaults/main.yml)"
        else:
            default = ""
        choices = ", ".join(_value(c) for c in spec.get("choices", ()))
        description = spec.get("description", "")
        if isinstance(description, list):
            description = " ".join(description)
        yield (f"| `{full}` | {kind} | {'yes' if spec.get('required') else ''} | {default} | {choices} "
               f"| {_cell(description)} |")
        if spec.get("options"):
            sub = f"{full}[]." if spec.get("type") == "list" else f"{full}."
            yield from _rows(spec["options"], {}, sub)


def ansible_variables():
    roles_dir = os.path.join(ROOT, "ansible", "roles")
    roles = sorted(r for r in os.listdir(roles_dir)
                   if os.path.exists(os.path.join(roles_dir, r, "meta", "argument_specs.yml")))
    paths = []
    for role in roles:
        paths.append(os.path.join(roles_dir, role, "meta", "argument_specs.yml"))
        defaults = os.path.join(roles_dir, role, "defaults", "main.yml")
        if os.path.exists(defaults):
            paths.append(defaults)
    data = load_yaml_files(paths)
    lines = ["Roles: " + ", ".join(f"[{role}](#{role})" for role in roles) + ".", ""]
    for role in roles:
        specs = data[os.path.join(roles_dir, role, "meta", "argument_specs.yml")]["argument_specs"]
        defaults = data.get(os.path.join(roles_dir, role, "defaults", "main.yml")) or {}
        lines += [f"## {role}", "", f"`ansible/roles/{role}/meta/argument_specs.yml`", ""]
        seen = {}
        for entry, spec in specs.items():
            title = "entry point `main`" if entry == "main" else f"entry point `{entry}`"
            same = next((other for other, s in seen.items() if s == spec), None)
            if same:
                lines += [f"### {role}: {title}", "", f"The same variables as `{same}`.", ""]
                continue
            seen[entry] = spec
            lines += [f"### {role}: {title}", ""]
            if spec.get("short_description"):
                lines += [_cell(spec["short_description"]) + ".", ""]
            lines += ["| variable | type | required | default | choices | description |",
                      "|---|---|---|---|---|---|"]
            lines += list(_rows(spec.get("options") or {}, defaults if entry == "main" else {}))
            lines.append("")
    return "\n".join(lines)


# -- python -m loadtests ------------------------------------------------------------------------

def _help(*args):
    env = dict(os.environ, COLUMNS=COLUMNS)
    env.pop("LINES", None)
    result = subprocess.run([sys.executable, "-m", "loadtests", *args, "--help"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"python -m loadtests {' '.join(args)} --help exited {result.returncode}: "
                           f"{result.stderr.strip()}")
    return result.stdout


def subcommands(top):
    """The subcommands of ``python -m loadtests --help``, in its order (its 'subcommands:' list)."""
    block = top.split("\nsubcommands:\n", 1)[1]
    names = []
    for line in block.splitlines():
        match = re.match(r"^  (\S+)\s", line)
        if match:
            names.append(match.group(1))
        elif line and not line.startswith(" "):
            break
    return names


def loadtests_help():
    top = _help()
    names = subcommands(top)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        helps = list(pool.map(_help, names))
    lines = ["### `python -m loadtests --help`", "", "```text", top.rstrip(), "```", ""]
    for name, text in zip(names, helps):
        lines += [f"### `python -m loadtests {name}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


# -- the pages ----------------------------------------------------------------------------------

def render_recipe(text):
    """The page with its option tables as ``plonedeploy.recipe.optionsdoc`` renders them (the one
    renderer; the tables' links are relative to docs/reference/)."""
    from plonedeploy.recipe import optionsdoc
    try:
        return optionsdoc.render(text)
    except ValueError as exc:
        raise MarkerError(str(exc)) from exc


PAGES = (
    (RECIPE_PAGE, render_recipe),
    (ANSIBLE_PAGE, lambda text: replace_generated(text, "ansible-variables", ansible_variables())),
    (LOADTESTS_PAGE, lambda text: replace_generated(text, "loadtests-help", loadtests_help())),
)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="scripts/gen_reference.py",
                                     description="Write docs/reference/'s generated pages from their sources.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 and name each page that differs from its source")
    parser.add_argument("--root", default=ROOT, help="the checkout whose docs/ is written (default: this one)")
    parser.add_argument("pages", nargs="*", metavar="PAGE",
                        help=f"only these pages (default: all, {', '.join(page for page, _ in PAGES)})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.pages) - {page for page, _ in PAGES})
    if unknown:
        parser.error(f"not a generated page: {', '.join(unknown)}")
    status = 0
    for page, render in PAGES:
        if args.pages and page not in args.pages:
            continue
        path = os.path.join(args.root, page)
        with open(path, encoding="utf-8") as fp:
            text = fp.read()
        try:
            new = render(text)
        except MarkerError as exc:
            print(f"{page}: {exc}", file=sys.stderr)
            return 2
        if new == text:
            continue
        if args.check:
            print(f"{page} differs from its source: run scripts/gen_reference.py", file=sys.stderr)
            status = 1
            continue
        with open(path, "w", encoding="utf-8") as fp:
            fp.write(new)
        print(f"{page}: written")
    return status


if __name__ == "__main__":
    sys.exit(main())
