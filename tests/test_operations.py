"""Operations on the real stack (issue #16): log rotation under load loses no line, and a
backup survives the loss of Data.fs and the blobs (bin/backup, bin/restore).

The rotation test leaves the stack running; the restore test stops and restarts all of it
(``stack_last``) and leaves it running and healthy.
"""
import glob
import gzip
import hashlib
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest
import requests

from conftest import ROOT, STACK, admin_session, port_taken, run

pytestmark = pytest.mark.integration

BLOB = "/Plone/blob-5mb/@@download/file"
LOG_DIR = os.path.join(ROOT, "var", "log")
LOGROTATE_CONF = os.path.join(ROOT, "parts", "logrotate", "logrotate.conf")
LOGROTATE = shutil.which("logrotate") or "/usr/sbin/logrotate"


def _sha256(url):
    """sha256 hex digest of the body at ``url`` (status 200 required)."""
    answer = requests.get(url, timeout=60)
    assert answer.status_code == 200, url
    return hashlib.sha256(answer.content).hexdigest()


def _lines_with(pattern, marker):
    """Number of lines containing ``marker`` in the files matching ``pattern`` (the current
    log and its rotated copies, gzip-compressed ones included)."""
    count = 0
    for path in glob.glob(pattern):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", errors="replace") as fp:
            count += sum(1 for line in fp if marker in line)
    return count


