"""The docs as a whole (issue 31, item 6): README's first screen, docs/index.md's map, every
relative link, and the generated reference pages (scripts/gen_reference.py --check).

Nothing is built or started; the reference check runs ``python -m loadtests <sub> --help``
and reads ansible/'s YAML (PyYAML of Ansible's venv or Debian's python3-yaml).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

GEN = os.path.join(ROOT, "scripts", "gen_reference.py")
KINDS = ("tutorial", "how-to", "reference", "explanation")


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as fp:
        return fp.read()


def pages():
    """README.md and every page of docs/, relative to the checkout."""
    found = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                recursive=True))
    return ["README.md"] + found


def without_code(text):
    """``text`` without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"(?ms)^```.*?^```[^\n]*$", "", text)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(title):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    title = re.sub(r"`", "", title.strip().lower())
    title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def anchors(path):
    """The anchors of a page's headings (outside code), duplicates numbered as GitHub does."""
    seen = {}
    result = set()
    text = re.sub(r"(?ms)^```.*?^```[^\n]*$", "", read(path))
    for match in re.finditer(r"^#{1,6} (.+?)\s*#*$", text, re.MULTILINE):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(path):
    """``(target, line)`` of every Markdown link and image of a page."""
    text = without_code(read(path))
    for match in re.finditer(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        yield match.group(1), text.count("\n", 0, match.start()) + 1


def test_readme_first_screen():
    """What the kit is, the two commands exactly as they are, and what you get, in 40 lines;
    no paragraph of timings (those are in docs/results.md)."""
    first = read("README.md").splitlines()[:40]
    screen = "\n".join(first)
    assert first[0] == "# plonedeploy"
    assert "deployment kit for Zope/Plone sites" in screen
    assert any(line.startswith("make demo   # the main job:") for line in first)
    assert any(line.startswith("make test   # the tests:") for line in first)
    assert "## What you get" in screen
    timing = re.search(r"\b\d+(\.\d+)? ?(s|min|minutes|seconds)\b", without_code(screen))
    assert not timing, f"README's first screen states a timing ({timing.group(0)!r}): it belongs in docs/results.md"


def test_index_maps_the_four_kinds_and_every_page():
    index = read(os.path.join("docs", "index.md"))
    headings = [h.lower() for h in re.findall(r"^## (.+)$", index, re.MULTILINE)]
    for kind in ("tutorial", "how-to", "reference", "explanation", "results"):
        assert any(h.startswith(kind) for h in headings), f"docs/index.md has no '## {kind}...' section"
    linked = {os.path.normpath(os.path.join("docs", target.partition("#")[0]))
              for target, _ in links(os.path.join("docs", "index.md")) if not re.match(r"^[a-z]+:", target)}
    for page in pages()[1:]:
        if page != os.path.join("docs", "index.md"):
            assert page in linked, f"docs/index.md does not link {page}"
    for kind in KINDS:
        assert glob.glob(os.path.join(ROOT, "docs", kind, "*.md")), f"docs/{kind}/ has no page"


@pytest.mark.parametrize("page", pages())
def test_relative_links_resolve(page):
    """Every relative link resolves to a file of the checkout, and its #anchor to a heading
    of that file (GitHub's anchors)."""
    broken = []
    for target, line in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(os.path.join(ROOT, file)):
            broken.append(f"{page}:{line}: {target} (no file {file})")
        elif anchor and file.endswith(".md") and anchor not in anchors(file):
            broken.append(f"{page}:{line}: {target} (no heading #{anchor} in {file})")
    assert not broken, "\n".join(broken)


def test_reference_pages_are_generated():
    """docs/reference/'s generated parts are what scripts/gen_reference.py writes from the recipe's
    option tables, the roles' argument_specs.yml and python -m loadtests' --help."""
    result = subprocess.run([sys.executable, GEN, "--check"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr


def test_check_names_the_stale_page(tmp_path):
    """A hand edit in a generated table fails --check, which names the page; a run writes it
    back. (Only the recipe's and Ansible's pages: the loadtests page is checked above.)"""
    recipe = os.path.join("docs", "reference", "recipe.md")
    ansible = os.path.join("docs", "reference", "ansible-variables.md")
    for page in (recipe, ansible):
        os.makedirs(tmp_path / os.path.dirname(page), exist_ok=True)
        shutil.copy(os.path.join(ROOT, page), tmp_path / page)
    stale = read(ansible).replace("| `haproxy_bind` | str | yes |", "| `haproxy_bind` | int | yes |")
    assert stale != read(ansible)
    (tmp_path / ansible).write_text(stale)

    def gen(*args):
        return subprocess.run([sys.executable, GEN, "--root", str(tmp_path), *args, recipe, ansible],
                              cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)

    result = gen("--check")
    assert result.returncode == 1
    assert f"{ansible} differs from its source" in result.stderr
    assert recipe not in result.stderr
    assert gen().returncode == 0
    assert (tmp_path / ansible).read_text() == read(ansible)
    (tmp_path / recipe).write_text(read(recipe).replace("<!-- /generated -->", ""))
    (tmp_path / ansible).write_text(read(ansible).replace("<!-- /generated -->", ""))
    result = gen("--check")
    assert result.returncode == 2 and f"{ansible}: expected one" in result.stderr
