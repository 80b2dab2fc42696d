"""The database side of ``--storage relstorage``: PostgreSQL on db1 (its listener, app1's
connections, the password's files and that it leaks nowhere, the site's rows, pg_hba and
the firewall) and its cron jobs (pg_dump with retention, zodbpack) run as cron runs them."""
import os
import re
import subprocess
import time

from .common import CRON_FILES, PG_PORT, WORK, in_ns


PSQL = "/usr/lib/postgresql/15/bin/psql"


def _superuser_sql(query):
    """``query`` in db1's site database as the superuser (root -> postgres by peer on the
    Unix socket, pg_ident.conf); its output (-At: values only)."""
    return in_ns("pdmh-db", PSQL, "-X", "-At", "-h", f"{WORK}/db1/postgresql/run", "-p", str(PG_PORT),
                 "-U", "postgres", "-d", "plone", "-c", query, capture=True, check=False).strip()


def database_checks():
    """PostgreSQL on db1 and the RelStorage clients on app1 (--storage relstorage).
    Returns ``[(label, passed, detail)]``; no detail ever holds the password."""
    results = []
    listening = in_ns("pdmh-db", "ss", "-Htln", capture=True)
    others = [a for a in re.findall(r"(\S+:%d)\s" % PG_PORT, listening) if a != f"10.231.0.6:{PG_PORT}"]
    results.append((f"PostgreSQL listens on 10.231.0.6:{PG_PORT} only (not 0.0.0.0, *, 127.0.0.1)",
                    f"10.231.0.6:{PG_PORT}" in listening and not others, others))
    conns = in_ns("pdmh-app", "ss", "-Htn", "state", "established", "dst", f"10.231.0.6:{PG_PORT}", capture=True)
    results.append((f"app1's database connections: 10.231.0.3 -> 10.231.0.6:{PG_PORT} over the namespace network",
                    "10.231.0.3:" in conns, f"{len(conns.splitlines())} connections"))
    password_file = f"{WORK}/db1/postgresql/password"
    passfile = f"{WORK}/app1/zeoclient/var/pgpass"
    password = open(password_file, encoding="ascii").read().strip()
    modes = {path: oct(os.stat(path).st_mode & 0o777) for path in (password_file, passfile)}
    results.append(("the password file on db1 and the passfile on app1 are 0600, 32 characters",
                    set(modes.values()) == {"0o600"} and len(password) == 32
                    and open(passfile, encoding="ascii").read().strip().endswith(":" + password), modes))
    zope_conf = open(f"{WORK}/app1/zeoclient/current/parts/client1/etc/zope.conf", encoding="utf-8").read()
    results.append(("client1's zope.conf: <relstorage> on db1 with the passfile, no password, no <zeoclient>",
                    "<relstorage>" in zope_conf and f"host=10.231.0.6 port={PG_PORT} dbname=plone" in zope_conf
                    and f"passfile={passfile}" in zope_conf and "<zeoclient>" not in zope_conf
                    and password not in zope_conf, ""))
    # The built parts (zope.conf, the tools' configs), the logs, and the playbook's output.
    leaked = []
    for directory in (f"{WORK}/app1/zeoclient/current/parts", f"{WORK}/app1/var/log", f"{WORK}/db1/var/log",
                      f"{WORK}/app1/zeoclient/var/log"):
        for base, _dirs, files in os.walk(directory):
            for name in files:
                with open(os.path.join(base, name), "rb") as fp:
                    if password.encode() in fp.read():
                        leaked.append(os.path.join(base, name))
    for name in os.listdir(WORK):
        if name.endswith(".log") and password in open(os.path.join(WORK, name), encoding="utf-8").read():
            leaked.append(name)
    results.append(("the password is in no part, log or playbook output", not leaked, leaked))
    # The site lives in PostgreSQL: Zope's objects and the 5 MiB blob are rows of db1.
    objects, blob_bytes = _superuser_sql("SELECT count(*) FROM object_state"), _superuser_sql(
        "SELECT coalesce(sum(length(lo_get(chunk))), 0) FROM blob_chunk")
    results.append(("the site's objects and its blob are rows of db1's database (object_state, blob_chunk)",
                    objects.isdigit() and int(objects) > 100 and blob_bytes.isdigit()
                    and int(blob_bytes) >= 5 * 1024 * 1024, f"{objects} objects, {blob_bytes} blob bytes"))
    # The right password from a host that is not a ZEO client is refused by address; the
    # same login from app1 works (so it is the address, not the password).
    login = [PSQL, "-X", "-At", "-c", "SELECT 1",
             f"host=10.231.0.6 port={PG_PORT} dbname=plone user=plone passfile={passfile} connect_timeout=10"]
    refused = subprocess.run(["ip", "netns", "exec", "pdmh-lb", *login], capture_output=True, text=True,
                             timeout=60, check=False)
    allowed = subprocess.run(["ip", "netns", "exec", "pdmh-app", *login], capture_output=True, text=True,
                             timeout=60, check=False)
    # lb1 is no ZEO client: db1's firewall refuses its connection before pg_hba.conf would
    # (no route to host: ICMP admin-prohibited); the same login from app1 works.
    results.append(("a login from lb1 (10.231.0.4, no ZEO client) is refused by db1's firewall; from app1 it works",
                    refused.returncode != 0 and "No route to host" in refused.stderr
                    and allowed.returncode == 0 and allowed.stdout.strip() == "1",
                    f"lb1: exit {refused.returncode} {refused.stderr.strip()[-200:]}; app1: exit {allowed.returncode}"))
    return results


