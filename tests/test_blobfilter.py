"""Unit tests of the ``blobsendfile`` WSGI filter (``plonedeploy.runtime.blobfilter``).

Real files, the real classes of the client's eggs (plone.namedfile's
``filestream_range_iterator``, Zope's ``filestream_iterator``, pyruvate's ``FileWrapper``,
waitress' ``ReadOnlyFileBasedBuffer``; the eggs are found through the client's buildout
interpreter, so these tests need ``make build``), and a server ``wsgi.file_wrapper`` that
records what it was given (it is the standard library's ``wsgiref.util.FileWrapper``).

The application is the end of ``ZPublisher.WSGIPublisher.publish_module`` (Zope 6.3):
``start_response`` first, then ``environ['wsgi.file_wrapper'](body)`` for a body with ``read``.
"""
import hashlib
import os
import re
import sys
import wsgiref.util

import pytest

from conftest import ROOT
from plonedeploy.runtime import blobfilter

INTERPRETER = os.path.join(ROOT, "parts", "instance", "bin", "interpreter")
SIZE = 3 * 65536 + 12345  # not a multiple of any block size


def _append_client_eggs():
    """Append the ZEO client's eggs to sys.path (after this venv's packages); False if not built."""
    try:
        with open(INTERPRETER, encoding="utf-8") as fp:
            text = fp.read()
    except OSError:
        return False
    for path in re.findall(r"^  '([^']+)',$", text, re.MULTILINE):
        if "site-packages" not in path and path not in sys.path:
            sys.path.append(path)
    return True


_append_client_eggs()


def _egg_module(name):
    return pytest.importorskip(name, reason=f"{name} comes from the client's eggs: run 'make build'")


@pytest.fixture
def range_iterator():
    """plone.namedfile's iterator class, what @@download returns."""
    return _egg_module("plone.namedfile.utils").filestream_range_iterator


@pytest.fixture
def blob(tmp_path):
    """(path, bytes) of a real file standing for a committed ZODB blob."""
    data = os.urandom(SIZE)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    return str(path), data


class Recorder:
    """A server's ``wsgi.file_wrapper``: records each object it wraps; wsgiref's wrapper."""

    def __init__(self):
        self.got = []

    def __call__(self, filelike, blksize=8192):
        self.got.append(filelike)
        return wsgiref.util.FileWrapper(filelike, blksize)


def zope_app(make_body, status="200 OK", headers=None):
    """A WSGI app ending like ZPublisher.WSGIPublisher.publish_module (Zope 6.3)."""
    def app(environ, start_response):
        body = make_body()
        start_response(status, list(headers or []))
        if hasattr(body, "read") and "wsgi.file_wrapper" in environ:
            return environ["wsgi.file_wrapper"](body)
        return body
    app.bodies = []
    return app


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


# ------------------------------------------------------------------ whole file: handed over

def test_whole_file_reaches_the_wrapper_as_its_file(blob, range_iterator):
    path, data = blob
    iterators = []
    app = zope_app(lambda: iterators.append(range_iterator(path, "rb")) or iterators[-1],
                   headers=blob_headers(SIZE))
    filt = blobfilter.BlobSendfile(app)
    wrapper = Recorder()
    status, headers, body, _ = call(filt, wrapper)
    (given,) = wrapper.got
    assert isinstance(given, blobfilter.BlobFile)
    assert given.iterator is iterators[0] and given.raw is iterators[0]._io
    assert status == "200 OK" and ("Content-Length", str(SIZE)) in headers
    assert sha(body) == sha(data) and len(body) == SIZE
    assert iterators[0]._io.closed  # the wrapper's close() closed the iterator's file
    assert filt.handed_over == 1


def test_iterator_returned_without_wrapper_is_handed_over(blob, range_iterator):
    path, data = blob

    def app(environ, start_response):  # returns the iterator, never calls file_wrapper
        start_response("200 OK", blob_headers(SIZE))
        return range_iterator(path, "rb")

    wrapper = Recorder()
    filt = blobfilter.BlobSendfile(app)
    _, _, body, _ = call(filt, wrapper)
    assert isinstance(wrapper.got[0], blobfilter.BlobFile)
    assert body == data and filt.handed_over == 1


def test_if_range_and_multi_range_answers_are_whole_files(blob, range_iterator):
    # plone.namedfile answers If-Range and multi-range requests with 200 and the whole file
    path, data = blob
    app = zope_app(lambda: range_iterator(path, "rb", start=0, end=None), headers=blob_headers(SIZE))
    wrapper = Recorder()
    assert call(blobfilter.BlobSendfile(app), wrapper)[2] == data
    assert isinstance(wrapper.got[0], blobfilter.BlobFile)


# --------------------------------------------------------------- everything else: normal path

@pytest.mark.parametrize("case", [
    "range 206", "range from 0, 206", "head", "length differs", "no length", "gzip",
    "position moved", "closed file", "error status",
])
def test_other_responses_take_the_normal_path(blob, range_iterator, case):
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


def test_zope_filestream_iterator_is_left_alone(blob):
    # Zope's own iterator is an io.FileIO: the server gets it as it is (pyruvate sendfiles it)
    filestream_iterator = _egg_module("ZPublisher.Iterators").filestream_iterator
    path, data = blob
    app = zope_app(lambda: filestream_iterator(path, "rb"), headers=blob_headers(SIZE))
    wrapper = Recorder()
    filt = blobfilter.BlobSendfile(app)
    assert call(filt, wrapper)[2] == data
    assert type(wrapper.got[0]) is filestream_iterator and filt.handed_over == 0


