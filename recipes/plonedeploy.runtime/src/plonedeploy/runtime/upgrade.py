"""``bin/upgrade-site``: run the Plone site's pending GenericSetup upgrade steps, once.

What it runs: the pending upgrade steps of Plone's own profile (through Plone's migration
tool, ``portal_migration.upgrade``, as the ``@@plone-upgrade`` page does) and then of every
installed profile with pending steps (``portal_setup.listProfilesWithPendingUpgrades`` and
``portal_setup.upgradeProfile``: Products.GenericSetup's own machinery), each profile in a
transaction of its own. It prints one line per step it ran (``ran: PROFILE SOURCE -> DEST:
TITLE``) or ``nothing pending``.

Where: in a ZEO client's Python (its ``bin/interpreter``, its ``zope.conf``), as
``bin/<client> run`` would run a script, but as a process of its own whose exit status is
kept (``bin/<client> run`` reduces it to 0 or 1) and whose arguments reach it unquoted.
The build's ``[upgrade-site]`` part (zc.recipe.egg) writes ``bin/upgrade-site``, which
calls :func:`main` with the client's part directory; ``--help`` and bad arguments are
answered there, without starting Zope.
Started as root on a build with a service user (the client part's ``service-user``, which
``make build`` as root sets), the client's ``bin/interpreter`` drops to that user before
anything else (plonedeploy.runtime.access.become), as ``bin/<client>`` does for each of its
commands: the steps run, and write the event log and any blob, as the service user.

A run with nothing pending writes nothing. The lock: several hosts may run it at the same
time (a deployment starts it on each), and a process manager's lock is per host, so the lock
is kept in the ZODB: a ``PersistentMapping`` in the site's annotations (``LOCK_KEY``)
holding the holder (host, pid), a token and a heartbeat (seconds since the epoch). Taking it
is a transaction of its own, committed before any step runs (what is pending is read again
after it); two runs that take it at once write the same object,
and ZODB lets one commit and raises ConflictError in the other, which then reads the lock
held and refuses (exit 3). The holder renews the heartbeat with every profile it commits;
a lock whose heartbeat is older than ``--lock-timeout`` seconds (default
``DEFAULT_LOCK_TIMEOUT``, an hour) is stale -- its run died -- and the next run takes it
over, saying so. The hosts' clocks must agree to well within that timeout.

Exit status (``EXIT_*``): 0 steps ran, or nothing was pending; 1 a step failed or a commit
conflicted three times (that profile's transaction aborted, the profiles before it stay
upgraded); 2 bad arguments; 3 another run holds the lock; 4 no Plone site at ``--site``;
143 ended by SIGTERM, which, like Ctrl-C, frees the lock on the way out.
"""
import argparse
import os
import signal
import socket
import sys
import time
import uuid

DEFAULT_SITE = "Plone"
#: Seconds after the holder's last heartbeat (taking the lock, or committing a profile) at
#: which a lock counts as stale and another run may take it over. An hour: far above the
#: seconds the kit's own steps take, and above most single profiles of a Plone major
#: upgrade; a longer one needs ``--lock-timeout``.
DEFAULT_LOCK_TIMEOUT = 3600
#: The key of the lock in the site's annotations.
LOCK_KEY = "plonedeploy.upgrade-site.lock"
#: How often a transaction is tried when its commit conflicts with another one.
ATTEMPTS = 3

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_LOCKED, EXIT_NO_SITE = 0, 1, 2, 3, 4

HELP_EPILOG = f"""\
Runs the pending GenericSetup upgrade steps of the site: Plone's own profile first (its
migration tool, as the @@plone-upgrade page), then every installed add-on profile with
pending steps, each profile in a transaction of its own, in one ZEO client's Python (the
ZEO server must be up; the clients may serve meanwhile). Started as root on a build with a
service user, it runs as that user, as the client's own script does. Prints one line per step it ran,
"ran: PROFILE SOURCE -> DEST: TITLE", or "nothing pending".

The lock: kept in the ZODB (the site's annotation {LOCK_KEY!r}), so one run at a time
across every host. A second run refuses while the lock is held; a lock whose holder has
not committed for --lock-timeout seconds (default {DEFAULT_LOCK_TIMEOUT} s) is stale and
taken over.

exit status:
  0  steps ran, or nothing was pending
  1  a step failed, or its commit conflicted {ATTEMPTS} times: that profile's transaction
     is aborted (the profiles before it stay upgraded); read the client's event log, fix,
     run again
  2  bad arguments
  3  another run holds the lock: wait for it, or after a crashed run for --lock-timeout
  4  no Plone site at --site
  143  ended by SIGTERM (the lock is freed; Ctrl-C too, with a traceback)
"""


