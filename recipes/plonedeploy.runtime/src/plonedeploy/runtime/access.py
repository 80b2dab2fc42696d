"""Let a service user reach the files it runs from: search permission, by POSIX ACL.

A program the kit starts as root and runs as another user (the stack's ``service-user``
for ZEO and the ZEO clients, ``postgres`` for PostgreSQL) reads its build: the eggs, the
interpreter, ``bin/`` and ``parts/``. A checkout under a mode-0700 directory (root's
home, a ``mktemp -d`` clone) stops that user at the first such parent. This module grants
exactly what is missing: ``setfacl -m u:<user>:x`` (search, not read) on each directory
on the way that the user cannot enter, and nothing on directories it can enter already.
It checks as that user (a forked child with its uid, gid and groups, so ACLs, groups and
every mode bit count as the kernel counts them), not by reading mode bits as root.

It is also how the mod_wsgi runner (``plonedeploy.runtime.servers.mod_wsgi``) lets
``run_as`` reach the part and its eggs, and how a ZEO client's own script (``bin/<client>``,
built with the instance recipe's ``service-user``) becomes that user when root starts it
(:func:`become`): that is why it lives in plonedeploy.runtime, which a running ZEO client
may import, and the recipe (``bin/stack``, ``bin/postgresql``) imports it from here. stdlib only.
"""
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys

#: The umask of the service user's processes (bin/stack's supervisord, a client script that
#: dropped to it): what they create is theirs and their group's to read, nobody else's.
SERVICE_UMASK = 0o027

#: setfacl (Debian's package ``acl``; scripts/install-system.sh installs it).
SETFACL = "setfacl"


class AccessError(Exception):
    """The user cannot reach a path, and granting search permission did not (or could not)
    change that; the message names the user, the path and what to do."""


