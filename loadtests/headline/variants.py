"""HAProxy variants that ``headline`` measures on the blob path beside the stack's HAProxy.

Each variant is the stack's own HAProxy config (:class:`loadtests.core.balancers.TemporaryBalancer`:
the template with the stack's variables, two free ports, no TLS or cache tier) run with more
haproxy command-line options and/or more ``global`` lines. The lines go to ``extra.cfg``
beside the variant's ``haproxy.cfg``, passed as a second ``-f``: HAProxy merges the second
file's ``global`` section into the first's, so the template stays as deployed.

Target names: ``haproxy-<variant>`` (``haproxy-copy``, ...). Ratios, per round (req/s of the
blob): ``haproxy-<variant>/haproxy-same blob``, the variant against ``same``, a temporary
HAProxy of the unchanged config, started with it (the stack's own HAProxy differs from every
temporary one in more than the setting: a TLS listener, the cache tier, its age; on 28 Nov
2026 every variant, a copying one too, beat it: docs/results.md); ``same`` itself against the
stack's, ``haproxy-same/haproxy blob``; ``copy`` the other way round, ``haproxy blob
splice/copy``, the figure docs/results.md quotes; ``pyruvate-alone`` (the stack's config
with only its pyruvate client as server) against that client directly, ``haproxy-pyruvate-alone/pyruvate
blob``: what the balancer itself costs on the blob, without a slower client in the pool.
"""
import os
from collections import namedtuple

from loadtests.core.balancers import BalancerError, TemporaryBalancer, free_port_pair

#: ``options``: haproxy command-line options; ``globals``: lines of an extra ``global`` section;
#: ``alone``: None for the stack's pool, else a WSGI server whose first client is the only server;
#: ``maxconn``: None for the pool's (the clients' threads), else every server's ``maxconn``.
Variant = namedtuple("Variant", "options globals alone maxconn", defaults=(None, None))

#: name -> Variant. ``copy``: kernel splicing off (``-dS``), what ``option splice-response`` is
#: worth. The others are the settings docs/results.md ("Blobs through the balancer") tried
#: beside splicing: a bigger kernel pipe per splice (``tune.pipesize``, bytes; Linux's default
#: 64 KiB), bigger socket buffers towards the servers and the clients (bytes; the kernel's
#: autotuning otherwise), one thread instead of one per core (with and without splicing).
#: ``pyruvate-alone``: the pool is pyruvate and waitress, which copies the blob through Python;
#: on 2 cores the pool served the blob at 0.75-0.77 of pyruvate directly (docs/results.md, 28 Nov
#: 2026, quiet machine): with pyruvate alone behind it, the ratio is the balancer's own cost.
#: ``pyruvate-alone-cpu1``: the same with HAProxy's one thread pinned to CPU 1 (``cpu-map``;
#: the clients, the ZEO server and wrk stay free to use both cores), against
#: ``pyruvate-alone-nbthread-1``, one unpinned thread: whether the balancer's place on the
#: cores, not its work, costs the blob (docs/results.md, 28 Nov 2026, "Where the blob's CPU goes").
#: ``maxconn-4``, ``pyruvate-alone-maxconn-4``: 4 requests in flight per server (headline's
#: default --connections) instead of its threads: directly, wrk has 4 requests in pyruvate at
#: once; through HAProxy only 2, and HAProxy counts a slot taken until the blob's last byte has
#: gone, whatever the client's worker does meanwhile. ``nbthread-1-maxconn-4``: both changes
#: that lowered the CPU per blob request on 28 Nov 2026 (docs/results.md), on the pool.
VARIANTS = {
    "copy": Variant(("-dS",), ()),
    "same": Variant((), ()),
    "pipesize-512k": Variant((), ("tune.pipesize 524288",)),
    "pipesize-1m": Variant((), ("tune.pipesize 1048576",)),
    "bufs-1m": Variant((), ("tune.rcvbuf.server 1048576", "tune.sndbuf.client 1048576")),
    "bufs-4m": Variant((), ("tune.rcvbuf.server 4194304", "tune.sndbuf.client 4194304")),
    "nbthread-1": Variant((), ("nbthread 1",)),
    "nbthread-1-copy": Variant(("-dS",), ("nbthread 1",)),
    "pyruvate-alone": Variant((), (), "pyruvate"),
    "pyruvate-alone-nbthread-1": Variant((), ("nbthread 1",), "pyruvate"),
    "pyruvate-alone-cpu1": Variant((), ("nbthread 1", "cpu-map 1/1 1"), "pyruvate"),
    "maxconn-4": Variant((), (), None, 4),
    "pyruvate-alone-maxconn-4": Variant((), (), "pyruvate", 4),
    "nbthread-1-maxconn-4": Variant((), ("nbthread 1",), None, 4),
}
#: ``--variant all``: every variant of VARIANTS.
ALL = "all"
#: The baseline of the variants that change a setting: measured whenever one of them is.
SAME = "same"


def target(name):
    """The report's target name of variant ``name``: ``haproxy-<name>``."""
    return f"haproxy-{name}"


def targets():
    """Every variant's target name, in VARIANTS' order (the report's column order)."""
    return tuple(target(name) for name in VARIANTS)


