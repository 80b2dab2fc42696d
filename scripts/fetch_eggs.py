"""Fetch every pinned egg of versions.cfg into buildout's download cache, in parallel,
and optionally install the wheels into the eggs directory, in parallel too.

Usage: ``.venv-buildout/bin/python scripts/fetch_eggs.py [--cache DIR] [--jobs N]
[--eggs-directory eggs/v5 [--install-jobs N]]`` (``make build`` runs it before
``bin/buildout``).

Why: on a fresh machine bin/buildout reads PyPI's index page, downloads and installs each
of the ~260 eggs one after another; measured, about 0.15 s per egg goes to the index page
and 0.6 s to the download and the ``pip install`` subprocess that buildout 6 runs for each
wheel, most of it the pip run (CPU). So this script

1. downloads them all first with ``pip download`` (several pip processes at once, each over
   a share of the list), so that bin/buildout can run with ``install-from-cache = true``
   and touch no network for eggs at all;
2. with ``--eggs-directory``, installs the wheels into buildout's eggs directory with
   buildout's own installer (``zc.buildout.easy_install.install``, the API recipes use,
   from the cache, pinned versions only), several processes at once, each egg after the
   eggs its wheel requires. zc.buildout is made for several buildouts sharing one eggs
   directory (it installs into a temporary directory and renames), so where a dependency
   cycle makes two workers need the same egg, it is installed twice and one copy kept.
   bin/buildout then finds every egg installed and only builds the parts. Sdists are left
   to bin/buildout.

- The list is ``[versions]`` of versions.cfg, exactly: one source of pins, nothing resolved
  here (``--no-deps``), every file ``name==version``; but the eggs of
  requirements-buildout.txt, which run buildout and come from .venv-buildout.
- A wheel for this Python and platform is taken when PyPI has one, else the sdist
  (``--prefer-binary``; buildout builds sdists with pip as before).
- Files go to ``DIR/dist`` (``--cache``, default ``var/download-cache``), which is where
  buildout's ``download-cache = DIR`` looks for eggs.
- A pin whose file is already in ``DIR/dist`` is skipped, so a second run needs no network
  and takes well under a second.

Run it with the Python that runs bin/buildout (.venv-buildout), so that pip picks the
wheels for that interpreter. Exit status 1, with the pip output of the failed share, when
any pin could not be downloaded.
"""
import argparse
import configparser
import contextlib
import email.parser
import io
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name,
                             parse_sdist_filename, parse_wheel_filename)
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def buildout_venv_names(path=os.path.join(ROOT, "requirements-buildout.txt")):
    """Return the names of requirements-buildout.txt (canonical).

    These run buildout itself and come from .venv-buildout, never from the eggs directory:
    buildout does not fetch or install them, so neither do we.
    """
    with open(path, encoding="utf-8") as fp:
        lines = [line.split("#")[0].strip() for line in fp]
    return {canonicalize_name(Requirement(line).name) for line in lines if line}


FROM_BUILDOUT_VENV = buildout_venv_names()


def read_pins(path):
    """Return ``{name: version}`` of the ``[versions]`` section of a buildout cfg file."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # keep the case of distribution names
    if not parser.read(path):
        sys.exit(f"fetch_eggs: cannot read {path}")
    if not parser.has_section("versions"):
        sys.exit(f"fetch_eggs: {path} has no [versions] section")
    return dict(parser["versions"])


def cached(dist_dir):
    """Return the set of ``(canonical name, Version)`` of the wheels and sdists in dist_dir."""
    have = set()
    for filename in os.listdir(dist_dir):
        try:
            if filename.endswith(".whl"):
                name, version, _, _ = parse_wheel_filename(filename)
            elif filename.endswith((".tar.gz", ".zip")):
                name, version = parse_sdist_filename(filename)
            else:
                continue
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue  # a partial download or a foreign file: not ours to judge
        have.add((canonicalize_name(name), version))
    return have


def missing_pins(pins, dist_dir):
    """Return the ``name==version`` lines of the pins that have no file in dist_dir yet."""
    have = cached(dist_dir)
    return [f"{name}=={version}" for name, version in sorted(pins.items(), key=lambda p: p[0].lower())
            if canonicalize_name(name) not in FROM_BUILDOUT_VENV
            and (canonicalize_name(name), Version(version)) not in have]


def download(requirements, dist_dir, jobs, tmp):
    """Run up to ``jobs`` pip processes at once, each over every jobs-th requirement.

    Returns the list of ``(share, output)`` of the pip processes that failed.
    """
    procs = []
    for i in range(min(jobs, len(requirements))):
        share = requirements[i::jobs]
        req_file = os.path.join(tmp, f"share-{i}.txt")
        with open(req_file, "w", encoding="utf-8") as fp:
            fp.write("\n".join(share) + "\n")
        log = open(os.path.join(tmp, f"share-{i}.log"), "w+", encoding="utf-8")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--prefer-binary",
               "--disable-pip-version-check", "--progress-bar", "off",
               "-d", dist_dir, "-r", req_file]
        procs.append((share, log, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
    failed = []
    for share, log, proc in procs:
        if proc.wait() != 0:
            log.seek(0)
            failed.append((share, log.read()))
        log.close()
    return failed


def wheel_requirements(wheel):
    """Return the canonical names a wheel requires without extras, on this platform."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            meta = email.parser.BytesParser().parsebytes(zf.read(name), headersonly=True)
    except (OSError, StopIteration, zipfile.BadZipFile):
        return set()  # unknown: installed whenever a worker is free; buildout adds what is missing
    names = set()
    for line in meta.get_all("Requires-Dist") or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            names.add(canonicalize_name(req.name))
    return names


