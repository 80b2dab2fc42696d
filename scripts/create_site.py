"""Create or check the Plone site and the load-test content; safe to run again.

Run with the ZEO server up (``bin/stack start --no-wait-up`` or ``bin/zeoserver start``)::

    bin/instance run scripts/create_site.py

What it ensures, changing only what differs (a second run prints "unchanged" and commits
nothing):

- a Zope root user ``admin`` with role Manager whose password is ``$PLONEDEPLOY_ADMIN_PASSWORD``
  or, if unset, the contents of ``var/admin-password`` (generated, 32 URL-safe characters,
  mode 0600, on first use, or into the empty file bin/stack hands a service user). The
  password is never printed. Everything below is made as that user, as an operator would
  in a browser, so that the content records it as its creator and owner (see ``as_admin``);
- the Plone site ``Plone`` from the ``classic`` distribution (plone.restapi installed), no
  example content;
- a File ``blob-5mb`` in it holding 5,242,880 random bytes as a ZODB blob (served at
  ``/Plone/blob-5mb/@@download/file``); a file of another size is replaced;
- "plone.restapi: Use REST API" for Anonymous on the site, so the JSON API answers
  anonymous load-test requests;
- the settings of every portlet assignment of the site (``IPortletAssignmentSettings``, the
  portlet's "visible" flag), so that no page view writes: plone.portlets creates them in the
  assignment's annotations the first time a page shows the portlet (the navigation portlet:
  the site's first page view, in every ZEO client at once, wrote and conflicted);
- an empty "Unthemed host names" list (``IThemeSettings.hostnameBlacklist``), so that
  direct requests to a client on 127.0.0.1 get the same themed page as requests through
  HAProxy and both cost the same;
- when the stack has a cache tier (``$PLONEDEPLOY_CACHING_PROXIES``, whitespace-separated
  URLs such as ``http://127.0.0.1:6081``, or else the ``cache`` of ``parts/stack/stack.json``):
  plone.app.caching installed with its ``with-caching-proxy`` profile, caching enabled,
  content pages (``plone.content.itemView``, ``plone.content.folderView``) cached in the proxy
  with ``moderateCaching`` (its ``s-maxage``, 86400 s; browsers revalidate), and purging
  (plone.cachepurging) enabled towards those proxies for the content types of
  ``PURGED_TYPES``: an edit purges the changed pages within a second;
- for the logged-in load test, only with ``PLONEDEPLOY_EDITORS=on`` in the environment (``PLONEDEPLOY_EDITORS=on
  make site``; tests/test_loggedin.py sets it; an Ansible deployment does not, so a production
  site gets no load-test accounts): a folder ``editing`` with ``DOCUMENTS`` (40) Documents
  ``doc-01`` .. ``doc-40`` holding a few paragraphs of text (an existing one is left as the
  load test last saved it), and ``EDITORS`` (10) Plone users ``editor1`` .. ``editor10``
  (global role Member, local role Editor on that folder only) sharing one password:
  ``$PLONEDEPLOY_EDITOR_PASSWORD`` or, if unset, the contents of ``var/editor-password``
  (generated like the admin's, mode 0600, never printed);
- a Dublin Core creator on each of those objects (the site, ``blob-5mb``, ``editing`` and its
  documents): one made without a creator (by this script before it ran as the admin) gets
  ``admin`` (see ``ensure_creators``).

Exit status 0 on success; an exception (with Zope's traceback) otherwise.
"""
import json
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
STACK_JSON = "parts/stack/stack.json"
# Content whose edits purge the proxy (plone.app.caching's default is File, Image and News
# Item only: pages would stay stale for s-maxage).
PURGED_TYPES = ("Plone Site", "Document", "Folder", "Collection", "Event", "News Item", "Link",
                "File", "Image")
