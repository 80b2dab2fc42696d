"""What a service user needs before bin/stack's supervisord starts its programs as it: its
directories, logs and files, search permission on the way to the build, an empty Data.fs on a
fresh build; and varnishd's jail users' way to the VCL."""

import os
import pwd

from plonedeploy.runtime import access
from plonedeploy.stack.errors import StackError


#: supervisord's umask, which its programs inherit: what they create is theirs and their
#: group's to read, nobody else's (logs, Data.fs, blobs, caches). The same as a client
#: script's that dropped to the service user (plonedeploy.runtime.access.become).
UMASK = format(access.SERVICE_UMASK, "03o")
#: Mode of the log directory with a service user: root's and its group's (the service user
#: writes its own logs there), sticky: neither may remove or replace the other's files. root
#: (supervisord) writes every program's stdout log there; the service user must not be able
#: to swap one of those for a symbolic link to a file of root's.
LOG_DIRECTORY_MODE = 0o1770


#: What ``bin/stack start`` says on stderr when root starts a stack without a service user.
ROOT_WARNING = ("bin/stack: warning: running as root without [{part}] service-user: the ZEO server and the "
                "ZEO clients run as root. Set service-user = plonedeploy (an unprivileged system user; "
                "make build SERVICE_USER=plonedeploy) and run bin/buildout again (docs/how-to/operate.md#users).")


def service_users(config):
    """``{process name: user}`` for the processes that supervisord runs as another user:
    the ``service`` processes of ``config`` as its service user, and each process with a
    ``user`` of its own (varnish's exporter as varnishlog), when this process runs as root;
    else none (supervisord started by anyone else cannot change user, and runs everything
    as that one)."""
    if os.geteuid() != 0:
        return {}
    users = {proc["name"]: proc["user"] for proc in config["processes"] if proc.get("user")}
    service = config.get("service")
    if service:
        users.update({name: service["user"] for name in service["processes"]})
    return users


def prepare_service(config, say=None):
    """As root with a service user: give it what it needs before its programs start. The
    directories it writes are made and owned by it (recursively: files that root wrote
    meanwhile, e.g. by bin/restore or bin/instance fg, become its own again); its log files
    (and their rotations) and the files it reads (the RelStorage passfile) too, where they
    exist; the files it writes in root's directories (``writable``: var/admin-password,
    var/editor-password) are made empty (0600) when missing and are its own; the log
    directory becomes root's and its group's, sticky (:data:`LOG_DIRECTORY_MODE`),
    and root's own logs in it (supervisord.log, every program's stdout log) are made plain
    files of root's, so that supervisord never opens a link the service user put there;
    and it gets search permission on the way to the build (:func:`access.grant_search`).
    Symbolic links are never followed (``lchown``). Does nothing without a service user or
    when not root. ``say``: prints what it did (default print). Raises StackError when the
    user is missing or cannot reach the build."""
    service = config.get("service")
    if not service or os.geteuid() != 0:
        return
    say = say or (lambda line: print(line, flush=True))
    user = service["user"]
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise StackError(f"service-user {user!r} does not exist (make demo creates 'plonedeploy'); "
                         "create it or build without service-user") from None
    uid, gid = entry.pw_uid, entry.pw_gid
    log_dir = config["log_dir"]
    os.makedirs(log_dir, exist_ok=True)
    os.chown(log_dir, 0, gid)
    os.chmod(log_dir, LOG_DIRECTORY_MODE)
    for name in ["supervisord"] + [p["name"] for p in config["processes"]]:
        path = os.path.join(log_dir, "supervisord.log" if name == "supervisord" else f"{name}.stdout.log")
        info = os.lstat(path) if os.path.lexists(path) else None
        if info is not None and (not os.path.isfile(path) or os.path.islink(path) or info.st_uid != 0):
            os.unlink(path)  # root may, in its sticky directory; a link or foreign file is not ours
            info = None
        if info is None:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640))
    access.make_missing(service.get("writable", []), 0o600)
    access.own(uid, gid, service["directories"], service["files"],
               service["readable"] + service.get("writable", []))
    _new_file_storage(service, uid, gid, say)
    for directory in service.get("shared", []):
        # A default ACL: the directories a root client makes in there are the service user's
        # to write too (ZODB makes them with the creator's umask; its blob files are 0444).
        try:
            access.default_entry(user, directory)
        except access.AccessError as exc:
            raise StackError(f"service-user {user!r}: {exc}") from exc
    try:
        access.grant_search(user, service["reach"], "it runs ZEO and the ZEO clients from this build", say)
    except (access.AccessError, OSError) as exc:
        raise StackError(f"service-user {user!r}: {exc}") from exc


def prepare_jail(config, say=None):
    """As root with varnishd in a ``unix`` jail (the cache's ``jail_users``, and its
    ``exporter_user`` that reads the shared memory): give each of those users search
    permission on the way to the VCL and the working directory
    (:func:`access.grant_search`; a checkout under a mode-0700 directory stops them there).
    Does nothing else, and nothing when not root or without such a jail. ``say``: prints
    what it granted (default print). Raises StackError when a user cannot reach them."""
    cache = config.get("cache") or {}
    if os.geteuid() != 0 or not cache.get("jail_users"):
        return
    for user in cache["jail_users"] + ([cache["exporter_user"]] if cache.get("exporter_user") else []):
        try:
            access.grant_search(user, [cache["workdir"], cache["vcl"]], "varnishd's jail runs as it",
                                say or (lambda line: print(line, flush=True)))
        except (access.AccessError, OSError, KeyError) as exc:
            raise StackError(f"varnish jail user {user!r}: {exc}") from exc


#: The first bytes of a FileStorage (ZODB._compat.FILESTORAGE_MAGIC, FileStorage's
#: packed_version: "FS30" on Python 3; "FS21" was Python 2's, which ZODB 6 refuses with
#: FileStorageFormatError): what FileStorage itself writes into a new Data.fs, an empty database.
FILE_STORAGE_MAGIC = b"FS30"


def _new_file_storage(service, uid, gid, say):
    """A fresh build: no Data.fs yet. FileStorage would create it and first remove and make
    again the blob directory, whose parent (``var/``) stays root's, so the ZEO server, run as
    the service user, could do neither. Write the empty database FileStorage would write,
    owned by the service user; with blobs of an earlier database in the blob directory,
    refuse (FileStorage would delete them) and say what to do. Raises StackError."""
    path, blobs = service.get("file_storage"), service.get("blob_storage")
    if not path or os.path.lexists(path):
        return
    if blobs and os.path.isdir(blobs) and set(os.listdir(blobs)) - {".layout", "tmp"}:
        raise StackError(f"{path} is missing but {blobs} holds blobs: restore the Data.fs (bin/restore) "
                         f"or remove {blobs} to start with an empty database")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    with os.fdopen(fd, "wb") as fp:
        fp.write(FILE_STORAGE_MAGIC)
    os.chown(path, uid, gid)
    say(f"zeoserver: new empty database {path}")
