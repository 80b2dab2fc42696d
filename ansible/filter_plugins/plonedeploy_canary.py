"""Jinja2 filter of the canary role: which client is the canary, and whom it is compared with.

- ``pool | plonedeploy_canary_choice(name, default_server)``: ``pool`` is
  ``{host: zeoclient_clients}`` (the page pool's hosts, in inventory order), ``name`` the
  canary's client name (``canary_client``; empty: the first page client that has
  another page client of its WSGI server), ``default_server`` the WSGI server of an entry that
  names none (the zeoclient role's default). Returns ``{"canary": {"host", "name", "server"},
  "compare": [{"host", "name", "server"}, ...]}``: the comparison clients are every other
  page client (lane ``pages``) of the canary's WSGI server, on any host.
- ``stats_csv | plonedeploy_canary_served(server, backend="zeoclients")``: the requests
  ``server`` answered since HAProxy started (its ``stot``), from the text of HAProxy's
  ``/stats;csv`` page; an error naming the server when the page has no row for it.

The rule (issue 29): the canary is judged against clients of the *same* WSGI server; another
server's differences would be taken for the release's. Upload-lane clients get no page
traffic and are never a canary nor a comparison. Errors: AnsibleFilterError naming the
variable, the clients and what is allowed.
"""


def _pages(pool, default_server):
    return [{"host": host, "name": client["name"], "server": client.get("wsgi_server") or default_server}
            for host, clients in (pool or {}).items() for client in clients or []
            if (client.get("lane") or "pages") == "pages"]


def canary_choice(pool, name, default_server):
    from ansible.errors import AnsibleFilterError
    from plonedeploy.stack.rules import canary_and_peers

    pages = _pages(pool, default_server)
    # keyed by position: a client name may repeat across hosts when canary_client is empty
    candidates = range(len(pages))
    if name:
        candidates = [index for index, client in enumerate(pages) if client["name"] == name]
        named = [pages[index] for index in candidates]
        if not named:
            raise AnsibleFilterError(
                f"canary_client = {name!r} is not a page client (lane pages) of the pool; "
                f"expected one of {sorted({c['name'] for c in pages})} or empty (the first one that has another "
                "client of its WSGI server)")
        if len(named) > 1:
            raise AnsibleFilterError(f"canary_client = {name!r} names a client on several hosts "
                                     f"({[c['host'] for c in named]}): HAProxy's server names must be unique")
    chosen = canary_and_peers({index: c["server"] for index, c in enumerate(pages)}, candidates)
    if chosen:
        return {"canary": pages[chosen[0]], "compare": [pages[index] for index in chosen[1]]}
    servers = {c["name"]: c["server"] for c in pages}
    raise AnsibleFilterError(
        (f"canary_client = {name!r} has" if name else "no page client has")
        + " another page client of its WSGI server to be compared with (the canary is judged against clients of "
        f"the same server): page clients and their servers {servers}; add a client of the same wsgi_server")


def canary_served(stats_csv, server, backend="zeoclients"):
    import csv

    from ansible.errors import AnsibleFilterError

    rows = csv.DictReader(line.lstrip("# ") if number == 0 else line
                          for number, line in enumerate(str(stats_csv).splitlines()))
    for row in rows:
        if row.get("pxname") == backend and row.get("svname") == server:
            return int(row["stot"] or 0)
    raise AnsibleFilterError(f"HAProxy's stats have no server {server!r} in backend {backend!r}")


class FilterModule:
    def filters(self):
        return {"plonedeploy_canary_choice": canary_choice, "plonedeploy_canary_served": canary_served}
