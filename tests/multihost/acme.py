"""ACME on lb1 against pebble: the certificate issued in the first site.yml run (chain,
name, the files' modes and owners, the challenge through HAProxy's backend acme), then the
cron job's renewal command, forced, under two GET loops over https: 0 failed, a new serial."""
import hashlib
import os
import pwd
import re
import socket
import ssl
import subprocess
import threading
import time
import urllib.request

from .common import ACME, ACME_MANAGEMENT, ACME_NAME, ACME_WORK, CRON_FILES, HOSTS, WORK, in_ns


def served_certificate(context=None):
    """The certificate lb1's HTTPS listener serves for ACME_NAME (SNI): ``(DER, serial as hex)``;
    with ``context`` verified by it (chain and name)."""
    if context is None:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((HOSTS["lb1"][1], 443), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=ACME_NAME) as tls:
            der = tls.getpeercert(binary_form=True)
    serial = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-serial"], input=der,
                            capture_output=True, timeout=30, check=True).stdout.decode().strip()
    return der, serial.partition("=")[2].lower()


def _certbot_seconds(log_directory, marker):
    """Wall time of the first certbot run whose part of the debug log (certbot appends each
    run to letsencrypt.log, starting with "certbot version:") contains ``marker``: its last
    line's time minus its first's; None when no run has it."""
    path = os.path.join(log_directory, "letsencrypt.log")
    text = open(path, encoding="utf-8", errors="replace").read() if os.path.exists(path) else ""
    for run in re.split(r"\n(?=\S+ \S+:DEBUG:certbot\._internal\.main:certbot version:)", text):
        stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}):", run, re.MULTILINE)
        if marker in run and len(stamps) >= 2:
            first, last = (time.mktime(time.strptime(t, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000
                           for t, ms in (stamps[0], stamps[-1]))
            return round(last - first, 1)
    return None


def acme_test():
    """The ACME certificate on lb1 (issue 27, item 6): issued by pebble for ACME_NAME in the
    first site.yml run (the challenge answered through HAProxy's plain listener), its files
    0600 haproxy; then the renewal timer's command, run as cron runs it (forced: pebble's
    certificates last 5 years), while GET loops over https count every request: 0 failed,
    and the served serial changes. Returns ``[(label, passed, detail)]``."""
    results = []
    context = ssl.create_default_context(cafile=f"{ACME_WORK}/ca.pem")
    with urllib.request.urlopen(f"{ACME_MANAGEMENT}/roots/0", timeout=10, context=context) as response:
        root = response.read().decode("ascii")
    verified = ssl.create_default_context(cadata=root)  # pebble's root: chain and name checked
    try:
        _der, serial = served_certificate(verified)
        error = ""
    except (OSError, ssl.SSLError) as exc:
        serial, error = None, repr(exc)
    state = f"{WORK}/lb1/haproxy/acme"
    issued = _certbot_seconds(f"{state}/logs", "Requesting a certificate for")
    results.append((f"lb1 serves pebble's certificate for {ACME_NAME} (chain to pebble's root, the name), "
                    f"issued in the first site.yml run (certbot certonly {issued} s)", serial is not None,
                    f"serial {serial} {error}"))
    files = {}
    for path in (f"{WORK}/lb1/haproxy/tls/acme.pem", f"{WORK}/lb1/haproxy/tls/acme.pem.key", state):
        info = os.stat(path)
        files[path.rsplit("/", 1)[1]] = (oct(info.st_mode & 0o777), pwd.getpwuid(info.st_uid).pw_name)
    results.append(("HAProxy's copy of certificate and key 0600 haproxy; certbot's directory 0700 acme",
                    files == {"acme.pem": ("0o600", "haproxy"), "acme.pem.key": ("0o600", "haproxy"),
                              "acme": ("0o700", "acme")}, files))
    with open(f"{WORK}/lb1/var/log/haproxy.log", encoding="utf-8", errors="replace") as fp:
        challenges = re.findall(rf"^{re.escape(ACME[2])}:\d+ \[[^]]+\] plone acme/acme \S+ (\d+) .*"
                                r'"GET /\.well-known/acme-challenge/', fp.read(), re.MULTILINE)
    results.append(("pebble's HTTP-01 requests reached certbot through HAProxy's plain listener (backend acme)",
                    "200" in challenges, f"statuses {challenges}"))
    # Between renewals: the challenge path is certbot's (503 while it does not run), the rest
    # of the plain listener still redirects.
    statuses = [in_ns(ACME[1], "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                      f"http://{ACME_NAME}:8080{path}", capture=True, check=False)
                for path in ("/.well-known/acme-challenge/nothing", "/Plone")]
    results.append(("from pebble's namespace: the challenge path 503 (no certbot running), /Plone 301",
                    statuses == ["503", "301"], statuses))
    # The timer's command, from the cron file, run as cron runs it in lb1's namespace.
    path = os.path.join("/etc/cron.d", CRON_FILES["haproxy"])
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    jobs = [line.split(None, 6)[6].strip() for line in text.splitlines()
            if line.strip() and not line.startswith("#") and "=" not in line.split()[0]]
    results.append((f"lb1: the renewal's cron job in {path}", jobs == [f"{WORK}/lb1/haproxy/acme-renew"], jobs))
    if not jobs or serial is None:
        return results
    counts, failures, stop = {}, [], threading.Event()
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE

    def loop():
        # A new TLS connection per request (each meets whichever workers listen then), at
        # most ~10 requests/s per loop: the control host is not exempt from the per-address limit.
        while not stop.is_set():
            try:
                with socket.create_connection((HOSTS["lb1"][1], 443), timeout=30) as raw:
                    with insecure.wrap_socket(raw, server_hostname=ACME_NAME) as tls:
                        der = tls.getpeercert(binary_form=True)
                        tls.sendall(f"GET /Plone/@@ok HTTP/1.1\r\nHost: {ACME_NAME}\r\nConnection: close\r\n\r\n"
                                    .encode())
                        answer = b""
                        while chunk := tls.recv(65536):
                            answer += chunk
                status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/1.1 ") else b"?"
                if status != b"200":
                    failures.append(status.decode(errors="replace"))
                else:
                    key = hashlib.sha256(der).hexdigest()[:12]
                    counts[key] = counts.get(key, 0) + 1
            except OSError as exc:
                failures.append(repr(exc))
            time.sleep(0.1)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(5)
    cron_env = {"SHELL": "/bin/sh", "PATH": "/usr/bin:/bin", "HOME": "/root", "LOGNAME": "root"}
    started = time.monotonic()
    renew = subprocess.run(["ip", "netns", "exec", "pdmh-lb", "env", "-i", *(f"{k}={v}" for k, v in cron_env.items()),
                            "/bin/sh", "-c", jobs[0] + " --force-renewal --no-random-sleep-on-renew"],
                           cwd="/", capture_output=True, text=True, timeout=600, check=False)
    renewed = round(time.monotonic() - started, 1)
    time.sleep(5)
    stop.set()
    for thread in threads:
        thread.join(60)
    try:
        _der, after = served_certificate(verified)
    except (OSError, ssl.SSLError) as exc:
        after = repr(exc)
    requests = sum(counts.values())
    results.append((f"renewal (the cron job's command, forced) {renewed} s, exit {renew.returncode}: "
                    f"serial {serial} -> {after}, verified by pebble's root",
                    renew.returncode == 0 and "deployed" in renew.stdout and after not in (serial, None)
                    and re.fullmatch(r"[0-9a-f]+", after or "") is not None,
                    (renew.stdout + renew.stderr)[-1500:]))
    results.append((f"HAProxy reloaded under 2 GET loops over https: {requests} requests, {len(failures)} failed, "
                    f"served with {len(counts)} certificates", not failures and len(counts) == 2 and requests > 0,
                    {"by certificate": counts, "failures": failures[:10]}))
    return results