# with-caching-proxy maps content views to weakCaching (never stored by the proxy); with a
# purging proxy moderateCaching keeps them there until an edit purges them.
CACHED_RULESETS = ("plone.content.itemView", "plone.content.folderView")
# The logged-in load (loadtests/locustfile.py's "logged-in" shape) edits these: simulated
# user k logs in as editor (k mod EDITORS) + 1 and edits document (k mod DOCUMENTS) + 1, so
# up to DOCUMENTS users never save the same document at once (a ZODB write conflict).
EDITORS = 10
DOCUMENTS = 40
EDITOR_PASSWORD_FILE = "var/editor-password"
EDIT_FOLDER_ID = "editing"
# Ordinary prose, so that the pages, the catalog's text index and the saved versions
# cost what an editor's page costs (not an empty body).
PARAGRAPHS = (
    "This page belongs to the editing load test of the deployment kit. Editors open it, "
    "change a paragraph and save it again, the way a small newsroom works through a day.",
    "A ZEO client renders the page for every editor anew: no cache in front of the site "
    "stores pages for logged-in users, so their requests reach Zope and the database.",
    "Saving the form stores a new version of the page, reindexes its text in the catalog "
    "and purges the cached anonymous copies, if a caching proxy is configured.",
    "The figures the load test prints are ratios of two servers measured side by side, "
    "because the absolute rates on a shared machine drift by a quarter from run to run.",
)


def generated_password(path, env_var, what):
    """Return the password in ``$env_var``, else the contents of the 0600 file ``path``,
    generated (32 URL-safe characters) when the file is missing or empty. Empty: bin/stack,
    run as root with a service user, makes the file empty and that user's (stack.json's
    ``service.writable``), since this script then runs as that user (bin/instance run drops
    to it) and var/ itself stays root's. Never follows a link there; never prints the
    password (only that ``what``'s was generated, and where)."""
    password = os.environ.get(env_var)
    if password:
        return password
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    elif os.path.getsize(path) == 0:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    else:
        fd = None
    if fd is not None:
        with os.fdopen(fd, "w") as fp:
            fp.write(secrets.token_urlsafe(24) + "\n")
        print(f"{what} password generated in {path} (mode 0600)")
    with open(path) as fp:
        return fp.read().strip()


def admin_password(path="var/admin-password"):
    """The admin password (:func:`generated_password`, ``$PLONEDEPLOY_ADMIN_PASSWORD``)."""
    return generated_password(path, "PLONEDEPLOY_ADMIN_PASSWORD", "admin")


def editor_password(path=EDITOR_PASSWORD_FILE):
    """The editors' one password (:func:`generated_password`, ``$PLONEDEPLOY_EDITOR_PASSWORD``)."""
    return generated_password(path, "PLONEDEPLOY_EDITOR_PASSWORD", "editors'")


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


def as_admin(app):
    """Make the Zope root user ADMIN the current user for the rest of the run (AccessControl's
    newSecurityManager; a Manager, so every step may change what it changes).

    Why not the run script's own user: ``bin/instance run`` acts as "System Processes",
    whose id is None, so content made by it has no Dublin Core creator and no owner. Plone
    then adds the first logged-in reader as the creator when anything adapts the item to
    its ownership schema (plone.app.dexterity's ``Ownership.__init__`` calls ``addCreator``),
    e.g. the ZMI listing sizing it (``get_size``) or plone.restapi serializing it: a write on
    a GET, which plone.protect aborts (and redirects an HTML page to ``@@confirm-action``),
    so it happened again on every such GET.
    """
    from AccessControl.SecurityManagement import newSecurityManager

    newSecurityManager(app.REQUEST, app.acl_users.getUser(ADMIN).__of__(app.acl_users))


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


def portlet_assignments(site):
    """Every portlet assignment a page of the site may show (a list): the site's own, which
    every page under it inherits, and the group, content-type and user categories of each
    portlet manager (plone.portlets keeps those in the manager)."""
    from plone.portlets.constants import CONTEXT_CATEGORY
    from plone.portlets.interfaces import IPortletAssignmentMapping, IPortletManager
    from zope.component import getUtilitiesFor, queryMultiAdapter

    found = []
    for _name, manager in getUtilitiesFor(IPortletManager, context=site):
        mapping = queryMultiAdapter((site, manager), IPortletAssignmentMapping)
        if mapping is not None:
            found.extend(mapping.values())
        for category, mappings in manager.items():
            if category != CONTEXT_CATEGORY:
                for mapping in mappings.values():
                    found.extend(mapping.values())
    return found


