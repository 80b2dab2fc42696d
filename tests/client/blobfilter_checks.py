"""Checks of the ``blobsendfile`` WSGI filter (``plonedeploy.runtime.blobfilter``) against the
real classes of the ZEO client's eggs: plone.namedfile's ``filestream_range_iterator``, Zope's
``filestream_iterator``, pyruvate's ``FileWrapper``, waitress' ``ReadOnlyFileBasedBuffer``.

Run in the client's own interpreter, which puts the client's eggs on its path itself (as
root it first becomes the service user, who cannot write into pytest's temporary
directories: the checks make their files with ``tempfile``)::

    parts/instance/bin/interpreter tests/client/blobfilter_checks.py

tests/test_blobfilter.py runs it once and asserts each check's result. Standard library,
the client's eggs and plonedeploy.runtime only. Each check is a function of plain
``assert``\\ s, given a fresh blob file; the script runs them all, catches each one's
exception, and prints one JSON object on stdout: ``{check name: "ok" or the traceback}``
(what the checks print goes to stderr). It exits 0 when it ran every check, whatever their
results.

The application is the end of ``ZPublisher.WSGIPublisher.publish_module`` (Zope 6.3):
``start_response`` first, then ``environ['wsgi.file_wrapper'](body)`` for a body with ``read``.
The server's ``wsgi.file_wrapper`` is ``Recorder``: it records what it was given and is the
standard library's ``wsgiref.util.FileWrapper``.
"""
import contextlib
import functools
import hashlib
import importlib
import json
import logging
import os
import sys
import tempfile
import traceback
import wsgiref.util

from plonedeploy.runtime import blobfilter

SIZE = 3 * 65536 + 12345  # not a multiple of any block size

#: ``{check name: function(blob)}`` in the order they run; ``blob`` is ``(path, bytes)`` of a
#: real file standing for a committed ZODB blob, new for each check.
CHECKS = {}


def check(function):
    """Register ``function`` as the check named after it."""
    CHECKS[function.__name__] = function
    return function


def egg_module(name):
    """Module ``name`` of the client's eggs (ImportError outside the client's interpreter)."""
    return importlib.import_module(name)


def range_iterator_class():
    """plone.namedfile's iterator class, what @@download returns."""
    return egg_module("plone.namedfile.utils").filestream_range_iterator


class Recorder:
    """A server's ``wsgi.file_wrapper``: records each object it wraps; wsgiref's wrapper."""

    def __init__(self):
        self.got = []

    def __call__(self, filelike, blksize=8192):
        self.got.append(filelike)
        return wsgiref.util.FileWrapper(filelike, blksize)


def zope_app(make_body, status="200 OK", headers=None):
    """A WSGI app ending like ZPublisher.WSGIPublisher.publish_module (Zope 6.3); every body
    ``make_body()`` made is kept in ``app.bodies``, in order."""
    def app(environ, start_response):
        body = make_body()
        app.bodies.append(body)
        start_response(status, list(headers or []))
        if hasattr(body, "read") and "wsgi.file_wrapper" in environ:
            return environ["wsgi.file_wrapper"](body)
        return body
    app.bodies = []
    return app


def assert_normal_path(app, data, body_type):
    """Through the filter, ``app``'s response is served as without it: the body is ``data``
    (bytes), the server's file wrapper got ``app``'s own body (of ``body_type``), and the
    filter handed nothing over."""
    wrapper = Recorder()
    filt = blobfilter.BlobSendfile(app)
    assert call(filt, wrapper)[2] == data
    assert type(wrapper.got[0]) is body_type and filt.handed_over == 0


def blob_headers(length, *extra):
    return [("Content-Type", "application/octet-stream"), ("Content-Length", str(length)),
            ("Accept-Ranges", "bytes"), *extra]


def call(app, wrapper, method="GET", iterate=True):
    """Call ``app`` like a server; return (status, headers, body bytes or None, result)."""
    environ = {"REQUEST_METHOD": method, "PATH_INFO": "/Plone/blob-5mb/@@download/file"}
    if wrapper is not None:
        environ["wsgi.file_wrapper"] = wrapper
    started = {}

    def start_response(status, headers, exc_info=None):
        started.update(status=status, headers=headers, exc_info=exc_info)

    result = app(environ, start_response)
    assert environ.get("wsgi.file_wrapper") is wrapper  # restored for the server
    body = None
    if iterate:
        try:
            body = b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
    return started.get("status"), started.get("headers"), body, result


def sha(data):
    return hashlib.sha256(data).hexdigest()