def test_logrotate_under_load_loses_no_access_line(stack, tmp_path):
    """parts/logrotate/logrotate.conf, forced three times (``-f``) while 4 threads send
    GETs through HAProxy: the Zope access logs (WatchedFileHandler, renamed) hold every
    request, rotated + current; HAProxy's stdout log (copytruncate) is counted and may lose
    only what was written between a copy and its truncation; ZEO reopened its log on
    SIGUSR2; every server still UP."""
    assert os.path.exists(LOGROTATE_CONF), "parts/logrotate/logrotate.conf missing: run bin/buildout"
    state = tmp_path / "logrotate.state"
    marker = f"rotation-{int(time.time() * 1000)}"
    url = stack.frontend_url + "/Plone/@@ok"
    sent, failed = [0], []
    lock, stop = threading.Lock(), threading.Event()

    def load(worker):
        number = 0
        while not stop.is_set():
            try:
                status = requests.get(url, params={"m": f"{marker}-{worker}-{number}"}, timeout=30).status_code
            except requests.RequestException as exc:
                status = type(exc).__name__
            if status != 200:
                failed.append(status)
            with lock:
                sent[0] += 1
            number += 1

    threads = [threading.Thread(target=load, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    rotations = []
    load_started = time.monotonic()
    try:
        for _ in range(3):
            time.sleep(2)
            started = time.monotonic()
            result = run([LOGROTATE, "-f", "-s", str(state), LOGROTATE_CONF], timeout=60)
            rotations.append(time.monotonic() - started)
            assert not result.stderr.strip(), result.stderr
        time.sleep(2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    rate = sent[0] / (time.monotonic() - load_started)  # requests per second
    time.sleep(1)  # translogger writes after the response is sent
    zope_lines = sum(_lines_with(os.path.join(LOG_DIR, f"{name}-access.log*"), marker)
                     for name in stack.kinds)
    haproxy_lines = _lines_with(os.path.join(LOG_DIR, "haproxy.stdout.log*"), marker)
    rotated = glob.glob(os.path.join(LOG_DIR, "*.log.1"))
    print(f"\nlogrotate -f x3 under load ({', '.join(f'{s:.2f}' for s in rotations)} s each): "
          f"{sent[0]} requests sent ({len(failed)} failed), Zope access logs {zope_lines} lines, "
          f"HAProxy log {haproxy_lines} lines ({sent[0] - haproxy_lines} lost to copytruncate, "
          f"at most {rate * sum(rotations):.0f} written during the rotations); "
          f"{len(rotated)} files rotated")
    assert not failed, failed[:10]
    assert sent[0] > 100, "too little load to prove anything"
    assert zope_lines == sent[0], "the Zope access logs lost or doubled lines"
    # copytruncate can lose only lines written while logrotate ran (between its copy and
    # its truncation): at most the request rate times the rotations' wall time, + 3 slack.
    assert sent[0] - (rate * sum(rotations) + 3) <= haproxy_lines <= sent[0]
    for name in [*stack.kinds, "zeoserver", "haproxy"]:
        assert any(path.startswith(os.path.join(LOG_DIR, name)) for path in rotated), name
    # ZEO got SIGUSR2 (postrotate) and writes into the new file, not the renamed one.
    deadline = time.monotonic() + 10
    while "Log files reopened" not in open(os.path.join(LOG_DIR, "zeoserver.log")).read():
        assert time.monotonic() < deadline, "ZEO did not reopen zeoserver.log after SIGUSR2"
        time.sleep(0.5)
    # the Zope event logs follow the rename too: the clients are alive and log into them
    for name in stack.kinds:
        assert os.path.exists(os.path.join(LOG_DIR, f"{name}-access.log")), name
    assert stack.states() == {**{name: "UP" for name in stack.kinds}, "BACKEND": "UP"}


@pytest.mark.stack_last
def test_restore_brings_back_content_and_blob(stack):
    """Create a document, bin/backup, stop the stack, delete Data.fs and the blob
    storage, bin/restore, start: the document and the 5 MiB blob are back
    (sha256 identical). Prints the restore time and the whole outage."""
    run([STACK, "start", "--timeout", "120"], timeout=200)  # a stack_last test may have stopped it
    admin, base = admin_session(), stack.frontend_url
    doc_id = f"restore-{int(time.time())}"
    text = f"restored text {doc_id}"
    answer = admin.post(base + "/Plone", json={"@type": "Document", "id": doc_id, "title": doc_id,
                                                "text": {"data": text, "content-type": "text/plain"}},
                        timeout=60)
    assert answer.status_code == 201, answer.text[:300]
    blob_before = _sha256(base + BLOB)

    backup = run([os.path.join(ROOT, "bin", "backup")], timeout=300)
    print(f"\nbin/backup: {backup.stderr.strip().splitlines()[-1] if backup.stderr.strip() else 'ok'}")

    outage_started = time.monotonic()
    run([STACK, "stop"], timeout=120)
    var = os.path.join(ROOT, "var")
    for path in glob.glob(os.path.join(var, "filestorage", "Data.fs*")):
        os.remove(path)
    shutil.rmtree(os.path.join(var, "blobstorage"))
    # The clients' ZEO caches live in memory (no zeo-client-client name, so no cache file):
    # stopped, they forget everything, and what they serve afterwards comes from ZEO.
    assert not os.path.exists(os.path.join(var, "filestorage", "Data.fs"))

    restore_started = time.monotonic()
    restore = run([os.path.join(ROOT, "bin", "restore"), "--no-prompt"], timeout=600)
    restore_seconds = time.monotonic() - restore_started
    assert os.path.exists(os.path.join(var, "filestorage", "Data.fs")), restore.stderr
    blob_files = sum(len(files) for _, _, files in os.walk(os.path.join(var, "blobstorage")))

    run([STACK, "start", "--timeout", "180"], timeout=260)
    outage = time.monotonic() - outage_started
    size_mb = os.path.getsize(os.path.join(var, "filestorage", "Data.fs")) / 1e6
    print(f"bin/restore: {restore_seconds:.1f} s (Data.fs {size_mb:.1f} MB, {blob_files} blob files); "
          f"whole outage stop -> restore -> all UP: {outage:.1f} s")

    document = admin.get(f"{base}/Plone/{doc_id}", timeout=60)
    assert document.status_code == 200, document.status_code
    assert text in document.json()["text"]["data"]
    assert _sha256(base + BLOB) == blob_before
    for client_base in stack.client_urls.values():  # each client directly, too
        assert _sha256(client_base + BLOB) == blob_before
    assert stack.states() == {**{name: "UP" for name in stack.kinds}, "BACKEND": "UP"}


@pytest.mark.stack_last
def test_instance_fg_as_the_readme_says(stack, tmp_path):
    """README's classic way: with ZEO running (``bin/zeoserver start``) and the stack's
    clients stopped, ``bin/instance fg`` serves /Plone on 127.0.0.1:8081 in the foreground,
    and Ctrl-C (SIGINT to its process group, as a terminal sends it) stops it and frees the
    port. Runs last: it stops the stack."""
    run([STACK, "stop"], timeout=120)
    zeoserver = os.path.join(ROOT, "bin", "zeoserver")
    run([zeoserver, "start"], timeout=120)
    try:
        with open(tmp_path / "fg.log", "wb") as log:
            process = subprocess.Popen([os.path.join(ROOT, "bin", "instance"), "fg"], cwd=ROOT, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        try:
            base = stack.client_urls["instance"]  # http://127.0.0.1:8081 in buildout.cfg
            address = base.split("//", 1)[1]
            url = base + "/Plone"
            deadline = time.monotonic() + 180
            while True:
                assert process.poll() is None, (tmp_path / "fg.log").read_text()[-3000:]
                try:
                    page = requests.get(url, timeout=10)
                    if page.status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                assert time.monotonic() < deadline, "bin/instance fg did not serve /Plone within 180 s"
                time.sleep(1)
            assert "<html" in page.text[:2000].lower()
            assert f"pyruvate listening on {address}" in (tmp_path / "fg.log").read_text()
            os.killpg(process.pid, signal.SIGINT)
            process.wait(60)
            assert not port_taken(int(address.rpartition(":")[2]))
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
    finally:
        run([zeoserver, "stop"], timeout=120, check=False)