def ensure_portlet_settings(site):
    """Create the settings of each of :func:`portlet_assignments` that has none; return True
    if any was created. Why: plone.portlets' settings adapter
    (``plone.portlets.settings.portletAssignmentSettingsFactory``) stores new settings, and
    the assignment's annotations, on first use, which is the first page that shows it."""
    from plone.portlets.constants import ASSIGNMENT_SETTINGS_KEY
    from plone.portlets.interfaces import IPortletAssignmentSettings
    from zope.annotation import IAnnotations

    created = 0
    for assignment in portlet_assignments(site):
        if ASSIGNMENT_SETTINGS_KEY not in IAnnotations(assignment):
            IPortletAssignmentSettings(assignment)
            created += 1
    if created:
        print(f"created the settings of {created} portlet assignments (no page view writes them)")
    return bool(created)


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


def caching_proxies(stack_json=STACK_JSON):
    """URLs of the caching proxies to purge (a tuple, empty without a cache tier).

    From ``$PLONEDEPLOY_CACHING_PROXIES`` (whitespace-separated URLs), else from the
    ``cache.url`` of ``parts/stack/stack.json`` (the buildout stack's varnish).
    """
    configured = os.environ.get("PLONEDEPLOY_CACHING_PROXIES")
    if configured is not None:
        return tuple(configured.split())
    try:
        with open(stack_json, encoding="utf-8") as fp:
            cache = json.load(fp).get("cache")
    except OSError:
        return ()
    return (cache["url"],) if cache else ()


def ensure_caching(site, proxies):
    """plone.app.caching with a purging proxy in front (see the module docstring).

    ``proxies``: URLs of the caching proxies; empty: nothing is done. Returns True if
    anything changed.
    """
    if not proxies:
        return False
    from plone import api
    from plone.base.utils import get_installer

    changed = False
    installer = get_installer(site)
    if not installer.is_product_installed("plone.app.caching"):
        installer.install_product("plone.app.caching")
        api.portal.get_tool("portal_setup").runAllImportStepsFromProfile(
            "profile-plone.app.caching:with-caching-proxy")
        print("installed plone.app.caching with its with-caching-proxy profile")
        changed = True
    mapping_key = "plone.caching.interfaces.ICacheSettings.operationMapping"
    mapping = dict(api.portal.get_registry_record(mapping_key) or {})
    wanted = {
        "plone.caching.interfaces.ICacheSettings.enabled": True,
        "plone.cachepurging.interfaces.ICachePurgingSettings.enabled": True,
        "plone.cachepurging.interfaces.ICachePurgingSettings.cachingProxies": tuple(proxies),
        # The proxy keys pages by their public path, which is the physical path here.
        "plone.cachepurging.interfaces.ICachePurgingSettings.virtualHosting": False,
        "plone.app.caching.interfaces.IPloneCacheSettings.purgedContentTypes": PURGED_TYPES,
        mapping_key: {**mapping, **{r: "plone.app.caching.moderateCaching" for r in CACHED_RULESETS}},
    }
    for key, value in wanted.items():
        if api.portal.get_registry_record(key, default=None) != value:
            api.portal.set_registry_record(key, value)
            changed = True
    if changed:
        print(f"caching: content pages kept by {', '.join(proxies)} and purged on edit")
    return changed


def editor_ids():
    """The editors' user ids: ``editor1`` .. ``editor<EDITORS>``."""
    return [f"editor{n}" for n in range(1, EDITORS + 1)]


def document_ids():
    """The editable documents' ids in the folder ``EDIT_FOLDER_ID``: ``doc-01`` .. ``doc-<DOCUMENTS>``."""
    return [f"doc-{n:02d}" for n in range(1, DOCUMENTS + 1)]


def ensure_editing_content(site):
    """The folder ``EDIT_FOLDER_ID`` and its DOCUMENTS Documents with a few paragraphs of
    text each; an existing document is left as it is (the load test edits its text).
    Returns True if anything changed."""
    from plone import api
    from plone.app.textfield.value import RichTextValue

    changed = False
    folder = site.get(EDIT_FOLDER_ID)
    if folder is None:
        folder = api.content.create(container=site, type="Folder", id=EDIT_FOLDER_ID, title="Editing load test")
        print(f"created folder /{SITE_ID}/{EDIT_FOLDER_ID}")
        changed = True
    missing = [doc_id for doc_id in document_ids() if doc_id not in folder.objectIds()]
    for doc_id in missing:
        number = int(doc_id.split("-")[1])
        paragraphs = PARAGRAPHS[number % len(PARAGRAPHS):] + PARAGRAPHS[:number % len(PARAGRAPHS)]
        html = "".join(f"<p>{text}</p>" for text in paragraphs)
        api.content.create(container=folder, type="Document", id=doc_id, title=f"Editing test page {number}",
                           description="A page the logged-in load test edits.",
                           text=RichTextValue(html, "text/html", "text/x-html-safe"))
    if missing:
        print(f"created {len(missing)} documents in /{SITE_ID}/{EDIT_FOLDER_ID}")
    return changed or bool(missing)