def in_child(function):
    """``function()``'s result (JSON-able) as computed in a forked child of this process:
    for what must run as another user (the child may drop its uid, the caller stays
    who it is). The child sends the result as JSON through a pipe and exits without
    cleanup. Raises OSError when the child fails (its traceback goes to stderr)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report, exit without the parent's cleanup
        status = 1
        try:
            os.close(reader)
            os.write(writer, json.dumps(function()).encode())
            status = 0
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(writer)
    with os.fdopen(reader, "rb") as fp:
        data = fp.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        raise OSError(f"the forked child failed (status {status})")
    return json.loads(data)


def _check_as(user, paths):
    """``{path: None | ["enter", directory] | ["read", path]}`` for each of ``paths`` as
    ``user`` (a ``pwd`` entry) sees them: the first directory on the way (the path itself
    included, when it is a directory) it cannot search, else ``read`` when it cannot read
    the path, else None. Runs the checks in a forked child that has become the user
    (:func:`in_child`); only root can fork one that changes user. Raises OSError when the
    child fails."""
    gids = os.getgrouplist(user.pw_name, user.pw_gid)

    def look():
        os.setgroups(gids)
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
        result = {}
        for path in paths:
            result[path] = None
            parts = os.path.abspath(path).split(os.sep)
            for index in range(1, len(parts) + 1):
                directory = os.sep.join(parts[:index]) or os.sep
                if index == len(parts) and not os.path.isdir(directory):
                    break
                if not os.access(directory, os.X_OK):
                    result[path] = ["enter", directory]
                    break
            if result[path] is None and os.path.lexists(path) and not os.access(path, os.R_OK):
                result[path] = ["read", path]
        return result

    try:
        return in_child(look)
    except OSError as exc:
        raise OSError(f"checking access as {user.pw_name!r} failed: {exc}") from exc


def grant_search(user, paths, why, say=None):
    """Make every one of ``paths`` reachable for system user ``user`` (a name): for each
    directory on the way that the user cannot search, ``setfacl -m u:<user>:x``, then
    check again, until nothing blocks. ``why`` (text) says in the one output line what the
    user runs from there; ``say`` prints it (default: print, flushed). Paths that do not exist
    yet count as reachable up to where they end.

    Returns the directories granted, in order (empty when nothing was missing). Must run
    as root (it checks as the user). Raises KeyError when the user does not exist,
    AccessError when setfacl is missing or fails (a file system without ACLs: the message
    names ``chmod o+x`` instead), or when a path stays unreadable for the user after its
    directories were opened (a file of mode 0600: that is for its owner to change).
    """
    entry = pwd.getpwnam(user)
    say = say or (lambda line: print(line, flush=True))
    paths = list(dict.fromkeys(os.path.abspath(p) for p in paths))
    granted = []
    while True:
        problems = _check_as(entry, paths)
        blocked = sorted({where for kind, where in filter(None, problems.values()) if kind == "enter"})
        if not blocked:
            break
        for directory in blocked:
            if directory in granted:  # granted and still blocked: ACLs are not honoured here
                raise AccessError(
                    f"user {user!r} still cannot enter {directory} after setfacl -m u:{user}:x; give it "
                    f"search permission another way (chmod o+x {directory}) or build elsewhere")
            _setfacl(user, directory)
            granted.append(directory)
    unreadable = sorted(where for kind, where in filter(None, problems.values()) if kind == "read")
    if unreadable:
        raise AccessError(f"user {user!r} ({why}) cannot read {', '.join(unreadable)}: make it readable "
                          f"(chmod o+r, or a group of that user)")
    if granted:
        say(f"granted user {user!r} search permission (setfacl -m u:{user}:x) on {', '.join(granted)}: {why}")
    return granted


def _setfacl(user, directory):
    program = shutil.which(SETFACL) or next(
        (p for p in ("/usr/bin/setfacl", "/bin/setfacl") if os.access(p, os.X_OK)), None)
    if program is None:
        raise AccessError(
            f"user {user!r} cannot enter {directory}, and setfacl is missing to give it search "
            f"permission: apt-get install acl (make system), or chmod o+x {directory}")
    result = subprocess.run([program, "-m", f"u:{user}:x", directory], capture_output=True, text=True,
                            timeout=30, check=False)
    if result.returncode != 0:
        raise AccessError(
            f"user {user!r} cannot enter {directory}, and setfacl -m u:{user}:x failed: "
            f"{(result.stderr or result.stdout).strip()}; give it search permission another way "
            f"(chmod o+x {directory}) or build elsewhere")


def default_entry(user, directory):
    """Give ``user`` read, write and search permission on ``directory``, every directory in
    it and every one made in it later, by anyone: the ACL entry ``u:<user>:rwx`` as a
    default ACL (inherited by what is made inside) of each directory in the tree
    (``setfacl -R -d -m``). The permissions a creator asks for still cap it (a file made 0600
    stays its creator's alone). Raises AccessError when setfacl is missing or fails."""
    program = shutil.which(SETFACL) or next(
        (p for p in ("/usr/bin/setfacl", "/bin/setfacl") if os.access(p, os.X_OK)), None)
    if program is None:
        raise AccessError(f"setfacl is missing to share {directory} with {user!r}: apt-get install acl (make system)")
    result = subprocess.run([program, "-R", "-d", "-m", f"u:{user}:rwx", directory], capture_output=True,
                            text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise AccessError(f"setfacl -R -d -m u:{user}:rwx {directory} failed: "
                          f"{(result.stderr or result.stdout).strip()}")


def own(uid, gid, directories=(), files=(), readable=()):
    """Give user ``uid`` and group ``gid`` (numbers) what a service writes and reads:
    each of ``directories`` (made if missing) with everything in it, recursively; each of
    ``files`` and its rotations (``name.1``, ``name.2.gz``, ...) where its directory
    exists; each of ``readable`` where it exists. Symbolic links are never followed nor
    changed: the tree is walked by directory descriptors (``os.fwalk``, which never enters
    a link, not even one the user swaps in for a directory while the walk runs), every
    change is an ``lchown``; what vanishes meanwhile (a running server's temporary files) is
    skipped. Must run as root; raises OSError when a directory cannot be made or an owner
    cannot be changed."""
    def take(name, dir_fd=None):
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if (info.st_uid, info.st_gid) != (uid, gid) and not stat.S_ISLNK(info.st_mode):
                os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:  # gone since listed: a running ZEO server's temporary file
            pass

    for directory in directories:
        os.makedirs(directory, exist_ok=True)
        take(directory)
        for _, dirs, names, fd in os.fwalk(directory, follow_symlinks=False):
            for item in dirs + names:
                take(item, fd)
    for path in files:
        folder, stem = os.path.split(path)
        if not os.path.isdir(folder):
            continue
        for item in os.listdir(folder):  # the file and its rotations (name.1, name.2.gz, ...)
            if item == stem or item.startswith(stem + "."):
                take(os.path.join(folder, item))
    for path in readable:
        if os.path.lexists(path):
            take(path)


def make_missing(paths, mode):
    """Create each of ``paths`` as an empty file of ``mode`` (before the umask) where it is
    missing and its directory exists: a file a service user must write in a directory root
    keeps, which the user could not create itself. Never through a link, and never over a
    file made meanwhile (``O_NOFOLLOW | O_EXCL``). Leaves existing files alone, a regular file
    made meanwhile too: a process of the same part started at the same moment (the matrix's
    client and its hello server, 28 Nov 2026: FileExistsError on the part's log). Raises
    FileExistsError when what appeared meanwhile is not a regular file (a link)."""
    for path in paths:
        if not os.path.lexists(path) and os.path.isdir(os.path.dirname(path)):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode))
            except FileExistsError:
                if os.path.islink(path) or not os.path.isfile(path):
                    raise


