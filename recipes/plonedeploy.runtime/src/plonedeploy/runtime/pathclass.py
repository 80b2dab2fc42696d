"""The path classes of a request (page, json, blob, write): one rule for the client and the judge.

The canary's judge (``loadtests.ab.canary``, issue 29) sorts the requests HAProxy logged into
these classes and judges each apart; the ``delay`` filter (:mod:`plonedeploy.runtime.delay`,
a testing aid) slows the requests of one class. Both must agree on what a page is, so the
rule lives here, where both can import it: a ZEO client's path has this distribution but not
the project's ``loadtests`` (nor numpy, which the judge needs), while the project's .venv has
both (``plonedeploy.runtime`` is an editable install there). Standard library only.
"""
import re

#: The path classes, in report order.
CLASSES = ("page", "json", "blob", "write")
#: Methods that write: what the edge's write lane sends to the backend ``writes``.
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Plone's views that stream a file or an image from the ZODB (blobs), as a path segment.
BLOB_VIEW = re.compile(r"/@@(download|images|display-file)(/|$)")
#: plone.restapi: ``++api++`` anywhere in the path, or a service (one ``@`` and a name, e.g.
#: ``@search``, ``@navigation``; a browser view has two, ``@@``) as a path segment.
JSON_ROUTE = re.compile(r"/(\+\+api\+\+|@[A-Za-z][\w.-]*)(/|$)")


def path_class(method, target):
    """The class of a request from its method and target (a log line's, or a WSGI request's
    path), or None for a line without a request.

    ``write``: a writing method (:data:`WRITE_METHODS`); ``blob``: a Plone file or image view
    (:data:`BLOB_VIEW`); ``json``: plone.restapi (:data:`JSON_ROUTE`); ``page``: anything else
    (HTML pages, and the static resources Zope serves, ``++plone++`` and the like). The log
    has no Accept header: the JSON a client asks for on a page URL (``Accept:
    application/json``, the kit's "@json") counts as a page. The query string is ignored; an
    absolute target (HTTP/2's ``https://host/path``) is read from its path.
    """
    if not method or not target:
        return None
    if method in WRITE_METHODS:
        return "write"
    path = target.split("?", 1)[0]
    if "://" in path:
        path = "/" + path.split("://", 1)[1].partition("/")[2]
    if BLOB_VIEW.search(path):
        return "blob"
    if JSON_ROUTE.search(path):
        return "json"
    return "page"
