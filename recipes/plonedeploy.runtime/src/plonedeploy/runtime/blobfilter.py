"""WSGI filter ``blobsendfile``: whole-file ZODB blob downloads go to the server's
``wsgi.file_wrapper`` as a real file, so that pyruvate serves them with ``sendfile(2)``.

Why it is needed (Zope 6.3, plone.namedfile 8.1.1, pyruvate 1.6.1, waitress 3.0.2):

- ``@@download`` (``plone.namedfile.browser.Download``) returns a
  ``plone.namedfile.utils.filestream_range_iterator``: an ``IStreamIterator`` that owns an
  ``io.FileIO`` of the committed blob (``_io``) and has ``read()``, but no ``fileno()``.
- ``ZPublisher.WSGIPublisher.publish_module`` calls ``start_response``, then, because the body
  provides ``IUnboundStreamIterator`` and has ``read``, returns
  ``environ['wsgi.file_wrapper'](body)``. So Zope does use the server's file wrapper, for
  Zope's own ``filestream_iterator`` (an ``io.FileIO``) and for this iterator alike; the
  difference is that this iterator has no ``fileno()``.
- pyruvate's ``FileWrapper`` calls ``fileno()`` once. With a descriptor it ``sendfile``\\ s
  from offset 0 up to the response's ``Content-Length``; without one it calls ``read(-1)``:
  the whole blob (5 MiB) becomes one ``bytes`` object per response, held until the response
  is written.
- waitress' ``ReadOnlyFileBasedBuffer`` streams a *seekable* file (``seekable``, ``seek``,
  ``tell``) from its channel; anything else is iterated with ``read(32768)`` in the worker
  thread and copied into the channel's output buffer (a temporary file above 1 MiB). waitress
  never uses ``sendfile``.

What the filter does: while the application runs, ``environ['wsgi.file_wrapper']`` is a
function of the filter. For a **whole-file** response (below) it returns a placeholder
iterable instead of calling the server's wrapper; when the application hands that very
placeholder back, the filter returns ``server_file_wrapper(BlobFile(iterator))``: the server's
own wrapper around a small file object with the iterator's descriptor (``fileno``,
``read``, ``seek``, ``tell``, ``seekable``) whose ``close()`` closes the iterator. If a
middleware between the filter and the application wrapped the placeholder in an iterable of
its own (Sentry, a profiler), the placeholder is iterated like the normal path (the server's
wrapper around the original iterator): a pyruvate ``FileWrapper`` that holds a descriptor must
never be iterated from Python (it yields ``b""`` until the server's ``sendfile`` finishes,
i.e. forever).

Whole-file means all of these, checked after ``start_response`` (Zope calls it before the
file wrapper) and again at the hand-over:

- request method ``GET``; response status ``200``; no ``Content-Range``, no
  ``Content-Encoding``;
- the iterator has the shape of ``filestream_range_iterator``: an open ``io.FileIO`` as
  ``_io``, ``start == 0``, ``end`` None or the file's size, file position 0;
- ``Content-Length`` equals the file's size (``fstat``).

Anything else (``Range`` requests answered 206, ``If-Range``, ``HEAD``, other iterables,
uncommitted blobs returned as bytes, a server without ``wsgi.file_wrapper``) takes exactly
the path it takes without the filter. Ranges must: pyruvate's ``sendfile`` starts at offset
0 whatever the file position.

In a PasteDeploy pipeline (``plonedeploy.recipe:instance`` writes this when
``blob-sendfile = on``, the default), first, so that nothing between the server and the
filter can wrap the server's file wrapper::

    [filter:blobsendfile]
    use = egg:plonedeploy.runtime#blobsendfile

    [pipeline:main]
    pipeline = blobsendfile translogger egg:Zope#httpexceptions zope

Each hand-over is logged at DEBUG level on the logger ``plonedeploy.blobfilter`` and counted
in ``BlobSendfile.handed_over``.
"""
import io
import logging
import os

logger = logging.getLogger("plonedeploy.blobfilter")

_FALSE = ("0", "false", "no", "off")


class BlobFile:
    """The file of a whole-file blob iterator, as handed to the server's ``wsgi.file_wrapper``.

    ``fileno`` lets pyruvate use ``sendfile(2)``; ``seekable``/``seek``/``tell``/``read`` let
    waitress stream it from its channel; other wrappers (``wsgiref``) just ``read(blksize)``.
    ``close()`` closes the application's iterator and the file; the server calls it through
    its wrapper's ``close()`` when the response is done or the client went away.
    """

    __slots__ = ("iterator", "raw")

    def __init__(self, iterator, raw):
        self.iterator = iterator
        self.raw = raw

    def fileno(self):
        return self.raw.fileno()

    def read(self, size=-1):
        return self.raw.read(size)

    def readinto(self, buffer):
        return self.raw.readinto(buffer)

    def seekable(self):
        return self.raw.seekable()

    def seek(self, offset, whence=os.SEEK_SET):
        return self.raw.seek(offset, whence)

    def tell(self):
        return self.raw.tell()

    @property
    def closed(self):
        return self.raw.closed

    def close(self):
        try:
            close = getattr(self.iterator, "close", None)
            if close is not None:
                close()
        finally:
            self.raw.close()

    def __repr__(self):
        fd = "closed" if self.raw.closed else self.raw.fileno()
        return f"<BlobFile fd={fd} of {type(self.iterator).__name__}>"