def wheel_specs(pins, dist_dir, skip=()):
    """Return ``{canonical name: (spec, required canonical names)}`` of the pinned wheels,
    but for the canonical names in ``skip``."""
    wanted = {(canonicalize_name(n), Version(v)): f"{n}=={v}" for n, v in pins.items()
              if canonicalize_name(n) not in FROM_BUILDOUT_VENV}
    found = {}
    for filename in os.listdir(dist_dir):
        if not filename.endswith(".whl"):
            continue  # sdists are left to bin/buildout: it builds them only if a part needs them
        try:
            name, version, _, _ = parse_wheel_filename(filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        spec = wanted.get((canonicalize_name(name), version))
        if spec and canonicalize_name(name) not in skip:
            found[canonicalize_name(name)] = (spec, wheel_requirements(os.path.join(dist_dir, filename)))
    return found


def installed(eggs_dir, pins):
    """Return the canonical names whose pinned version is an egg in eggs_dir already.

    Buildout names them ``<name>-<version>-py3.11[-<platform>].egg`` (``-`` in the name
    made ``_``).
    """
    pinned = {canonicalize_name(n): v for n, v in pins.items()}
    have = set()
    for entry in os.listdir(eggs_dir):
        parts = entry.split("-")
        if not entry.endswith(".egg") or len(parts) < 3:
            continue
        name = canonicalize_name(parts[0])
        try:
            if name in pinned and Version(parts[1]) == Version(pinned[name]):
                have.add(name)
        except InvalidVersion:
            continue
    return have


_WORKER = {}


def _init_worker(dist_dir, eggs_dir, pins):
    # zc.buildout is imported here, not at the top: the fetch step needs only pip.
    import logging

    import zc.buildout.easy_install as ez
    # setuptools' index warns "Not found: DIR/name/" for every egg of a directory index.
    logging.basicConfig(level=logging.ERROR, format="%(message)s")
    logging.getLogger("zc.buildout").setLevel(logging.WARNING)
    ez.download_cache(dist_dir)
    ez.install_from_cache(True)  # the cache is the only index: no network
    ez.allow_picked_versions(False)  # every egg, dependencies too, from versions.cfg
    ez.prefer_final(True)
    ez.get_subprocess_output = _pip_wheel_installs_in_process(ez.get_subprocess_output)
    _WORKER.update(ez=ez, eggs_dir=eggs_dir, pins=pins)


def _pip_wheel_installs_in_process(run_subprocess):
    """Wrap ``zc.buildout.easy_install.get_subprocess_output`` so that the ``pip install
    --no-deps -t DEST WHEEL`` it runs for each wheel is done in this process by PyPA's
    ``installer`` library instead; any other command goes to ``run_subprocess``.

    Why: a pip process costs about 0.45 s of CPU per wheel, most of it starting the
    interpreter and importing pip (measured here: 40 wheels took 19.6 s in pip processes,
    3.7 s in one process). Installing all 266 eggs of versions.cfg into an empty eggs
    directory, 2 processes on 2 cores: 157 s with pip, 37 s with ``installer``, and the
    same files in both eggs directories but pip's REQUESTED and direct_url.json.
    ``installer`` lays the wheel out as ``pip install -t`` does (see :func:`install_wheel`;
    tests/test_fetch_eggs.py compares both trees); buildout then turns DEST into an egg as
    after pip. Sdists and editable installs still go to pip.
    """
    def get_subprocess_output(args, **kw):
        # buildout appends options after the spec (--no-python-version-warning): find it.
        wheels = [a for a in args if isinstance(a, str) and a.endswith(".whl")]
        if list(args[1:4]) != ["-m", "pip", "install"] or "-t" not in args or "-e" in args \
                or len(wheels) != 1:
            return run_subprocess(args, **kw)
        install_wheel(wheels[0], args[args.index("-t") + 1])
        return ""
    return get_subprocess_output


def install_wheel(wheel, dest):
    """Install ``wheel`` (path of a .whl) into the directory ``dest`` as ``pip install
    --no-deps -t dest`` does, with ``installer``: bytecode compiled (as pip does), C
    headers left out (pip -t drops them too: its target mode moves only the library and
    data directories).

    Raises ``installer``'s errors (e.g. ``InvalidWheelSource``) for a broken wheel.
    """
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    with tempfile.TemporaryDirectory(prefix="fetch_eggs-headers-") as headers:
        scheme = {"purelib": dest, "platlib": dest, "data": dest,
                  "scripts": os.path.join(dest, "bin"), "headers": headers}
        destination = SchemeDictionaryDestination(scheme, interpreter=sys.executable,
                                                  script_kind="posix",
                                                  bytecode_optimization_levels=(0,))
        # compileall prints "*** Error compiling" for the deliberately broken test files
        # some packages ship (App/tests/fixtures/error.py); pip hides that output too.
        with WheelFile.open(wheel) as source, contextlib.redirect_stdout(io.StringIO()):
            install(source, destination, additional_metadata={"INSTALLER": b"pip\n"})


def _install_one(spec):
    try:
        _WORKER["ez"].install([spec], _WORKER["eggs_dir"], versions=_WORKER["pins"],
                              newest=False)
    except Exception as exc:  # reported by the parent, with the spec
        return f"{spec}: {type(exc).__name__}: {exc}"
    return None


def install(pins, dist_dir, eggs_dir, jobs):
    """Install every pinned wheel of dist_dir into eggs_dir, ``jobs`` processes at once.

    An egg is started only when the eggs it requires are installed (dependencies first),
    so that each egg is installed once, by one worker: buildout's installer installs the
    missing dependencies of an egg itself, one after another, and two workers would install
    the same ones. Where requirements form a cycle (Plone's packages do), the egg with the
    fewest missing requirements goes first. Returns the error lines (empty when all went in).
    """
    os.makedirs(eggs_dir, exist_ok=True)
    # A re-run: nothing to do for the eggs buildout already has.
    wheels = wheel_specs(pins, dist_dir, skip=installed(eggs_dir, pins))
    if not wheels:
        return []
    waiting = {name: deps & wheels.keys() - {name} for name, (_, deps) in wheels.items()}
    done, errors, running = set(), [], {}
    with ProcessPoolExecutor(jobs, initializer=_init_worker,
                             initargs=(dist_dir, eggs_dir, pins)) as pool:
        while waiting or running:
            ready = [n for n, deps in waiting.items() if deps <= done]
            if not ready and not running:
                ready = [min(waiting, key=lambda n: (len(waiting[n] - done), n))]
            for name in sorted(ready)[:jobs - len(running)]:
                del waiting[name]
                running[pool.submit(_install_one, wheels[name][0])] = name
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                done.add(running.pop(future))
                if future.result():
                    errors.append(future.result())
    return errors


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", default=os.path.join(ROOT, "versions.cfg"),
                        help="buildout cfg file whose [versions] to fetch (default: versions.cfg)")
    parser.add_argument("--cache", default=os.path.join(ROOT, "var", "download-cache"),
                        help="buildout download-cache directory; files go to CACHE/dist "
                             "(default: var/download-cache)")
    parser.add_argument("--jobs", type=int, default=8,
                        help="pip processes at once (default: 8; the work is network "
                             "waiting, not CPU, so more than the cores)")
    parser.add_argument("--eggs-directory", metavar="DIR",
                        help="also install the wheels into this buildout eggs directory: "
                             "eggs-directory plus eggs-directory-version, i.e. eggs/v5 for "
                             "buildout.cfg (default: fetch only)")
    parser.add_argument("--install-jobs", type=int, default=max(2, os.cpu_count() or 1),
                        help="install processes at once (default: the number of CPUs, at "
                             "least 2: each install is a CPU-bound pip run)")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.install_jobs < 1:
        parser.error("--jobs and --install-jobs must be at least 1")

    start = time.monotonic()
    pins = read_pins(args.versions)
    dist_dir = os.path.join(os.path.abspath(args.cache), "dist")
    os.makedirs(dist_dir, exist_ok=True)
    todo = missing_pins(pins, dist_dir)
    if todo:
        print(f"fetch_eggs: downloading {len(todo)} pins into {dist_dir} "
              f"({args.jobs} pip processes)", flush=True)
        with tempfile.TemporaryDirectory(prefix="fetch_eggs-") as tmp:
            failed = download(todo, dist_dir, args.jobs, tmp)
        for share, output in failed:
            print(f"fetch_eggs: pip download failed for one of: {' '.join(share)}\n{output}",
                  file=sys.stderr)
        still = missing_pins(pins, dist_dir)
        if still:
            print(f"fetch_eggs: not in {dist_dir} after download: {' '.join(still)}",
                  file=sys.stderr)
            return 1
    own = sum(1 for name in pins if canonicalize_name(name) in FROM_BUILDOUT_VENV)
    print(f"fetch_eggs: all {len(pins) - own} pins in {dist_dir} ({len(todo)} downloaded, "
          f"{time.monotonic() - start:.1f} s; {own} more are .venv-buildout's)", flush=True)
    if args.eggs_directory:
        start = time.monotonic()
        eggs_dir = os.path.abspath(args.eggs_directory)
        errors = install(pins, dist_dir, eggs_dir, args.install_jobs)
        for line in errors:
            print(f"fetch_eggs: install failed: {line}", file=sys.stderr)
        if errors:
            return 1
        print(f"fetch_eggs: wheels installed in {eggs_dir} "
              f"({args.install_jobs} processes, {time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
