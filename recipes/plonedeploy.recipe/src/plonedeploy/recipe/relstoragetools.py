"""``plonedeploy.recipe:relstorage-tools`` -- the configs of RelStorage's ``zodbconvert`` and ``zodbpack``.

RelStorage's own scripts take a ZConfig file naming the storages; this part writes those
files for the RelStorage clients of this buildout (relstorage.cfg; docs/how-to/relstorage.md),
so the migration from ZEO's FileStorage and the packing run against exactly the database
and blob mode the clients use. The scripts themselves, ``bin/zodbconvert`` and ``bin/zodbpack``,
are RelStorage's console scripts, which the client parts generate from their ``RelStorage``
egg (plone.recipe.zope2instance writes the console scripts of its eggs)::

    bin/zodbconvert parts/relstorage-tools/zodbconvert.conf     # Data.fs + blobs -> PostgreSQL
    bin/zodbpack -d 7 parts/relstorage-tools/zodbpack.conf     # drop history older than 7 days

Options:

``client``
    The ``plonedeploy.recipe:instance`` part with ``storage = relstorage`` whose
    ``relstorage-dsn``, ``relstorage-blobs`` and ``relstorage-blob-dir`` the files use;
    default ``instance``.
``relstorage-dsn``
    The database to convert into and to pack; default the client's. A libpq key=value DSN
    with ``dbname`` and without ``password`` (``options.parse_dsn``): the files are
    world-readable like zope.conf, the password stays in the DSN's 0600 ``passfile``.
``file-storage``
    Required: the FileStorage ``zodbconvert`` reads (relstorage.cfg:
    ``${zeoserver:file-storage}``, ``var/filestorage/Data.fs``), an absolute path. It is
    opened read-only, which takes no lock: stop the ZEO server first, or what it writes
    after the copy began is lost.
``blob-storage``
    The FileStorage's blob directory (relstorage.cfg: ``${zeoserver:blob-storage}``), an
    absolute path; empty: a FileStorage without blobs.

Where the blobs go: with the client's ``relstorage-blobs = database`` into PostgreSQL, through
a blob cache of the tools' own in ``var/blobcache/<part>`` (a cache: the clients must not
share one with a pack that runs beside them; after a conversion it holds a copy of every
blob and can be deleted); with ``shared-directory`` into the clients' shared
``relstorage-blob-dir``, which then needs its own backup.

Output: ``parts/<part>/zodbconvert.conf`` (``<filestorage source>``, ``<relstorage
destination>``) and ``parts/<part>/zodbpack.conf`` (one ``<relstorage>`` with ``pack-gc
true``). Both name the DSN's ``passfile``, never a password. Errors:
``zc.buildout.UserError`` naming part, option, value and what is allowed.
"""
import os

import zc.buildout

from plonedeploy.recipe.options import RELSTORAGE_BLOBS, fail, parse_dsn
from plonedeploy.recipe.optiontables import INSTANCE, RELSTORAGE_TOOLS, DeclaredOptions



def relstorage_section(name, dsn, blob_dir, shared_blob_dir, extra=()):
    """A ZConfig ``<relstorage [name]>`` section for PostgreSQL, as text (4-space indent).

    ``dsn``: a DSN checked by ``options.parse_dsn``; ``blob_dir``: RelStorage's ``blob-dir``;
    ``shared_blob_dir``: ``"true"`` or ``"false"`` (``options.RELSTORAGE_BLOBS``);
    ``extra``: further ``key value`` lines of the section.
    """
    lines = [f"<relstorage{' ' + name if name else ''}>",
             f"    blob-dir {blob_dir}",
             f"    shared-blob-dir {shared_blob_dir}",
             *(f"    {line}" for line in extra),
             "    <postgresql>",
             f"        dsn {dsn}",
             "    </postgresql>",
             "</relstorage>"]
    return "\n".join(lines) + "\n"


def zodbconvert_config(file_storage, blob_storage, destination):
    """``zodbconvert``'s config: FileStorage ``file_storage`` (read-only, blobs in
    ``blob_storage`` or none when empty) as source, ``destination`` (a
    :func:`relstorage_section` named ``destination``) as destination."""
    source = ["<filestorage source>", f"    path {file_storage}", "    read-only true"]
    if blob_storage:
        source.append(f"    blob-dir {blob_storage}")
    source.append("</filestorage>")
    return "\n".join(source) + "\n\n" + destination


class Recipe:
    """The relstorage-tools part; see the module docstring for its options."""

    def __init__(self, buildout, name, options):
        self.buildout, self.name, self.options = buildout, name, options
        # Reads go through the table (an undeclared option raises); writes to options.
        opts = DeclaredOptions(name, options, RELSTORAGE_TOOLS)
        client = opts.setdefault("client").strip()
        try:
            client_options = DeclaredOptions(client, buildout[client], INSTANCE)
        except KeyError:  # zc.buildout's MissingSection
            client_options = None
        if client_options is None or client_options.get("storage", "").strip() != "relstorage":
            fail(name, "client", client,
                 "a plonedeploy.recipe:instance part with storage = relstorage")
        dsn = opts.setdefault("relstorage-dsn", client_options["relstorage-dsn"])
        parse_dsn(name, "relstorage-dsn", dsn)
        self.dsn = " ".join(dsn.split())
        self.file_storage = opts.get("file-storage", "").strip()
        if not self.file_storage:
            raise zc.buildout.UserError(
                f"[{name}] file-storage is required: the Data.fs zodbconvert reads, e.g. "
                "${zeoserver:file-storage}")
        self.blob_storage = opts.get("blob-storage", "").strip()
        for key, value in (("file-storage", self.file_storage), ("blob-storage", self.blob_storage)):
            if value and not os.path.isabs(value):
                fail(name, key, value, "an absolute path")
        self.shared_blob_dir = RELSTORAGE_BLOBS[client_options["relstorage-blobs"]]
        if self.shared_blob_dir == "true":
            # The blobs are files of the one directory every client mounts: write them there.
            self.blob_dir = client_options["relstorage-blob-dir"]
        else:
            self.blob_dir = os.path.join(buildout["buildout"]["directory"], "var", "blobcache", name)
        location = os.path.join(buildout["buildout"]["parts-directory"], name)
        options["location"] = location
        options["zodbconvert-config"] = os.path.join(location, "zodbconvert.conf")
        options["zodbpack-config"] = os.path.join(location, "zodbpack.conf")

    def install(self):
        """Write ``zodbconvert.conf`` and ``zodbpack.conf`` into ``parts/<part>``."""
        os.makedirs(self.options["location"], exist_ok=True)
        header = (f"# Written by bin/buildout ([{self.name}], plonedeploy.recipe:relstorage-tools); "
                  "docs/how-to/relstorage.md.\n")
        convert = zodbconvert_config(
            self.file_storage, self.blob_storage,
            relstorage_section("destination", self.dsn, self.blob_dir, self.shared_blob_dir))
        pack = relstorage_section("", self.dsn, self.blob_dir, self.shared_blob_dir, ("pack-gc true",))
        for key, text, usage in (
                ("zodbconvert-config", convert, "bin/zodbconvert [--dry-run] {path}"),
                ("zodbpack-config", pack, "bin/zodbpack -d DAYS {path}")):
            path = self.options[key]
            with open(path, "w", encoding="utf-8") as fp:
                fp.write(header + "# " + usage.format(path=path) + "\n" + text)
        return [self.options["location"]]

    update = install