class _Pending:
    """What the application gets from ``wsgi.file_wrapper`` for a whole-file blob.

    Handed back unchanged, it is replaced by the server's wrapper around a ``BlobFile``. If
    something iterates it instead (a middleware wrapped it), it behaves as the normal path:
    the server's wrapper around the original iterator, created on first use.
    """

    __slots__ = ("filelike", "server_wrapper", "args", "kwargs", "normal")

    def __init__(self, filelike, server_wrapper, args, kwargs):
        self.filelike = filelike
        self.server_wrapper = server_wrapper
        self.args = args
        self.kwargs = kwargs
        self.normal = None

    def _normal(self):
        if self.normal is None:
            self.normal = self.server_wrapper(self.filelike, *self.args, **self.kwargs)
        return self.normal

    def __iter__(self):
        return iter(self._normal())

    def close(self):
        if self.normal is not None:
            target = self.normal
        else:
            target = self.filelike
        close = getattr(target, "close", None)
        if close is not None:
            close()


def _header(headers, name):
    """The value of header ``name`` (case-insensitive) in a WSGI header list, or None."""
    name = name.lower()
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def whole_file(filelike, status, headers):
    """Return the ``io.FileIO`` behind ``filelike`` if the response is the whole file, else None.

    ``status`` and ``headers`` are what the application passed to ``start_response``
    (``status`` None: not called yet, the answer is None).
    """
    if status is None or not status.startswith("200"):
        return None
    raw = getattr(filelike, "_io", None)
    if not isinstance(raw, io.FileIO) or raw.closed or not raw.readable():
        return None
    if getattr(filelike, "start", None) != 0:
        return None
    if _header(headers, "Content-Range") is not None or _header(headers, "Content-Encoding") is not None:
        return None
    try:
        length = int(_header(headers, "Content-Length"))
        size = os.fstat(raw.fileno()).st_size
        position = raw.tell()
    except (TypeError, ValueError, OSError):
        return None
    end = getattr(filelike, "end", None)
    if end is not None and end != size:
        return None
    if position != 0 or length != size:
        return None
    return raw


class BlobSendfile:
    """The WSGI middleware; see the module docstring.

    ``enabled`` false makes it a pass-through (the recipe leaves it out of the pipeline
    instead). ``handed_over`` counts the responses given to the server as a file.
    """

    def __init__(self, app, enabled=True):
        self.app = app
        self.enabled = enabled
        self.handed_over = 0

    def __call__(self, environ, start_response):
        server_wrapper = environ.get("wsgi.file_wrapper")
        if not self.enabled or server_wrapper is None or environ.get("REQUEST_METHOD") != "GET":
            return self.app(environ, start_response)

        started = []  # [status, headers] once the application called start_response
        pending = []  # the _Pending objects given to the application

        def capture_start_response(status, headers, exc_info=None):
            started[:] = [status, headers]
            if exc_info is not None:
                return start_response(status, headers, exc_info)
            return start_response(status, headers)

        def file_wrapper(filelike, *args, **kwargs):
            if started and whole_file(filelike, *started) is not None:
                placeholder = _Pending(filelike, server_wrapper, args, kwargs)
                pending.append(placeholder)
                return placeholder
            return server_wrapper(filelike, *args, **kwargs)

        environ["wsgi.file_wrapper"] = file_wrapper
        try:
            result = self.app(environ, capture_start_response)
        finally:
            environ["wsgi.file_wrapper"] = server_wrapper

        if not started:
            return result
        if any(result is p for p in pending):
            filelike, args, kwargs = result.filelike, result.args, result.kwargs
            raw = whole_file(filelike, *started)
            if raw is None:
                return result._normal()
        elif not isinstance(result, (list, tuple, bytes)) and hasattr(result, "_io"):
            # The iterator itself, returned without the file wrapper.
            filelike, args, kwargs = result, (), {}
            raw = whole_file(filelike, *started)
            if raw is None:
                return result
        else:
            return result
        self.handed_over += 1
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s: %s handed to %r as fd %d, %s bytes", environ.get("PATH_INFO"),
                         type(filelike).__name__, server_wrapper, raw.fileno(),
                         _header(started[1], "Content-Length"))
        return server_wrapper(BlobFile(filelike, raw), *args, **kwargs)


def filter_factory(global_conf, enabled="true"):
    """PasteDeploy ``paste.filter_factory`` (``use = egg:plonedeploy.runtime#blobsendfile``).

    ``enabled = false`` (or 0, no, off) makes the filter a pass-through.
    """
    on = str(enabled).strip().lower() not in _FALSE

    def make_filter(app):
        return BlobSendfile(app, enabled=on)

    return make_filter
