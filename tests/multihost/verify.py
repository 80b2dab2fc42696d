"""The checks of a deployed multihost run: verify() runs them all in order and prints
PASS or FAIL for each. Its own: every program RUNNING, the paths through HAProxy (the
redirect, the blob), the edge rules, ZEO's listener and connections, the clients'
listeners, the mixed pool (pyruvate, waitress, gunicorn with threads auto), the cache tier
and PURGE, nothing on this namespace's demo ports, the cron schedules. The others are the
modules beside it (exposure, acme, resilience, database, ab_remote)."""
import hashlib
import http.client
import json
import os
import re
import ssl
import time
import urllib.error
import urllib.request

from plonedeploy.stack import rules

from . import common
from .ab_remote import ab_with_remote_workers
from .acme import acme_test
from .common import CLIENT_PROGRAMS, CRON_FILES, HOSTS, STORAGES, WORK, in_ns, probe, sh
from .database import database_checks, database_cron_jobs_run
from .exposure import exposure_checks, service_user_checks
from .resilience import alert_test, crash_test, selfheal_checks


def verify():
    ok = True

    def check(label, condition, detail=""):
        nonlocal ok
        ok = ok and bool(condition)
        print(f"{'PASS' if condition else 'FAIL'} {label} {detail}")

    for name, (ns, _address) in HOSTS.items():
        # supervisord says STARTING for a program's first startsecs (prometheus: 5 s and more)
        for _ in range(30):
            status = in_ns(ns, "supervisorctl", "-c", f"{WORK}/{name}/etc/supervisord.conf", "status",
                           check=False, capture=True)
            programs = dict(re.findall(r"^(\S+)\s+(\S+)", status, re.MULTILINE))
            if programs and "STARTING" not in programs.values():
                break
            time.sleep(1)
        check(f"{name}: programs RUNNING", programs and all(s == "RUNNING" for s in programs.values()),
              json.dumps(programs))
    # The site over https (port 443, the self-signed certificate the haproxy role made);
    # the plain port answers 301 there (haproxy_tls_redirect, on by default).
    base = "https://10.231.0.4"
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=insecure))
    urllib.request.install_opener(opener)
    plain = http.client.HTTPConnection("10.231.0.4", 8080, timeout=30)
    plain.request("GET", "/Plone?x=1", headers={"Host": "10.231.0.4:8080"})
    answer = plain.getresponse()
    check("plain HTTP answers 301 to https", answer.status == 301
          and answer.getheader("Location") == "https://10.231.0.4/Plone?x=1",
          f"{answer.status} {answer.getheader('Location')}")
    plain.close()
    for path, extra in (("/", {}), ("/Plone", {}), ("/Plone", {"Accept": "application/json"})):
        request = urllib.request.Request(base + path, headers=extra)
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read()
            check(f"GET {path} {extra or ''} through HAProxy on lb1", response.status == 200,
                  f"{response.status} {len(body)} bytes, X-Served-By {response.headers.get('X-Served-By')}")
    digests = set()
    for _ in range(4):
        with urllib.request.urlopen(base + "/Plone/blob-5mb/@@download/file", timeout=60) as response:
            body = response.read()
            digests.add(hashlib.sha256(body).hexdigest())
            check("blob 5MB through HAProxy", len(body) == 5 * 1024 * 1024,
                  f"{len(body)} bytes from {response.headers.get('X-Served-By')}")
    check("blob identical from both clients", len(digests) == 1)
    # The edge rules, deployed by the same template as the buildout stack's.
    for host, status in (("evil.example", 421), ("10.231.0.4", 200)):
        request = urllib.request.Request(base + "/Plone/@@ok", headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                got = response.status
        except urllib.error.HTTPError as exc:
            got = exc.code
        check(f"Host {host} -> {status}", got == status, f"got {got}")
    for size, lane in ((100, {"client1", "client2", "client3", "client4"}), (100_000, {"uploads"})):
        request = urllib.request.Request(base + "/Plone/@@ok", data=b"x" * size, method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            served = response.headers.get("X-Served-By")
        check(f"POST of {size} bytes served by {' or '.join(sorted(lane))}", served in lane, f"by {served}")
    if common.STORAGE == "zeo":
        listening = in_ns("pdmh-zeo", "ss", "-Htln", capture=True)
        check("ZEO listens on 10.231.0.2:8100 only", "10.231.0.2:8100" in listening
              and "0.0.0.0:8100" not in listening and "127.0.0.1:8100" not in listening, listening.split())
        conns = in_ns("pdmh-app", "ss", "-Htn", "state", "established", "dst", "10.231.0.2:8100", capture=True)
        check("app1's ZEO connections: 10.231.0.3 -> 10.231.0.2:8100 over the namespace network",
              "10.231.0.3:" in conns and "10.231.0.2:8100" in conns, conns.split())
    else:
        for label, passed, detail in database_checks():
            check(label, passed, detail)
    clients = in_ns("pdmh-app", "ss", "-Htln", capture=True)
    check("clients listen on 10.231.0.3:8081-8084 and :8079 (uploads), not on 0.0.0.0",
          all(f"10.231.0.3:{port}" in clients for port in (8081, 8082, 8083, 8084, 8079))
          and "0.0.0.0:80" not in clients)
    # The mixed pool: three servers (two clients of pyruvate: the canary's comparison),
    # client3's threads by the recipe's auto rule for the five clients, and
    # HAProxy's maxconn for it the same number.
    ini = open(f"{WORK}/app1/zeoclient/current/parts/client3/etc/wsgi.ini", encoding="utf-8").read()
    threads = int(re.search(r"^threads = (\d+)$", ini, re.MULTILINE).group(1))
    cores = int(in_ns("pdmh-app", "nproc", capture=True))
    expected = rules.auto_threads("gunicorn", cores, len(CLIENT_PROGRAMS))[0]
    haproxy_cfg = open(f"{WORK}/lb1/haproxy/haproxy.cfg", encoding="utf-8").read()
    maxconn = re.search(r"^\s*server client3 \S+ .*\bmaxconn (\d+)", haproxy_cfg, re.MULTILINE)
    check(f"client3: gunicorn with threads auto = {expected} ({cores} cores, {len(CLIENT_PROGRAMS)} clients), "
          "HAProxy maxconn the same",
          "egg:plonedeploy.runtime#gunicorn" in ini and threads == expected and maxconn
          and int(maxconn.group(1)) == expected, f"wsgi.ini threads {threads}, maxconn {maxconn and maxconn.group(1)}")
    served = set()
    # GETs with Plone's login cookie: varnish passes them (never cached) and HAProxy sends them
    # to the page pool. Not POSTs: those go to the write lane, one page client at a time.
    for _ in range(30):
        request = urllib.request.Request(base + "/Plone/@@ok", headers={"Cookie": "__ac=multihost"})
        with urllib.request.urlopen(request, timeout=30) as response:
            served.add(response.headers.get("X-Served-By"))
    check("the pool serves from pyruvate, waitress and gunicorn (client1-4)",
          served == {"client1", "client2", "client3", "client4"}, sorted(map(str, served)))
    # The cache tier: varnish on lb1 between HAProxy's TLS listener and the pool.
    answers = []
    for _ in range(2):
        with urllib.request.urlopen(base + "/Plone", timeout=60) as response:
            answers.append((response.status, response.headers.get("X-Cache"), response.read()))
    check("second anonymous GET /Plone over https is a cache hit", answers[1][:2] == (200, "HIT"),
          f"{[a[:2] for a in answers]}")
    check("the cached page has https links", b'href="https://10.231.0.4/Plone' in answers[1][2])
    varnish = in_ns("pdmh-lb", "ss", "-Htlnp", capture=True)
    check("varnish listens on 127.0.0.1:6081 and 10.231.0.4:6081 (purges from the app host)",
          "127.0.0.1:6081" in varnish and "10.231.0.4:6081" in varnish and "0.0.0.0:6081" not in varnish,
          [line.split()[3] for line in varnish.splitlines() if "varnishd" in line])
    # The unix jail: the manager runs as varnish, the cache process (named cache-main, hence
    # matched by its arguments) as vcache.
    users = sh("ps", "-eo", "user=,args=", capture=True, check=False)
    users = {line.split()[0] for line in users.splitlines()
             if "varnishd" in line and f"{WORK}/lb1/varnish/" in line}
    check("varnishd runs in its unix jail (users varnish and vcache)", users == {"varnish", "vcache"},
          sorted(users))
    # The storage's host is no ZEO client: lb1's firewall refuses its connection to varnish's
    # purge listener (before varnish's ACL would answer 405); the app host's PURGE works.
    storage_ns = HOSTS[STORAGES[common.STORAGE][0]][0]
    got = probe(storage_ns, [("10.231.0.4", 6081)])[0]
    check(f"PURGE from {storage_ns}: refused by lb1's firewall (ICMP admin-prohibited), varnish never sees it",
          got == "firewall", f"got {got}")
    got = in_ns("pdmh-app", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PURGE",
                "http://10.231.0.4:6081/Plone?purge-probe", capture=True, check=False)
    check("PURGE from pdmh-app -> 200", got == "200", f"got {got}")
    request = urllib.request.Request(base + "/Plone", method="PURGE")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            got = response.status
    except urllib.error.HTTPError as exc:
        got = exc.code
    check("PURGE through HAProxy -> 405", got == 405, f"got {got}")
    for label, passed, detail in acme_test():
        check(label, passed, detail)
    # Another checkout's buildout stack may use the demo ports of this namespace meanwhile:
    # only listeners of processes of this deployment (under WORK) count.
    local = sh("ss", "-Htlnp", capture=True)
    leaked = []
    for line in local.splitlines():
        if not re.search(r":(8100|8079|8081|8082|8080|8443|6081|6088)\s", line):
            continue
        for pid in re.findall(r"pid=(\d+)", line):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fp:
                    args = fp.read().replace(b"\0", b" ").decode(errors="replace")
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if WORK in args or cwd.startswith(WORK):
                leaked.append(line.split()[3])
    check("nothing of the deployment on this namespace's demo ports", not leaked, leaked)
    # The schedule: each job of the zeoserver's and the clients' cron file names its host's
    # prefix and runs a script the build made there.
    schedules = {
        "zeo": (("zeoserver", "zeo1", ("bin/zeopack", "bin/backup", "bin/snapshotbackup", "logrotate")),
                ("zeoclient", "app1", ("logrotate",))),
        "relstorage": (("postgresql", "db1", ("postgresql/pg-backup",)),
                       ("zeoclient", "app1", ("bin/zodbpack", "logrotate"))),
    }
    for role, host, wanted in schedules[common.STORAGE]:
        path = os.path.join("/etc/cron.d", CRON_FILES[role])
        text = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        jobs = [line for line in text.splitlines() if line and not line.startswith("#") and "=" not in line.split()[0]]
        missing = [w for w in wanted if not any(w in job and f"{WORK}/{host}/" in job for job in jobs)]
        check(f"{host}: cron schedule in {path} ({len(jobs)} jobs)", jobs and not missing, f"missing {missing}")
    if common.STORAGE == "relstorage":
        for label, passed, detail in database_cron_jobs_run():
            check(label, passed, detail)
    for label, passed, detail in ab_with_remote_workers():
        check(label, passed, detail)
    for label, passed, detail in service_user_checks() + exposure_checks():
        check(label, passed, detail)
    for label, passed, detail in selfheal_checks():
        check(label, passed, detail)
    for label, passed, detail in alert_test():
        check(label, passed, detail)
    for name in (STORAGES[common.STORAGE][0], "app1"):
        for label, passed, detail in crash_test(name):
            check(label, passed, detail)
    return ok
