"""The A/B's plan: whether the stack's config allows variants of the deployed HAProxy
(``can_vary``), the ports of the temporary HAProxy and slot clients (``ports``) and the
runs of a rounds invocation in order (``round_plan``).
"""
from urllib.parse import urlsplit

from loadtests.ab import abslots

#: Offsets from the deployed frontend's port (8080 in buildout.cfg): the temporary HAProxy
#: on +10 and its stats on +11, slot a on +12 and slot b on +13 (8090-8093), none of which
#: buildout.cfg's [ports] uses.
BALANCER_OFFSET, SLOT_OFFSET = 10, 12


def can_vary(config):
    """True when ``config`` describes the deployed HAProxy well enough to run variants of
    it (``haproxy_context`` of a buildout's stack.json); the Ansible role's ``abtest.json``
    describes only the frontend and stats URLs."""
    return bool(config.get("haproxy_context") and config.get("haproxy_template"))


def ports(args, config):
    """``(balancer port, {"a": slot a's port, "b": slot b's})``: ``--balancer-port`` and
    ``--slot-port`` when given, else the deployed frontend's port (``config["frontend_url"]``)
    plus ``BALANCER_OFFSET`` and ``SLOT_OFFSET``. The balancer's stats take the port after
    its frontend's."""
    frontend_port = urlsplit(config["frontend_url"]).port
    balancer = args.balancer_port if args.balancer_port is not None else frontend_port + BALANCER_OFFSET
    slot = args.slot_port if args.slot_port is not None else frontend_port + SLOT_OFFSET
    return balancer, {"a": slot, "b": slot + 1}


def round_plan(args):
    """The runs of a rounds invocation, in order: ``[(round, kind, server of slot a, server
    of slot b, slot holding role A)]``. Role A is the first of ``abslots.SERVERS``
    (pyruvate): in slot a in odd rounds, in slot b in even ones, so that position effects
    cancel over an even number of rounds. ``kind`` is "ab" (or, with --calibrate, both
    slots on the control server with A frozen) and "aa" with --control."""
    first, second = abslots.SERVERS
    same = args.control_server
    plan = []
    for round_no in range(1, args.rounds + 1):
        slot_a = "a" if round_no % 2 else "b"
        if args.calibrate is not None:
            runs = [("ab", same, same)]
        else:
            runs = [("ab", first, second) if slot_a == "a" else ("ab", second, first)]
        if args.control:
            runs.append(("aa", same, same))
        if round_no % 2 == 0:
            runs.reverse()  # A/A and A/B take turns at going first within a round, too
        plan += [(round_no, kind, a, b, slot_a) for kind, a, b in runs]
    return plan
