"""Create or check the Plone site and the load-test content; safe to run again.

Run with the ZEO server up (``bin/stack start --no-wait-up`` or ``bin/zeoserver start``)::

    bin/instance run scripts/create_site.py

What it ensures, changing only what differs (a second run prints "unchanged" and commits
nothing):

- a Zope root user ``admin`` with role Manager whose password is ``$PLONEDEPLOY_ADMIN_PASSWORD``
  or, if unset, the contents of ``var/admin-password`` (generated, 32 URL-safe characters,
  mode 0600, on first use). The password is never printed;
- the Plone site ``Plone`` from the ``classic`` distribution (plone.restapi installed), no
  example content;
- a File ``blob-5mb`` in it holding 5,242,880 random bytes as a ZODB blob (served at
  ``/Plone/blob-5mb/@@download/file``); a file of another size is replaced;
- "plone.restapi: Use REST API" for Anonymous on the site, so the JSON API answers
  anonymous load-test requests;
- an empty "Unthemed host names" list (``IThemeSettings.hostnameBlacklist``), so that
  direct requests to a client on 127.0.0.1 get the same themed page as requests through
  HAProxy and both cost the same.

Exit status 0 on success; an exception (with Zope's traceback) otherwise.
"""
import os
import secrets
import sys

import transaction
from Testing.makerequest import makerequest
from zope.component.hooks import setSite

SITE_ID = "Plone"
BLOB_ID = "blob-5mb"
BLOB_SIZE = 5 * 1024 * 1024  # 5 MiB = 5,242,880 bytes
ADMIN = "admin"
THEME_BLACKLIST = "plone.app.theming.interfaces.IThemeSettings.hostnameBlacklist"
RESTAPI_PERMISSION = "plone.restapi: Use REST API"


def admin_password(path="var/admin-password"):
    """Return the admin password from the environment or the 0600 file (created if missing)."""
    password = os.environ.get("PLONEDEPLOY_ADMIN_PASSWORD")
    if password:
        return password
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fp:
            fp.write(secrets.token_urlsafe(24) + "\n")
        print(f"admin password generated in {path} (mode 0600)")
    with open(path) as fp:
        return fp.read().strip()


def ensure_admin(app, password):
    """Create or update the root Manager ``admin``; return True if anything changed."""
    users = app.acl_users
    if users.getUser(ADMIN) is None:
        users._doAddUser(ADMIN, password, ["Manager"], [])
        print(f"created Zope root user {ADMIN}")
        return True
    if users.authenticate(ADMIN, password, app.REQUEST) is None:
        users._doChangeUser(ADMIN, password, ["Manager"], [])
        print(f"updated the password of Zope root user {ADMIN}")
        return True
    return False


def ensure_site(app):
    """Create the classic Plone site if it is missing; return (site, changed)."""
    if SITE_ID in app.objectIds():
        return app[SITE_ID], False
    from plone.distribution.api import site as site_api

    answers = {
        "site_id": SITE_ID,
        "title": "Plone",
        "description": "plonedeploy load-test site",
        "default_language": "en",
        "portal_timezone": "UTC",
        "setup_content": False,
    }
    site = site_api.create(app, "classic", answers)
    print(f"created Plone site /{SITE_ID} (classic distribution)")
    return site, True


def ensure_blob(site):
    """Create the 5 MiB blob File (or replace one of the wrong size); return True if changed."""
    from plone import api
    from plone.namedfile.file import NamedBlobFile

    existing = site.get(BLOB_ID)
    if existing is not None:
        if existing.file is not None and existing.file.getSize() == BLOB_SIZE:
            return False
        api.content.delete(obj=existing)
        print(f"replacing /{SITE_ID}/{BLOB_ID}: wrong size")
    blob = NamedBlobFile(
        data=secrets.token_bytes(BLOB_SIZE),
        filename="blob-5mb.bin",
        contentType="application/octet-stream",
    )
    api.content.create(container=site, type="File", id=BLOB_ID, title="5 MiB blob", file=blob)
    print(f"created /{SITE_ID}/{BLOB_ID} ({BLOB_SIZE} bytes, ZODB blob)")
    return True


def ensure_theming_blacklist(site):
    """Empty the unthemed host names; return True if changed."""
    from plone import api

    if not api.portal.get_registry_record(THEME_BLACKLIST, default=None):
        return False
    api.portal.set_registry_record(THEME_BLACKLIST, [])
    print("cleared the unthemed host names (theming applies on every host)")
    return True


def ensure_anonymous_restapi(site):
    """Let anonymous visitors read the JSON API (``Accept: application/json``, ``++api++``).

    The classic distribution grants "plone.restapi: Use REST API" to logged-in roles only;
    the load tests read ``/Plone`` as JSON anonymously. Returns True if changed.
    """
    roles = {r["name"] for r in site.rolesOfPermission(RESTAPI_PERMISSION) if r["selected"]}
    if "Anonymous" in roles:
        return False
    acquire = bool(site.acquiredRolesAreUsedBy(RESTAPI_PERMISSION))
    site.manage_permission(RESTAPI_PERMISSION, sorted(roles | {"Anonymous"}), acquire=acquire)
    print(f"granted '{RESTAPI_PERMISSION}' to Anonymous on /{SITE_ID}")
    return True


def _commit_if(changed, note):
    """Commit the step's changes (each step in its own transaction), or abort."""
    if changed:
        transaction.get().note(f"plonedeploy create_site: {note}")
        transaction.commit()
    else:
        transaction.abort()
    return changed


def main(app):
    app = makerequest(app)
    # One transaction per step: site creation starts transactions of its own, which
    # would silently drop changes made before it in the same transaction.
    changed = _commit_if(ensure_admin(app, admin_password()), "admin user")
    site, created = ensure_site(app)
    changed = _commit_if(created, "site") or changed
    setSite(site)
    # Creating content needs a Manager; 'run' scripts have no authenticated user.
    from plone import api

    with api.env.adopt_roles(["Manager"]):
        changed = _commit_if(ensure_blob(site), "blob") or changed
    changed = _commit_if(ensure_theming_blacklist(site), "theming") or changed
    changed = _commit_if(ensure_anonymous_restapi(site), "restapi permission") or changed
    print("site ready: committed" if changed else "site ready: unchanged")


if __name__ == "__main__" or "app" in globals():
    main(app)  # noqa: F821 -- 'app' is the Zope root, bound by 'bin/instance run'
    sys.exit(0)