def test_bytes_bodies_and_no_file_wrapper_pass_through(blob, range_iterator):
    path, data = blob
    app = zope_app(lambda: [b"<html>page</html>"], headers=[("Content-Length", "17")])
    assert call(blobfilter.BlobSendfile(app), Recorder())[2] == b"<html>page</html>"
    # a server without wsgi.file_wrapper: the application's iterator, untouched
    iterators = []
    app = zope_app(lambda: iterators.append(range_iterator(path, "rb")) or iterators[-1],
                   headers=blob_headers(SIZE))
    _, _, body, result = call(blobfilter.BlobSendfile(app), None)
    assert result is iterators[0] and body == data


def test_wrapper_called_before_start_response_is_normal(blob, range_iterator):
    path, data = blob

    def app(environ, start_response):
        wrapped = environ["wsgi.file_wrapper"](range_iterator(path, "rb"))
        start_response("200 OK", blob_headers(SIZE))
        return wrapped

    wrapper = Recorder()
    filt = blobfilter.BlobSendfile(app)
    assert call(filt, wrapper)[2] == data
    assert type(wrapper.got[0]) is range_iterator and filt.handed_over == 0


def test_middleware_that_wraps_the_iterable_gets_the_normal_path(blob, range_iterator):
    """A middleware between filter and app (Sentry, a profiler) that wraps the iterable: the
    placeholder is iterated like the normal path, never a file wrapper holding a descriptor."""
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

    wrapper = Recorder()
    filt = blobfilter.BlobSendfile(wrapping(app))
    assert call(filt, wrapper)[2] == data
    assert type(wrapper.got[0]) is range_iterator and filt.handed_over == 0


def test_disabled_filter_and_factory(blob, range_iterator):
    path, data = blob
    app = zope_app(lambda: range_iterator(path, "rb"), headers=blob_headers(SIZE))
    for enabled in ("false", "off", "0", "no"):
        wrapper = Recorder()
        filt = blobfilter.filter_factory({}, enabled=enabled)(app)
        assert call(filt, wrapper)[2] == data and type(wrapper.got[0]) is range_iterator
    wrapper = Recorder()
    assert call(blobfilter.filter_factory({})(app), wrapper)[2] == data
    assert isinstance(wrapper.got[0], blobfilter.BlobFile)


def test_start_response_exc_info_is_passed_on(blob):
    def app(environ, start_response):
        try:
            raise ValueError("boom")
        except ValueError:
            start_response("500 Internal Server Error", [("Content-Length", "0")], sys.exc_info())
        return [b""]

    status, _, body, _ = call(blobfilter.BlobSendfile(app), Recorder())
    assert status.startswith("500") and body == b""


# ------------------------------------------------------------------ the real servers' wrappers

def test_pyruvate_gets_a_descriptor_only_with_the_filter(blob, range_iterator):
    """pyruvate's FileWrapper sendfile()s when the object has fileno() (has_file() is True),
    else reads it with read(-1): the whole blob into one bytes object."""
    FileWrapper = _egg_module("pyruvate").FileWrapper
    path, data = blob
    iterators = []
    app = zope_app(lambda: iterators.append(range_iterator(path, "rb")) or iterators[-1],
                   headers=blob_headers(SIZE))

    # without the filter: no descriptor, read path (documents the problem)
    _, _, _, plain = call(app, FileWrapper, iterate=False)
    assert type(plain) is FileWrapper and not plain.has_file()
    assert b"".join(plain) == data
    plain.close()
    assert iterators[-1]._io.closed

    # with it: the server's own wrapper around the blob's descriptor
    _, _, _, result = call(blobfilter.BlobSendfile(app), FileWrapper, iterate=False)
    assert type(result) is FileWrapper and result.has_file()
    assert not iterators[-1]._io.closed
    result.close()  # what the server does when the response is sent or the client left
    assert iterators[-1]._io.closed

    # a range stays on the read path (pyruvate's sendfile would start at offset 0)
    ranged = zope_app(lambda: range_iterator(path, "rb", start=10, end=20), status="206 Partial Content",
                      headers=blob_headers(10, ("Content-Range", f"bytes 10-19/{SIZE}")))
    _, _, _, result = call(blobfilter.BlobSendfile(ranged), FileWrapper, iterate=False)
    assert not result.has_file()
    result.close()


def test_pyruvate_wrapper_behind_a_wrapping_middleware_still_ends(blob, range_iterator):
    # A descriptor-holding pyruvate FileWrapper iterated from Python yields b"" forever; the
    # filter must never produce one that a middleware then iterates.
    FileWrapper = _egg_module("pyruvate").FileWrapper
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


def test_waitress_streams_the_file_only_with_the_filter(blob, range_iterator):
    """waitress streams a seekable file from its channel (prepare() returns its size);
    anything else is iterated in the worker thread (prepare() returns 0)."""
    ReadOnlyFileBasedBuffer = _egg_module("waitress.buffers").ReadOnlyFileBasedBuffer
    path, data = blob
    iterators = []
    app = zope_app(lambda: iterators.append(range_iterator(path, "rb")) or iterators[-1],
                   headers=blob_headers(SIZE))

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
    assert iterators[-1]._io.closed


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_no_descriptor_leak(blob, range_iterator):
    """2,000 whole-file responses: half read to the end, half abandoned after one chunk; each
    closed by the server. The process ends with as many open descriptors as it began with."""
    FileWrapper = _egg_module("pyruvate").FileWrapper
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


def test_debug_log_line(blob, range_iterator, caplog):
    path, _ = blob
    app = zope_app(lambda: range_iterator(path, "rb"), headers=blob_headers(SIZE))
    with caplog.at_level("DEBUG", logger="plonedeploy.blobfilter"):
        call(blobfilter.BlobSendfile(app), Recorder())
    (record,) = caplog.records
    assert "filestream_range_iterator handed to" in record.getMessage()
    assert f"{SIZE} bytes" in record.getMessage()