def database_cron_jobs_run():
    """db1's pg_dump job and app1's zodbpack job, read from their /etc/cron.d files and run
    the way cron runs them (``/bin/sh -c``, cron's environment, in the host's namespace):
    three dumps with postgresql_backup_keep 2 leave the newest two, each mode 0600 and
    readable by pg_restore. Returns ``[(label, passed, detail)]``."""
    results = []
    jobs = {}
    for role in ("postgresql", "zeoclient"):
        with open(os.path.join("/etc/cron.d", CRON_FILES[role]), encoding="utf-8") as fp:
            for line in fp:
                if line.strip() and not line.startswith("#") and "=" not in line.split()[0]:
                    command = line.split(None, 6)[6].strip()
                    jobs[command.split()[0].rsplit("/", 1)[-1]] = command
    cron_env = {"SHELL": "/bin/sh", "PATH": "/usr/bin:/bin", "HOME": "/root", "LOGNAME": "root"}
    backups = f"{WORK}/db1/backups/postgresql"
    outputs = []
    for ns, job, times in (("pdmh-db", "pg-backup", 3), ("pdmh-app", "zodbpack", 1)):
        for _ in range(times):
            time.sleep(1.1)  # the dumps are named by the second
            started = time.monotonic()
            result = subprocess.run(["ip", "netns", "exec", ns, "env", "-i", *(f"{k}={v}" for k, v in cron_env.items()),
                                     "/bin/sh", "-c", jobs.get(job, "false")], cwd="/", capture_output=True,
                                    text=True, timeout=600, check=False)
            outputs.append((job, result.returncode, round(time.monotonic() - started, 1), result.stderr[-500:]))
    results.append(("the cron jobs pg-backup (3 times) and zodbpack run as cron runs them, exit 0",
                    sorted(jobs) == ["logrotate", "pg-backup", "zodbpack"] and all(o[1] == 0 for o in outputs),
                    [o[:3] if o[1] == 0 else o for o in outputs]))
    dumps = sorted(os.listdir(backups)) if os.path.isdir(backups) else []
    modes = {name: oct(os.stat(os.path.join(backups, name)).st_mode & 0o777) for name in dumps}
    listed = [subprocess.run(["/usr/lib/postgresql/15/bin/pg_restore", "--list", os.path.join(backups, name)],
                             capture_output=True, text=True, timeout=60, check=False) for name in dumps]
    results.append(("the dumps land in db1's backup directory, mode 0600, the newest 2 kept, pg_restore reads them",
                    len(dumps) == 2 and all(n.startswith("plone-") and n.endswith(".dump") for n in dumps)
                    and set(modes.values()) == {"0o600"}
                    and all(r.returncode == 0 and "TABLE DATA public object_state" in r.stdout for r in listed),
                    {name: (modes[name], os.path.getsize(os.path.join(backups, name))) for name in dumps}))
    return results
