"""An extra buildout beside the stack: parts derived from the deployed ones, built apart.

The config ``extends`` the one the stack was built with and keeps ``buildout:directory``
the checkout, so ``${buildout:directory}`` (ZEO, blob storage, logs) means the stack's own;
``.installed.cfg``, parts, bin and develop-eggs live in a work directory of their own
(e.g. ``var/abslots``), so building it neither uninstalls nor rewrites the stack's parts.
Used by loadtests.abslots (the A/B slot clients) and loadtests.offclients (the ``-off``
clients).
"""
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILDOUT = os.path.join(ROOT, ".venv-buildout", "bin", "buildout")
#: How much of the end of stdout and of stderr a failure's message carries.
TAIL = 3000


def config(work_dir, extends, parts, sections, comment):
    """Text of the extra buildout's config: the common ``[buildout]`` header, then ``sections``.

    ``work_dir``: absolute directory of the build (``.installed.cfg``, ``parts/``, ``bin/``,
    ``develop-eggs/``); ``extends``: path of the stack's config (``local.cfg`` or
    ``buildout.cfg``); ``parts``: list of part names to install; ``sections``: list of
    lines (the part sections, blank lines between them included); ``comment``: one line
    saying who generated the file, without the ``#``.
    Returns a ``str`` of ``\\n``-joined lines (no trailing newline).
    """
    lines = [
        f"# {comment}",
        "[buildout]",
        f"extends = {extends}",
        f"directory = {ROOT}",
        f"installed = {os.path.join(work_dir, '.installed.cfg')}",
        f"parts-directory = {os.path.join(work_dir, 'parts')}",
        f"bin-directory = {os.path.join(work_dir, 'bin')}",
        f"develop-eggs-directory = {os.path.join(work_dir, 'develop-eggs')}",
        "parts = " + " ".join(parts),
        "",
    ]
    return "\n".join(lines + list(sections))


def build(work_dir, text, label="extra buildout", timeout=900):
    """Write ``text`` to ``work_dir/buildout.cfg`` and run the checkout's buildout on it.

    ``work_dir``: absolute directory, created if missing; buildout runs there. ``text``: the
    config (see :func:`config`). ``label``: names the build in the error message.
    Buildout's whole output goes to ``work_dir/buildout.log`` (overwritten each time).
    Returns the seconds the run took (float; a few when nothing changed: buildout is
    idempotent). Raises RuntimeError, with the path of the config and of the log and the
    last :data:`TAIL` characters of stdout and of stderr, when buildout exits non-zero;
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds; OSError when the config or
    the log cannot be written or buildout cannot be started.
    """
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, "buildout.cfg")
    log = os.path.join(work_dir, "buildout.log")
    with open(path, "w", encoding="utf-8") as fp:
        fp.write(text)
    started = time.monotonic()
    result = subprocess.run([BUILDOUT, "-c", path], cwd=work_dir, capture_output=True, text=True,
                            timeout=timeout, check=False)
    took = time.monotonic() - started
    # A failure's message keeps only the tails; the log keeps what a tail cut off.
    with open(log, "w", encoding="utf-8") as fp:
        fp.write(result.stdout)
        fp.write(result.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"{label} {path} failed (whole output: {log}):\n"
                           f"{result.stdout[-TAIL:]}\n{result.stderr[-TAIL:]}")
    return took