class Records(logging.Handler):
    """Keeps every record it is given (pytest's ``caplog.records``)."""

    def __init__(self):
        super().__init__(logging.NOTSET)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def captured_logs(level, logger):
    """What pytest's ``caplog.at_level(level, logger=logger)`` does: ``logger`` at ``level``
    for the block, and every record that reaches the root logger meanwhile kept; yields the
    list of records."""
    handler, named = Records(), logging.getLogger(logger)
    previous = named.level
    logging.getLogger().addHandler(handler)
    named.setLevel(level)
    try:
        yield handler.records
    finally:
        named.setLevel(previous)
        logging.getLogger().removeHandler(handler)


# ------------------------------------------------------------------ whole file: handed over

@check
def whole_file_reaches_the_wrapper_as_its_file(blob):
    range_iterator = range_iterator_class()
    path, data = blob
    app = zope_app(lambda: range_iterator(path, "rb"), headers=blob_headers(SIZE))
    filt = blobfilter.BlobSendfile(app)
    wrapper = Recorder()
    status, headers, body, _ = call(filt, wrapper)
    (given,) = wrapper.got
    assert isinstance(given, blobfilter.BlobFile)
    assert given.iterator is app.bodies[0] and given.raw is app.bodies[0]._io
    assert status == "200 OK" and ("Content-Length", str(SIZE)) in headers
    assert sha(body) == sha(data) and len(body) == SIZE
    assert app.bodies[0]._io.closed  # the wrapper's close() closed the iterator's file
    assert filt.handed_over == 1


@check
def iterator_returned_without_wrapper_is_handed_over(blob):
    range_iterator = range_iterator_class()
    path, data = blob

    def app(environ, start_response):  # returns the iterator, never calls file_wrapper
        start_response("200 OK", blob_headers(SIZE))
        return range_iterator(path, "rb")

    wrapper = Recorder()
    filt = blobfilter.BlobSendfile(app)
    _, _, body, _ = call(filt, wrapper)
    assert isinstance(wrapper.got[0], blobfilter.BlobFile)
    assert body == data and filt.handed_over == 1


@check
def if_range_and_multi_range_answers_are_whole_files(blob):
    # plone.namedfile answers If-Range and multi-range requests with 200 and the whole file
    range_iterator = range_iterator_class()
    path, data = blob
    app = zope_app(lambda: range_iterator(path, "rb", start=0, end=None), headers=blob_headers(SIZE))
    wrapper = Recorder()
    assert call(blobfilter.BlobSendfile(app), wrapper)[2] == data
    assert isinstance(wrapper.got[0], blobfilter.BlobFile)


# --------------------------------------------------------------- everything else: normal path

OTHER_RESPONSES = ["range 206", "range from 0, 206", "head", "length differs", "no length", "gzip",
                   "position moved", "closed file", "error status"]


def other_responses_take_the_normal_path(blob, case):
    range_iterator = range_iterator_class()
    path, data = blob
    method, status, start, end, headers = "GET", "200 OK", 0, None, blob_headers(SIZE)
    expected = data
    if case == "range 206":
        status, start, end = "206 Partial Content", 100, 1100
        headers = blob_headers(1000, ("Content-Range", f"bytes 100-1099/{SIZE}"))
        expected = data[100:1100]
    elif case == "range from 0, 206":
        status, end = "206 Partial Content", SIZE
        headers = blob_headers(SIZE, ("Content-Range", f"bytes 0-{SIZE - 1}/{SIZE}"))
    elif case == "head":
        method = "HEAD"
    elif case == "length differs":
        headers = blob_headers(SIZE - 1)
    elif case == "no length":
        headers = [("Content-Type", "application/octet-stream")]
    elif case == "gzip":
        headers = blob_headers(SIZE, ("Content-Encoding", "gzip"))
    elif case == "error status":
        status = "500 Internal Server Error"

    def make():
        iterator = range_iterator(path, "rb", start=start, end=end)
        if case == "position moved":
            iterator._io.read(10)
            nonlocal expected
            expected = data[10:]
        elif case == "closed file":
            iterator._io.close()
        return iterator

    app = zope_app(make, status=status, headers=headers)
    direct, filtered = Recorder(), Recorder()
    iterate = case != "closed file"
    without = call(app, direct, method=method, iterate=iterate)
    with_filter = call(blobfilter.BlobSendfile(app), filtered, method=method, iterate=iterate)
    assert [type(g) for g in filtered.got] == [type(g) for g in direct.got] == [range_iterator]
    assert with_filter[:2] == without[:2]
    if iterate:
        # wsgiref reads the iterator with read(blksize): plone's read() ignores ``end``, so
        # the slice is the server's job (pyruvate and waitress stop at Content-Length)
        assert with_filter[2] == without[2]
        assert with_filter[2][:len(expected)] == expected