def parser():
    """The command line of ``bin/upgrade-site`` (an ``argparse.ArgumentParser``)."""
    p = argparse.ArgumentParser(
        prog="bin/upgrade-site", epilog=HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the Plone site's pending GenericSetup upgrade steps once, under a lock kept in the ZODB.")
    p.add_argument("--site", default=DEFAULT_SITE,
                   help=f"the Plone site's id in the Zope root (default {DEFAULT_SITE})")
    p.add_argument("--dry-run", action="store_true",
                   help="list the pending steps (\"pending: ...\" lines) and change nothing; takes no lock")
    p.add_argument("--lock-timeout", type=positive_seconds, default=DEFAULT_LOCK_TIMEOUT, metavar="SECONDS",
                   help="seconds without a heartbeat after which a held lock is stale "
                        f"(default {DEFAULT_LOCK_TIMEOUT})")
    return p


def positive_seconds(text):
    """argparse type: a positive number of seconds (int), else ArgumentTypeError."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number of seconds, got {text!r}")
    return value


def main(client=None, argv=None):
    """``bin/upgrade-site``: check the arguments, then replace this process by the client's
    Python running this module (:func:`run_in_zope`). ``client``: the ZEO client's part
    directory (``parts/instance``: its ``bin/interpreter`` and ``etc/zope.conf``), given by
    the ``[upgrade-site]`` part. Returns an exit status only when it cannot start."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser().parse_args(argv)  # --help and bad arguments end here, before Zope starts
    if not client:
        print("bin/upgrade-site: no client part given; run the bin/upgrade-site the build wrote", file=sys.stderr)
        return EXIT_USAGE
    interpreter = os.path.join(client, "bin", "interpreter")
    zope_conf = os.path.join(client, "etc", "zope.conf")
    for path in (interpreter, zope_conf):
        if not os.path.exists(path):
            print(f"bin/upgrade-site: {path} is missing: build the client part first (bin/buildout)", file=sys.stderr)
            return EXIT_USAGE
    # "--": the interpreter's getopt would otherwise read this module's options as its own.
    os.execv(interpreter, [interpreter, "-m", __name__, "--", "--zope-conf", zope_conf, *argv])


# -- the lock, as plain data (a mapping), so that its rules need no Zope to be read ------

def holder_text():
    """Who runs this process: ``"HOST pid PID"``."""
    return f"{socket.gethostname()} pid {os.getpid()}"


def lock_holder(lock, now, timeout):
    """The holder of ``lock`` (a mapping: ``holder``, ``token``, ``heartbeat`` in seconds
    since the epoch) while it is held and fresh, else None: free, or stale because its
    heartbeat is more than ``timeout`` seconds before ``now``."""
    if not lock or not lock.get("token"):
        return None
    if now - lock.get("heartbeat", 0) > timeout:
        return None
    return lock.get("holder") or "an unnamed run"


def take(lock, token, holder, now):
    """Write this run into ``lock`` (a mutable mapping). Returns what it replaced: None, or
    ``(holder, seconds since its heartbeat)`` of the stale lock taken over."""
    replaced = (lock.get("holder"), now - lock.get("heartbeat", now)) if lock.get("token") else None
    lock.update(holder=holder, token=token, since=now, heartbeat=now)
    return replaced


def step_line(verb, profile, info):
    """One output line for upgrade step ``info`` (GenericSetup's upgrade info dict) of
    ``profile``: ``"VERB: PROFILE SOURCE -> DEST: TITLE"``."""
    return f"{verb}: {profile} {info['ssource']} -> {info['sdest']}: {info['title']}"


# -- inside Zope ----------------------------------------------------------------------------

def flat(upgrades):
    """GenericSetup's ``listUpgrades`` result (dicts, and lists of dicts for nested steps)
    as one flat list of dicts, in the order ``upgradeProfile`` runs them."""
    steps = []
    for upgrade in upgrades:
        steps.extend(upgrade if isinstance(upgrade, list) else [upgrade])
    return steps


def pending(site):
    """``[(profile id, [upgrade info, ...]), ...]``: what would run now, in that order --
    Plone's base profile first (its migration tool's steps, which stop at the version of
    the code), then each other installed profile with pending steps, by id."""
    from Products.CMFCore.utils import getToolByName

    setup = getToolByName(site, "portal_setup")
    migration = getToolByName(site, "portal_migration")
    base = migration.get_profile()
    plan = []
    steps = migration.list_steps()
    if steps:
        plan.append((base, steps))
    for profile in sorted(setup.listProfilesWithPendingUpgrades()):
        if profile != base:
            steps = flat(setup.listUpgrades(profile))
            if steps:
                plan.append((profile, steps))
    return plan


def still_pending(site, profile):
    """True while ``profile`` has upgrade steps to run."""
    from Products.CMFCore.utils import getToolByName

    migration = getToolByName(site, "portal_migration")
    if profile == migration.get_profile():
        return bool(migration.list_steps())
    return bool(flat(getToolByName(site, "portal_setup").listUpgrades(profile)))


def upgrade_profile(site, profile):
    """Run ``profile``'s pending steps in the current transaction (not committed).

    Plone's base profile goes through ``portal_migration.upgrade`` (which also upgrades
    the core add-ons it lists, recatalogs and updates role mappings when a step asks),
    with errors raised, not swallowed; RuntimeError if it did not reach the code's version.
    Any other profile: ``portal_setup.upgradeProfile``."""
    from Products.CMFCore.utils import getToolByName

    migration = getToolByName(site, "portal_migration")
    if profile == migration.get_profile():
        migration.upgrade(swallow_errors=False)
        if migration.needUpgrading():
            raise RuntimeError(f"Plone's upgrade stopped at {migration.getInstanceVersion()}, the code is at "
                               f"{migration.getFileSystemVersion()}: see the client's event log")
    else:
        getToolByName(site, "portal_setup").upgradeProfile(profile)


def lock_of(site, create=False):
    """The site's lock mapping (``LOCK_KEY`` in its annotations), made when ``create``."""
    from persistent.mapping import PersistentMapping
    from zope.annotation.interfaces import IAnnotations

    annotations = IAnnotations(site)
    lock = annotations.get(LOCK_KEY)
    if lock is None and create:
        lock = annotations[LOCK_KEY] = PersistentMapping()
    return lock


def acquire(site, token, holder, timeout, out, err):
    """Take the site's lock in a committed transaction of its own. Returns True when taken;
    False (after printing why) when another run holds it."""
    import transaction
    from ZODB.POSException import ConflictError

    for _ in range(ATTEMPTS):
        transaction.begin()
        lock = lock_of(site, create=True)
        now = time.time()
        other = lock_holder(lock, now, timeout)
        if other is not None:
            transaction.abort()
            err(f"refused: another bin/upgrade-site holds the lock: {other}, since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(lock.get('since', now)))}; "
                f"wait for it to finish (or, if it died, for its lock to go stale {timeout} s "
                "after its last heartbeat) and run again")
            return False
        replaced = take(lock, token, holder, now)
        transaction.get().note(f"bin/upgrade-site: lock taken by {holder}")
        try:
            transaction.commit()
        except ConflictError:
            # Another run wrote the lock since this transaction began: read it again.
            transaction.abort()
            continue
        if replaced:
            out(f"took over a stale lock of {replaced[0]} (last heartbeat {replaced[1]:.0f} s ago, "
                f"timeout {timeout} s)")
        return True
    err(f"refused: the lock's commit conflicted {ATTEMPTS} times (other runs are taking it); run again")
    return False


def release(site, token):
    """Free the lock if this run (``token``) still holds it; committed."""
    import transaction
    from ZODB.POSException import ConflictError

    for _ in range(ATTEMPTS):
        transaction.begin()
        lock = lock_of(site)
        if lock is None or lock.get("token") != token:
            transaction.abort()
            return
        lock.update(token=None, holder=None, released=time.time())
        transaction.get().note("bin/upgrade-site: lock released")
        try:
            transaction.commit()
            return
        except ConflictError:
            transaction.abort()


def commit_profile(site, profile, token):
    """Run ``profile``'s pending steps, renew the lock's heartbeat and commit, trying again
    (from a fresh view of the database) when the commit conflicts with a live write.
    Raises RuntimeError when the lock is no longer this run's, or after ``ATTEMPTS``
    conflicts."""
    import transaction
    from ZODB.POSException import ConflictError

    for _ in range(ATTEMPTS):
        transaction.begin()
        lock = lock_of(site)
        if lock is None or lock.get("token") != token:
            transaction.abort()
            raise RuntimeError(f"the lock was taken over by {lock and lock.get('holder')} (this run's heartbeat "
                               "was older than its --lock-timeout): stopping")
        if still_pending(site, profile):
            upgrade_profile(site, profile)
        lock["heartbeat"] = time.time()
        transaction.get().note(f"bin/upgrade-site: upgraded {profile}")
        try:
            transaction.commit()
            return
        except ConflictError:
            transaction.abort()
    raise RuntimeError(f"the commit of {profile} conflicted {ATTEMPTS} times with other writes: run again")


def upgrade_site(app, site_id, dry_run=False, timeout=DEFAULT_LOCK_TIMEOUT, out=print, err=None):
    """Run (or with ``dry_run`` list) the pending upgrade steps of the Plone site
    ``site_id`` in the Zope root ``app``; returns the exit status (``EXIT_*``). ``out`` and
    ``err``: where the lines go (default stdout, stderr)."""
    import transaction
    from Products.CMFCore.utils import getToolByName
    from zope.component.hooks import setSite

    if err is None:
        def err(line):
            print(line, file=sys.stderr)

    site = app.get(site_id)
    if site is None or getToolByName(site, "portal_migration", None) is None:
        err(f"no Plone site /{site_id} in this database: create it (make site) or name it with --site")
        return EXIT_NO_SITE
    setSite(site)
    if dry_run:
        plan = pending(site)
        for profile, steps in plan:
            for info in steps:
                out(step_line("pending", profile, info))
        holder = lock_holder(lock_of(site), time.time(), timeout)
        if not plan:
            out("nothing pending")
        if holder:
            out(f"(another run holds the lock: {holder})")
        transaction.abort()
        return EXIT_OK
    # Nothing pending: done without a write (no lock taken, no transaction committed).
    transaction.begin()
    if not pending(site):
        transaction.abort()
        out("nothing pending")
        return EXIT_OK
    transaction.abort()
    token = uuid.uuid4().hex
    if not acquire(site, token, holder_text(), timeout, out, err):
        return EXIT_LOCKED
    started = time.monotonic()
    reported = set()
    try:
        transaction.begin()
        # Read again after the lock's commit: a run that held it before has committed its work.
        plan = pending(site)
        transaction.abort()
        if not plan:
            out("nothing pending")
            return EXIT_OK
        for profile, _ in plan:
            commit_profile(site, profile, token)
            transaction.begin()
            # Plone's migration upgrades the core add-ons it lists too: report every profile
            # the commit brought up to date.
            for done, steps in plan:
                if done not in reported and not still_pending(site, done):
                    reported.add(done)
                    for info in steps:
                        out(step_line("ran", done, info))
            transaction.abort()
        count = sum(len(steps) for profile, steps in plan if profile in reported)
        out(f"upgraded {len(reported)} profile(s), {count} step(s) in {time.monotonic() - started:.1f} s")
        return EXIT_OK
    except Exception as exc:  # a step's error: report it, free the lock, exit 1
        transaction.abort()
        import traceback

        traceback.print_exc()
        err(f"failed: {exc.__class__.__name__}: {exc} -- the profile's transaction was aborted"
            + (f"; already committed: {', '.join(sorted(reported))}" if reported else "")
            + "; fix the cause (the client's event log has the steps' messages) and run again")
        return EXIT_FAILED
    finally:
        release(site, token)


def run_in_zope(argv):
    """Start Zope from ``--zope-conf`` (as ``bin/<client> run`` does: a request, the system
    user) and run :func:`upgrade_site`; returns the exit status."""
    p = parser()
    p.add_argument("--zope-conf", required=True, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from AccessControl.SecurityManagement import newSecurityManager
    from AccessControl.SpecialUsers import system
    from Testing.makerequest import makerequest
    from zope.globalrequest import setRequest
    from Zope2.Startup.run import configure_wsgi

    configure_wsgi(args.zope_conf)
    import transaction
    import Zope2

    # SIGTERM (a timeout, a process manager) ends the run as Ctrl-C does: through the
    # finally that frees the lock, rather than leaving it held until it goes stale.
    signal.signal(signal.SIGTERM, _terminated)

    app = makerequest(Zope2.app())
    app.REQUEST["PARENTS"] = [app]
    setRequest(app.REQUEST)
    newSecurityManager(None, system)
    try:
        return upgrade_site(app, args.site, dry_run=args.dry_run, timeout=args.lock_timeout,
                            out=lambda line: print(line, flush=True))
    finally:
        transaction.abort()
        app._p_jar.close()


def _terminated(signum, frame):
    """SIGTERM handler: exit with 128 + the signal's number, unwinding (finally clauses run)."""
    sys.exit(128 + signum)


if __name__ == "__main__":
    sys.exit(run_in_zope(sys.argv[1:]))