def ratio(name):
    """Variant ``name``'s ratio on the blob: ``(ratio name, (numerator target, denominator
    target))``; ``copy``'s is ``haproxy blob splice/copy`` (the stack's over the copy),
    ``same``'s ``haproxy-same/haproxy blob`` (the unchanged config in a temporary HAProxy over
    the stack's), a variant with one server alone's ``haproxy-<name>/<server> blob`` (against
    that client directly), the others' ``haproxy-<name>/haproxy-same blob``."""
    alone = VARIANTS[name].alone
    if alone:
        return f"{target(name)}/{alone} blob", (target(name), alone)
    if name == "copy":
        return "haproxy blob splice/copy", ("haproxy", target(name))
    if name == SAME:
        return f"{target(name)}/haproxy blob", (target(name), "haproxy")
    return f"{target(name)}/{target(SAME)} blob", (target(name), target(SAME))


def describe(name):
    """What variant ``name`` changes, for the help and the report: ``haproxy -dS``, ``global
    nbthread 1``, ``haproxy -dS + global nbthread 1``, ``global tune.rcvbuf.server 1048576,
    tune.sndbuf.client 1048576``, ``only its pyruvate client as server``; ``the config
    unchanged`` for ``same``."""
    variant = VARIANTS[name]
    parts = [f"haproxy {' '.join(variant.options)}"] if variant.options else []
    parts += [f"global {', '.join(variant.globals)}"] if variant.globals else []
    parts += [f"only its {variant.alone} client as server"] if variant.alone else []
    parts += [f"server maxconn {variant.maxconn}"] if variant.maxconn else []
    return " + ".join(parts) or "the config unchanged"


def legend(name):
    """The report's legend entry of variant ``name``: ``haproxy-copy = the stack's HAProxy
    config with `haproxy -dS` (no kernel splicing)``, ``haproxy-same = the stack's HAProxy
    config unchanged``."""
    variant = VARIANTS[name]
    if not variant.options and not variant.globals and not variant.alone and not variant.maxconn:
        return f"{target(name)} = the stack's HAProxy config unchanged"
    return (f"{target(name)} = the stack's HAProxy config with `{describe(name)}`"
            + (" (no kernel splicing)" if "-dS" in variant.options and not variant.globals else ""))


def select(named, no_copy):
    """The variants to measure, in VARIANTS' order: ``copy`` unless ``no_copy``, the names of
    ``named`` (``--variant``'s list; ``all`` for every one, ``copy`` then only without
    ``no_copy``), and ``same`` with any variant compared with it (not ``copy``, not one with a
    server alone). Raises ValueError naming the
    allowed names for an unknown name, or when ``copy`` is named with ``no_copy``."""
    unknown = [n for n in named if n not in VARIANTS and n != ALL]
    if unknown:
        raise ValueError(f"--variant {unknown[0]!r} is unknown: expected one of {', '.join(VARIANTS)}, or {ALL}")
    if no_copy and "copy" in named:
        raise ValueError("--variant copy and --no-copy contradict each other")
    chosen = set(VARIANTS) if ALL in named else set(named) | ({"copy"} if not no_copy else set())
    chosen |= {SAME} if any(ratio(n)[1][1] == target(SAME) for n in chosen) else set()
    return tuple(n for n in VARIANTS if n in chosen and not (no_copy and n == "copy"))


def extra_config(name):
    """Text of variant ``name``'s ``extra.cfg`` (an extra ``global`` section), None without
    global lines."""
    lines = VARIANTS[name].globals
    return "".join(["global\n"] + [f"    {line}\n" for line in lines]) if lines else None


def servers(name, config):
    """The server entries (the template's ``servers``, stack.json's ``haproxy_context``) of
    variant ``name``: the stack's pool, or the first client of the variant's ``alone`` server,
    each with the variant's ``maxconn`` if it has one. Raises BalancerError when the pool has
    no client of that server."""
    pool = config["haproxy_context"]["servers"]
    variant = VARIANTS[name]
    chosen = [s for s in pool if s.get("wsgi_server") == variant.alone][:1] if variant.alone else pool
    if not chosen:
        raise BalancerError(f"HAProxy variant {name}: the stack's pool has no {variant.alone} client")
    return [dict(s, maxconn=variant.maxconn) for s in chosen] if variant.maxconn else chosen


def balancer(name, config, work_dir):
    """A TemporaryBalancer (not started) of variant ``name`` of the stack described by
    ``config`` (stack.json's dict), in ``work_dir/haproxy-<name>``, on two free ports."""
    changes = {"servers": servers(name, config)} if VARIANTS[name].alone or VARIANTS[name].maxconn else {}
    return TemporaryBalancer(config["haproxy_binary"], config, config["haproxy_context"]["balance"],
                             os.path.join(work_dir, target(name)), free_port_pair(),
                             haproxy_options=VARIANTS[name].options, extra_config=extra_config(name), **changes)


def start(name, config, work_dir):
    """Start :func:`balancer` over the stack's pool and wait for its servers to be UP; return
    it. Raises BalancerError naming the variant when HAProxy refuses its config or does not
    come up (the balancer stopped)."""
    variant = balancer(name, config, work_dir)
    try:
        variant.start(config["backend"], [s["name"] for s in servers(name, config)])
    except BalancerError as exc:
        raise BalancerError(f"HAProxy variant {name} ({describe(name)}): {exc}") from exc
    return variant