for _case in OTHER_RESPONSES:  # one check per case: other_responses_take_the_normal_path[head], ...
    CHECKS[f"other_responses_take_the_normal_path[{_case}]"] = functools.partial(
        other_responses_take_the_normal_path, case=_case)
del _case


@check
def zope_filestream_iterator_is_left_alone(blob):
    # Zope's own iterator is an io.FileIO: the server gets it as it is (pyruvate sendfiles it)
    filestream_iterator = egg_module("ZPublisher.Iterators").filestream_iterator
    path, data = blob
    app = zope_app(lambda: filestream_iterator(path, "rb"), headers=blob_headers(SIZE))
    assert_normal_path(app, data, filestream_iterator)


@check
def bytes_bodies_and_no_file_wrapper_pass_through(blob):
    range_iterator = range_iterator_class()
    path, data = blob
    app = zope_app(lambda: [b"<html>page</html>"], headers=[("Content-Length", "17")])
    assert call(blobfilter.BlobSendfile(app), Recorder())[2] == b"<html>page</html>"
    # a server without wsgi.file_wrapper: the application's iterator, untouched
    app = zope_app(lambda: range_iterator(path, "rb"), headers=blob_headers(SIZE))
    _, _, body, result = call(blobfilter.BlobSendfile(app), None)
    assert result is app.bodies[0] and body == data


@check
def wrapper_called_before_start_response_is_normal(blob):
    range_iterator = range_iterator_class()
    path, data = blob

    def app(environ, start_response):
        wrapped = environ["wsgi.file_wrapper"](range_iterator(path, "rb"))
        start_response("200 OK", blob_headers(SIZE))
        return wrapped

    assert_normal_path(app, data, range_iterator)


@check
def middleware_that_wraps_the_iterable_gets_the_normal_path(blob):
    """A middleware between filter and app (Sentry, a profiler) that wraps the iterable: the
    placeholder is iterated like the normal path, never a file wrapper holding a descriptor."""
    range_iterator = range_iterator_class()
    path, data = blob
    app = zope_app(lambda: range_iterator(path, "rb"), headers=blob_headers(SIZE))

    def wrapping(app):
        def middleware(environ, start_response):
            result = app(environ, start_response)

            def chunks():
                try:
                    yield from result
                finally:
                    result.close()
            return chunks()
        return middleware

    assert_normal_path(wrapping(app), data, range_iterator)


@check
def disabled_filter_and_factory(blob):
    range_iterator = range_iterator_class()
    path, data = blob
    app = zope_app(lambda: range_iterator(path, "rb"), headers=blob_headers(SIZE))
    for enabled in ("false", "off", "0", "no"):
        wrapper = Recorder()
        filt = blobfilter.filter_factory({}, enabled=enabled)(app)
        assert call(filt, wrapper)[2] == data and type(wrapper.got[0]) is range_iterator
    wrapper = Recorder()
    assert call(blobfilter.filter_factory({})(app), wrapper)[2] == data
    assert isinstance(wrapper.got[0], blobfilter.BlobFile)


# ------------------------------------------------------------------ the real servers' wrappers

@check
def pyruvate_gets_a_descriptor_only_with_the_filter(blob):
    """pyruvate's FileWrapper sendfile()s when the object has fileno() (has_file() is True),
    else reads it with read(-1): the whole blob into one bytes object."""
    FileWrapper = egg_module("pyruvate").FileWrapper
    range_iterator = range_iterator_class()
    path, data = blob
    app = zope_app(lambda: range_iterator(path, "rb"), headers=blob_headers(SIZE))

    # without the filter: no descriptor, read path (documents the problem)
    _, _, _, plain = call(app, FileWrapper, iterate=False)
    assert type(plain) is FileWrapper and not plain.has_file()
    assert b"".join(plain) == data
    plain.close()
    assert app.bodies[-1]._io.closed

    # with it: the server's own wrapper around the blob's descriptor
    _, _, _, result = call(blobfilter.BlobSendfile(app), FileWrapper, iterate=False)
    assert type(result) is FileWrapper and result.has_file()
    assert not app.bodies[-1]._io.closed
    result.close()  # what the server does when the response is sent or the client left
    assert app.bodies[-1]._io.closed

    # a range stays on the read path (pyruvate's sendfile would start at offset 0)
    ranged = zope_app(lambda: range_iterator(path, "rb", start=10, end=20), status="206 Partial Content",
                      headers=blob_headers(10, ("Content-Range", f"bytes 10-19/{SIZE}")))
    _, _, _, result = call(blobfilter.BlobSendfile(ranged), FileWrapper, iterate=False)
    assert not result.has_file()
    result.close()


