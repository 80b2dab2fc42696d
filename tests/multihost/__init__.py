"""Multi-host deployment for real: four network namespaces, sshd in each, site.yml over SSH.

Usage (root; ``make multihost``, ``make multihost MULTIHOST_STORAGE=relstorage``)::

    cd tests && ../.venv/bin/python -m multihost [--keep] [--storage zeo|relstorage]

``--storage relstorage`` deploys ``inventories/multihost-relstorage`` instead: PostgreSQL
(the postgresql role) on ``pdmh-db`` (10.231.0.6) in place of the ZEO server, the clients
RelStorage clients of it, and checks the database side (below) instead of ZEO's.

What it does, and undoes at the end (also after a failure, unless ``--keep``):

1. creates a bridge ``pdmh0`` (10.231.0.1/24) in this namespace and four namespaces
   ``pdmh-zeo`` (10.231.0.2), ``pdmh-app`` (10.231.0.3), ``pdmh-lb`` (10.231.0.4),
   ``pdmh-lg`` (10.231.0.5, the load generator), each joined to the bridge by a veth pair
   and running its own sshd (key-only root login);
2. runs ``ansible-playbook -i inventories/multihost -i <generated> site.yml`` over SSH:
   the multihost inventory's group_vars with these addresses and one prefix per host
   under /tmp/pdmh (the namespaces share this machine's file system);
3. verifies: every program RUNNING in its namespace; the four paths through HAProxy at
   10.231.0.4:8080 (blob 5,242,880 bytes); the edge rules (a foreign Host gets 421, a
   100 kB POST goes to the upload client, a 100-byte one to the pool); ZEO listens only on 10.231.0.2 and the app
   host's ZEO connections go from 10.231.0.3 to 10.231.0.2:8100 (namespace network); the
   mixed pool: pyruvate (client1, client4), waitress and gunicorn (client3, ``threads:
   auto``) each serve, and client3's threads and its HAProxy maxconn are the recipe's auto
   rule for app1;
   the cache tier (varnish on lb1): the second anonymous /Plone over https is a hit,
   varnish listens on 127.0.0.1:6081 and 10.231.0.4:6081 (the app host's purges), a PURGE
   from a namespace that is not a ZEO client (zeo1) gets 405, one from the app host 200;
   nothing listens on the demo ports of this namespace's loopback; the schedule: zeo1's
   cron file (/etc/cron.d/plonedeploy-multihost-zeoserver) has its zeopack, backup,
   snapshotbackup and logrotate jobs, app1's its logrotate job; the A/B test with its
   Locust master here (10.231.0.1, the control host) and its users on lg1's two workers
   (``python -m loadtests ab --deployed --remote-workers 2``, HAProxy's stats through an SSH
   tunnel to lb1's localhost): both servers answer, no failure, every request HAProxy logs
   comes from 10.231.0.5, which is served on the plain port while others get 301;
   alerts: Alertmanager on lb1 sends to a webhook receiver this script runs on the control
   host (10.231.0.1:15580); self-healing (issue 28): lb1's HAProxy checks ``/readyz`` on each
   client's metrics port over the namespace network (all L7OK, each answers 200 to lb1),
   client2's memory watchdog (``memory_limit: 64MB``, 1 recycle per hour in the inventory)
   recycled it once, drained, then its backoff holds it and ZopeClientMemoryNotRecycled
   reaches the receiver; with every ZEO client of app1 stopped, the blackbox exporter's
   probe of https://10.231.0.4/Plone/@@ok fails and "SiteDown" must reach the receiver
   within 180 s; after the clients are started again, its resolution within 300 s;
   ACME: Debian's pebble runs in a sixth namespace ``pdmh-acme`` (10.231.0.8, no sshd; its
   HTTPS certificate from a test CA made here, the balancer's name ``lb1.pdmh.test`` in
   /etc/netns/pdmh-acme/hosts, HTTP-01 on lb1's plain listener 8080); lb1's certbot gets its
   certificate in the first run (checked: chain to pebble's root, the files' modes and
   owners, the challenge through HAProxy's backend acme), then the cron job's renewal
   command, forced, runs under two GET loops over https: 0 failed, a new serial;
   with ``--storage relstorage`` instead of ZEO's checks: PostgreSQL listens on
   10.231.0.6:5432 only, app1's connections go from 10.231.0.3 there, the clients'
   zope.conf has ``<relstorage>`` and no ``<zeoclient>``, the site's objects and its blob
   are rows of the database, a login from lb1 (not a client host) with the right password
   is refused by pg_hba.conf while the same login from app1 works, and the cron jobs (db1:
   pg_dump with retention; app1: zodbpack, logrotate) run once the way cron runs them (the
   dump lands, mode 0600);
4. runs site.yml a second time (expects changed=0), then the canary deploy of a release
   like the running one (``site.yml -e plonedeploy_canary=true``, short phases; client1
   the canary, client4 its comparison) under two GET loops from lg1 through lb1: verdict
   promote, app1's ``current`` and every client's ``plonedeploy_release_info`` the new
   release, 0 failed requests; and the same run again: changed=0;
5. tears down: supervisord of each host (which stops its programs), sshd and pebble by PID,
   the namespaces and the bridge, the cron files and /etc/netns/pdmh-acme.

Prints each PLAY RECAP with its wall time. Exit status 0 when every check passed.
All traffic stays on this machine: the bridge and namespaces exist only during the run.

It imports ``plonedeploy.stack`` (rules, rolling): the kit's distributions must be installed
in the venv that runs it (``make venv`` installs them, editable).

The package's modules:

- ``common``: the run's hosts, addresses and state, and the helpers to run commands;
- ``setup_hosts``: packages, the bridge, the namespaces with their sshd, pebble, the inventory;
- ``teardown_hosts``: stops and removes all of it;
- ``verify``: the checks' sequence and the deployment's own checks (paths, edge, pool, cache);
- ``exposure``: listeners and who reaches them, the processes' users;
- ``acme``: the certificate from pebble and its renewal under load;
- ``resilience``: crash and boot, self-healing, the alert webhook;
- ``database``: PostgreSQL and RelStorage checks (``--storage relstorage``);
- ``ab_remote``: the A/B test with its workers on lg1;
- ``canary``: the canary deploy's promote path under load from lg1, and its second run;
- ``main``: the main sequence (setup, two site.yml runs, verify, the canary step, teardown);
- ``__main__``: ``python -m multihost`` from tests/ (``make multihost``).

``import multihost`` (tests/ on sys.path) gives the hosts and storages below without
importing the rest (tests/test_doc_figures.py reads them).
"""
from .common import ALL_HOSTS, HOSTS, STORAGES  # noqa: F401  (the package's names for tests)
