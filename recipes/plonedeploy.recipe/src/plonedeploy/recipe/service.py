"""The service user's side of a build, as the ``stack`` and ``instance`` recipes lay it out:
what the user runs and owns (:func:`service_layout`, written into stack.json for bin/stack's
:func:`plonedeploy.stack.service.prepare_service`), the part's user checked, each client's
directories, and the way to the build it must be able to search."""
import os
import sys

from plonedeploy.recipe.options import fail, system_user


def service_layout(buildout, name, user, zeo_part, clients):
    """What the service user ``user`` of stack part ``name`` runs and owns, for
    ``stack.json``'s ``service`` (see :func:`contract`): the ZEO server part ``zeo_part``
    (None on RelStorage) and the client parts ``clients`` run as it; it owns the
    directories they write (the ZEO server's Data.fs directory, blob directory and pid-file
    directory; each client's, :func:`client_layout`), their log files, the RelStorage
    passfile the clients read, and ``var/admin-password`` and ``var/editor-password``
    (scripts/create_site.py, which a client script run by root runs as this user, writes the
    generated passwords there); it
    needs to reach the build (:func:`build_reach`). The defaults are those of
    plone.recipe.zeoserver where a part does not set the option.

    Raises zc.buildout.UserError naming ``[name] service-user`` when the user does not exist
    or is root (:func:`check_service_user`), naming ``[<zeoserver>] pid-file`` when the pid
    file lies directly in a directory root keeps (``var/``, the buildout directory): runzeo
    replaces it there.
    """
    check_service_user(name, user)
    top = buildout["buildout"]["directory"]
    var = os.path.join(top, "var")
    directories, files, readable = [], [], []
    file_storage = blob_storage = None
    if zeo_part:
        zeo = buildout[zeo_part]
        storage = zeo.get("file-storage") or os.path.join(var, "filestorage", "Data.fs")
        pid_file = zeo.get("pid-file") or os.path.join(var, f"{zeo_part}.pid")
        if os.path.dirname(pid_file) in (top, var):
            fail(zeo_part, "pid-file", pid_file,
                 f"a file in a directory of its own with [{name}] service-user (runzeo, running as "
                 f"{user!r}, replaces it; var/ itself stays root's), e.g. ${{buildout:directory}}/var/"
                 f"{zeo_part}/{zeo_part}.pid")
        directories += [os.path.dirname(storage), os.path.dirname(pid_file)]
        if zeo.get("blob-storage"):
            directories.append(zeo["blob-storage"])
        file_storage, blob_storage = storage, zeo.get("blob-storage") or None
        files.append(zeo.get("zeo-log") or os.path.join(var, "log", f"{zeo_part}.log"))
    for part in clients:
        client = buildout[part]
        layout = client_layout(buildout, part, client)
        directories += layout["directories"]
        files += layout["files"]
        readable += layout["readable"]
    unique = lambda paths: list(dict.fromkeys(os.path.normpath(p) for p in paths))  # noqa: E731
    return {
        "user": user,
        "processes": ([zeo_part] if zeo_part else []) + list(clients),
        "directories": unique(directories),
        "files": unique(files),
        "readable": unique(readable),
        # Files it must be able to write in directories root keeps, made empty (0600) when
        # missing: scripts/create_site.py fills an empty admin-password (editor-password) file.
        "writable": [os.path.join(var, "admin-password"), os.path.join(var, "editor-password")],
        "reach": build_reach(buildout),
        "file_storage": file_storage,
        "blob_storage": blob_storage,
        # Written by processes of other users too: the shared blob directory, where every ZEO
        # client of this ZEO server writes a new blob's directories itself and the server then
        # moves the file in (a client run as root without service-user, e.g. an older build's).
        "shared": [blob_storage] if blob_storage else [],
    }


def check_service_user(part, user):
    """The ``pwd`` entry of system user ``user``, option ``service-user`` of part ``part``
    (the stack's or a client's). Raises zc.buildout.UserError naming the option when the
    user does not exist or is root (:func:`plonedeploy.recipe.options.system_user`)."""
    return system_user(part, "service-user", user, "an existing system user (make demo creates 'plonedeploy': "
                       "useradd --system --user-group --home-dir /nonexistent --shell /usr/sbin/nologin plonedeploy)")


def client_layout(buildout, part, client):
    """What ZEO client part ``part`` (its options ``client``) writes and reads when it runs
    as a service user: ``{"directories", "files", "readable", "reach"}``, lists of absolute
    paths. Directories: its home ``var/<part>`` (Zope's pid file), Chameleon cache, blob
    directory or RelStorage blob cache, ``TUS_TMP_FILE_DIR``; files: its event and access
    logs; readable: the RelStorage passfile; reach: :func:`build_reach`. The defaults are
    plone.recipe.zope2instance's where the part does not set the option. Used by the stack
    (supervisord's programs) and by the instance recipe (the client's own script, which
    becomes the user when root starts it: plonedeploy.runtime.access.become)."""
    var = os.path.join(buildout["buildout"]["directory"], "var")
    client_var = client.get("var") or var
    directories = [client.get("client-home") or os.path.join(client_var, part)]
    files, readable = [], []
    environment = dict(line.strip().split(None, 1) for line in client.get("environment-vars", "").splitlines()
                       if len(line.split(None, 1)) == 2)
    cache = environment.get("CHAMELEON_CACHE")
    if cache is None:
        cache = client.get("template-cache", "on").strip()
        if cache.lower() in ("on", "1", "true", "enabled"):
            cache = os.path.join(client_var, "cache")
        elif cache.lower() in ("off", "0", "false", "disabled"):
            cache = None
    directories += [d for d in (cache, environment.get("TUS_TMP_FILE_DIR")) if d]
    if client.get("storage") == "relstorage":
        directories.append(client["relstorage-blob-dir"])
        dsn = dict(pair.split("=", 1) for pair in client["relstorage-dsn"].split() if "=" in pair)
        if dsn.get("passfile"):
            readable.append(dsn["passfile"])
    elif client.get("blob-storage"):
        directories.append(client["blob-storage"])
    for option, suffix in (("event-log", ""), ("z2-log", "-access")):
        path = client.get(option) or (client.get("access-log") if option == "z2-log" else None) \
            or os.path.join(client_var, "log", f"{part}{suffix}.log")
        if path.lower() != "disable":
            files.append(path)
    return {"directories": directories, "files": files, "readable": readable, "reach": build_reach(buildout)}


def build_reach(buildout):
    """The paths a service user must be able to reach to run from this build: the buildout
    directory, eggs, develop eggs (and the source directories their ``.egg-link`` files
    name: a build sharing the checkout's develop-eggs), the Python of the ``bin/`` scripts."""
    top = buildout["buildout"]["directory"]
    develop = [os.path.join(top, path) for path in buildout["buildout"].get("develop", "").split()]
    links = buildout["buildout"]["develop-eggs-directory"]
    for link in sorted(os.listdir(links)) if os.path.isdir(links) else ():
        if link.endswith(".egg-link"):
            with open(os.path.join(links, link), encoding="utf-8") as fp:
                develop.append(fp.readline().strip())
    reach = [top, buildout["buildout"]["eggs-directory"], buildout["buildout"]["develop-eggs-directory"],
             *develop, sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix]
    return list(dict.fromkeys(os.path.normpath(p) for p in reach))