@check
def pyruvate_wrapper_behind_a_wrapping_middleware_still_ends(blob):
    # A descriptor-holding pyruvate FileWrapper iterated from Python yields b"" forever; the
    # filter must never produce one that a middleware then iterates.
    FileWrapper = egg_module("pyruvate").FileWrapper
    range_iterator = range_iterator_class()
    path, data = blob
    app = zope_app(lambda: range_iterator(path, "rb"), headers=blob_headers(SIZE))

    def wrapping(environ, start_response):
        return (chunk for chunk in app(environ, start_response))

    _, _, _, result = call(blobfilter.BlobSendfile(wrapping), FileWrapper, iterate=False)
    chunks = []
    for chunk in result:
        chunks.append(chunk)
        assert len(chunks) < 1000, "endless iteration"
    assert b"".join(chunks) == data


@check
def waitress_streams_the_file_only_with_the_filter(blob):
    """waitress streams a seekable file from its channel (prepare() returns its size);
    anything else is iterated in the worker thread (prepare() returns 0)."""
    ReadOnlyFileBasedBuffer = egg_module("waitress.buffers").ReadOnlyFileBasedBuffer
    range_iterator = range_iterator_class()
    path, data = blob
    app = zope_app(lambda: range_iterator(path, "rb"), headers=blob_headers(SIZE))

    _, _, _, plain = call(app, ReadOnlyFileBasedBuffer, iterate=False)
    assert plain.prepare(SIZE) == 0
    assert b"".join(plain) == data
    plain.close()

    _, _, _, result = call(blobfilter.BlobSendfile(app), ReadOnlyFileBasedBuffer, iterate=False)
    assert isinstance(result.file, blobfilter.BlobFile)
    assert result.prepare(SIZE) == SIZE
    sent = b""
    while result.remain:  # what waitress' channel does: get() then skip() what was sent
        chunk = result.get(18000)
        result.skip(len(chunk))
        sent += chunk
    assert sent == data
    result.close()
    assert app.bodies[-1]._io.closed


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


@check
def no_descriptor_leak(blob):
    """2,000 whole-file responses: half read to the end, half abandoned after one chunk; each
    closed by the server. The process ends with as many open descriptors as it began with."""
    FileWrapper = egg_module("pyruvate").FileWrapper
    range_iterator = range_iterator_class()
    path, _ = blob
    app = zope_app(lambda: range_iterator(path, "rb"), headers=blob_headers(SIZE))
    filt = blobfilter.BlobSendfile(app)
    before = _open_fds()
    for i in range(1000):
        call(filt, Recorder())                       # read to the end
        _, _, _, result = call(filt, Recorder(), iterate=False)
        next(iter(result))                           # client went away after one chunk
        result.close()
        _, _, _, result = call(filt, FileWrapper, iterate=False)
        result.close()                               # pyruvate: after sendfile or a reset
    assert filt.handed_over == 3000
    assert _open_fds() == before


@check
def debug_log_line(blob):
    range_iterator = range_iterator_class()
    path, _ = blob
    app = zope_app(lambda: range_iterator(path, "rb"), headers=blob_headers(SIZE))
    with captured_logs("DEBUG", logger="plonedeploy.blobfilter") as records:
        call(blobfilter.BlobSendfile(app), Recorder())
    (record,) = records
    assert "filestream_range_iterator handed to" in record.getMessage()
    assert f"{SIZE} bytes" in record.getMessage()


# ------------------------------------------------------------------------------ the runner

def run_checks():
    """Run every check of CHECKS on a blob file of its own; ``{name: "ok" or traceback}``."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="plonedeploy-blobfilter-") as directory:
        for number, (name, function) in enumerate(CHECKS.items()):
            data = os.urandom(SIZE)
            path = os.path.join(directory, f"blob-{number}.bin")
            with open(path, "wb") as fp:
                fp.write(data)
            try:
                function((path, data))
            except Exception:
                results[name] = traceback.format_exc()
            else:
                results[name] = "ok"
    return results


def main():
    with contextlib.redirect_stdout(sys.stderr):  # stdout is for the JSON line only
        results = run_checks()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