def become(user, layout):
    """Run the rest of this process as system user ``user`` when it runs as root; else
    return at once (not root: it runs as whoever started it, unchanged).

    What a ZEO client's script (``bin/<client>``, every command: console, fg, run, debug)
    calls first when its part has ``service-user``, so that a client root starts by hand
    (``bin/instance run scripts/create_site.py``, the load tools' extra clients) writes its
    blobs, logs and caches as the user the ZEO server runs as, never as root. ``layout``:
    the part's ``{"directories", "files", "readable", "reach"}`` (lists of absolute paths,
    plonedeploy.recipe.service.client_layout): before dropping, the user gets search
    permission on the way to ``reach``, to this interpreter and to every ``sys.path`` entry
    (:func:`grant_search`, which says what it granted on stderr), and owns the directories,
    the log files (made empty, 0640, where missing: their directory may be root's) and the
    read files (:func:`own`). Then the process takes the user's groups, group and uid
    (for good: real, effective and saved), umask :data:`SERVICE_UMASK`, and ``HOME``,
    ``USER`` and ``LOGNAME`` of the user, as ``runuser -u`` sets them; what it starts after
    (Zope's interpreter, the WSGI server) inherits all of it.

    Raises KeyError when the user does not exist, AccessError and OSError as
    :func:`grant_search` and :func:`own`; the process is still root then."""
    if os.geteuid() != 0 or not user:
        return
    entry = pwd.getpwnam(user)
    if entry.pw_uid == 0:
        raise AccessError(f"service-user {user!r} is root: nothing to drop to")
    reach = list(layout.get("reach", ())) + [sys.executable, os.path.realpath(sys.executable)]
    reach += [path for path in sys.path if path and os.path.exists(path)]
    grant_search(user, reach, "it runs this ZEO client", lambda line: print(line, file=sys.stderr, flush=True))
    # A log in a directory root made (an extra build's var/log): made here, as the user
    # could not create it there.
    make_missing(layout.get("files", ()), 0o640)
    own(entry.pw_uid, entry.pw_gid, layout.get("directories", ()), layout.get("files", ()),
        layout.get("readable", ()))
    os.setgroups(os.getgrouplist(user, entry.pw_gid))
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    os.umask(SERVICE_UMASK)
    os.environ.update(HOME=entry.pw_dir, USER=user, LOGNAME=user)
