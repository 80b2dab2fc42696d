"""What every load tool of plonedeploy shares, one module per concern; the subcommand
packages import from here and never from each other:

- ``cli``: the parser, the options every run has, exit 2 when the stack or wrk is missing;
- ``stack``: the stack's facts (``parts/stack/stack.json``, HAProxy's stats, processes);
- ``wrk``: the wrk driver (the A/B's Locust driver is ``loadtests.ab.measure``);
- ``procs``: process, CPU and RSS accounting, descriptors, waiting for quiet;
- ``stats``: percentiles, Little's law, spreads over rounds;
- ``reports``: the report folder, report.json/report.md, Markdown tables, plots;
- ``haproxy_stats``: HAProxy's stats CSV; ``haproxy_log``: its request log (queue waits,
  server times); ``balancers``: temporary HAProxys;
- ``extrabuild``: builds and runs ZEO clients beside the stack;
- ``cpubudget``: a fixed CPU budget for a process tree (a cgroup v1 ``cpu`` group with a quota).

Units: seconds for times and CPU, bytes for sizes, requests/s for rates, unless a name
says otherwise (``_us`` microseconds, ``_ms`` milliseconds).
"""
