"""``bin/stack``: start, stop and inspect the whole stack that ``plonedeploy.recipe:stack``
describes in ``parts/<name>/stack.json`` (or any config of that shape: loadtests.core.extrabuild
writes its own). Its own package, separate from the recipe that writes its configuration; the
load tools and the tests use its modules' functions, never the recipe class. This module
imports nothing, so that Ansible's controller can import :mod:`.rules` and :mod:`.rolling`
alone. Modules:

- :mod:`.cli`: the command line; :mod:`.supervisor`: supervisord, its config, the stages;
- :mod:`.service`: the service user's files and permissions; :mod:`.balancer`: HAProxy's
  states and the rolling restart of one client through :mod:`.rolling` (stdlib only, the
  same code the Ansible playbooks run on the balancers);
- :mod:`.rules`: the rules of a ZEO client and its place in HAProxy that both deploy paths
  (bin/buildout and Ansible) apply; :mod:`.errors`: :class:`StackError`.

Usage::

    bin/stack start [NAME ...] [--no-wait-up] [--timeout SECONDS]
    bin/stack wait-up [--timeout SECONDS]
    bin/stack stop [--timeout SECONDS]
    bin/stack restart [NAME ...] [--timeout SECONDS]
    bin/stack status

Every process runs as a program of a supervisord of the stack's own (supervisor, the egg
pinned in versions.cfg; the config is rendered into ``parts/<name>/supervisord.conf`` and
``parts/<name>/supervisor.d/`` from the same templates the Ansible role process_manager
renders; its socket ``var/run/supervisor.sock``, mode 0700; ``bin/supervisorctl`` talks to
it), with stdout/stderr appended to ``var/log/<name>.stdout.log``. supervisord starts
nothing by itself (autostart = false): the order is bin/stack's. It restarts a process that
exits (autorestart), stops each process group with SIGTERM and, after 30 s, SIGKILL.

``start`` starts supervisord if it does not run, then goes in stages (processes of one
stage start together, each stage once the readiness probes of the one before answer): ZEO,
then each client in turn, then HAProxy; processes that run already are left alone. With
names it starts only those and does not wait for HAProxy's health checks (``bin/stack start
postgresql``: the database alone, for ``bin/zodbconvert`` or ``bin/postgresql restore``).
A process that exits while it starts, or a port taken by a program supervisord did not
start, fails the start, and what it started is stopped again.
``stop`` stops the processes through supervisord (HAProxy, clients, then ZEO), waiting up
to ``--timeout`` seconds for each (default 60), then shuts supervisord down. ``restart``
restarts the named processes (default: every ZEO client) one at a time; each client that
HAProxy balances goes through the rolling restart of :mod:`plonedeploy.stack.rolling`, the
same code the Ansible playbooks run on their balancers (drained through HAProxy's runtime
API until its in-flight requests finished, put in MAINT, restarted through supervisord,
waited for until its health check path answers 200, enabled, waited for until HAProxy has
it UP), and only then is the next one touched, so a pool of two or more clients never
stops serving. Other processes are stopped and started. Exit status: 0 on success, 1 with
a message on stderr otherwise, 3 from ``status`` when not every process runs, and 141
without a message when the reader of stdout went away (``bin/stack status | head``), as
for a Unix tool killed by SIGPIPE.
"""