def ensure_editors(site, password):
    """Plone users ``editor_ids()`` (global role Member) with ``password``, each with the
    local role Editor on the folder ``EDIT_FOLDER_ID`` only (they may edit there, nowhere
    else). A wrong password is reset. Returns True if anything changed."""
    from plone import api

    folder = site[EDIT_FOLDER_ID]
    source = site.acl_users.source_users
    created, reset, granted = [], [], []
    for user_id in editor_ids():
        if api.user.get(username=user_id) is None:
            # No full name: Plone's personal bar then shows the user id, which the load test checks.
            api.user.create(email=f"{user_id}@example.invalid", username=user_id, password=password,
                            roles=("Member",))
            created.append(user_id)
        elif source.authenticateCredentials({"login": user_id, "password": password}) is None:
            source.userSetPassword(user_id, password)
            reset.append(user_id)
        if "Editor" not in folder.get_local_roles_for_userid(user_id):
            api.user.grant_roles(username=user_id, obj=folder, roles=["Editor"])
            granted.append(user_id)
    if created:
        print(f"created Plone users {', '.join(created)} (password in {EDITOR_PASSWORD_FILE} or "
              "$PLONEDEPLOY_EDITOR_PASSWORD)")
    if reset:
        print(f"updated the password of {', '.join(reset)}")
    if granted:
        folder.reindexObjectSecurity()
        print(f"granted Editor on /{SITE_ID}/{EDIT_FOLDER_ID} to {', '.join(granted)}")
    return bool(created or reset or granted)


def ensure_creators(site):
    """Give the site and the content this script makes (BLOB_ID, EDIT_FOLDER_ID and its
    documents, those that exist) the Dublin Core creator ADMIN where they have none (made
    before the script ran as the admin: see ``as_admin`` for the write on read that causes);
    a creator already there (e.g. an editor of the load test) is kept. Only these objects:
    a production site's own content is not this script's. Returns True if anything changed."""
    folder = site.get(EDIT_FOLDER_ID)
    objects = [site, site.get(BLOB_ID), folder]
    if folder is not None:
        objects += [folder.get(doc_id) for doc_id in document_ids()]
    fixed = []
    for obj in objects:
        if obj is not None and not obj.listCreators():
            obj.setCreators((ADMIN,))
            obj.reindexObject(idxs=["Creator"])
            fixed.append("/".join(obj.getPhysicalPath()))
    if fixed:
        print(f"set the creator {ADMIN} on {len(fixed)} objects that had none ({fixed[0]} ...)")
    return bool(fixed)


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
    as_admin(app)
    site, created = ensure_site(app)
    changed = _commit_if(created, "site") or changed
    setSite(site)
    changed = _commit_if(ensure_blob(site), "blob") or changed
    changed = _commit_if(ensure_theming_blacklist(site), "theming") or changed
    changed = _commit_if(ensure_anonymous_restapi(site), "restapi permission") or changed
    changed = _commit_if(ensure_caching(site, caching_proxies()), "caching") or changed
    if os.environ.get("PLONEDEPLOY_EDITORS") == "on":
        changed = _commit_if(ensure_editing_content(site), "editing content") or changed
        changed = _commit_if(ensure_editors(site, editor_password()), "editors") or changed
    changed = _commit_if(ensure_creators(site), "creators") or changed
    # Last: the editors' dashboards (made with their accounts) have portlets too.
    changed = _commit_if(ensure_portlet_settings(site), "portlet settings") or changed
    print("site ready: committed" if changed else "site ready: unchanged")


if __name__ == "__main__" or "app" in globals():
    main(app)  # noqa: F821 -- 'app' is the Zope root, bound by 'bin/instance run'
    sys.exit(0)
