"""The memory watchdog of plonedeploy.runtime.watchdog without a stack: a fake clock, a fake
RSS reader, fake peers and a fake kill. On the stack: test_memory_watchdog.py."""
import pytest

from plonedeploy.runtime import metrics, probes, watchdog

MiB = 1048576


class World:
    """Clock, wall clock, RSS and peers the watchdog sees, and the kills it sent."""

    def __init__(self, peers=None):
        self.now = 1000.0
        self.wall = 1_800_000_000.0
        self.rss = 100 * MiB
        self.peers = dict(peers or {})   # address -> (status, text)
        self.asked = []
        self.kills = 0

    def ask(self, peer):
        self.asked.append(peer)
        return self.peers[peer]

    def kill(self):
        self.kills += 1

    def advance(self, seconds):
        self.now += seconds
        self.wall += seconds


READY = (200, "ready")


class FakeMetrics:
    """What the watchdog uses of metrics.Metrics (prometheus-client is not in the test venv:
    the real instruments are in test_metrics_filter.py, in the built client's interpreter)."""

    class Value:
        def __init__(self):
            self.value = 0

        def inc(self, amount=1):
            self.value += amount

        def set(self, value):
            self.value = value

    def __init__(self):
        self.memory_restarts, self.memory_limit = self.Value(), self.Value()
        self.blocked = {}

    @property
    def memory_blocked(self):
        outer = self

        class Labels:
            def labels(self, reason):
                return outer.blocked.setdefault(reason, FakeMetrics.Value())
        return Labels()

    def sample(self, name, reason=None):
        if name == "plonedeploy_memory_restarts_total":
            return self.memory_restarts.value
        return self.blocked[reason].value


def make(world, tmp_path=None, limit=200 * MiB, peers=("127.0.0.1:8072",), address="127.0.0.1:8071",
         health=None, **kwargs):
    health = health or probes.Health(2, clock=lambda: world.now)
    for peer in peers:
        world.peers.setdefault(peer, READY)
    dog = watchdog.Watchdog(health, limit, peers=peers, address=address,
                            state_file=str(tmp_path / "memory-recycles") if tmp_path else None,
                            clock=lambda: world.now, wall=lambda: world.wall, read_rss=lambda: world.rss,
                            ask=world.ask, kill=world.kill, **kwargs)
    return dog, health


def run(dog, world, seconds, step=watchdog.INTERVAL):
    """Tick every ``step`` seconds for ``seconds``."""
    end, kills = world.now + seconds, world.kills
    while world.now < end and world.kills == kills:
        world.advance(step)
        dog.tick()


def test_rss_reads_this_process():
    size = watchdog.rss()
    assert 5 * MiB < size < 4096 * MiB


def test_below_the_limit_or_shorter_than_the_grace_nothing_happens(tmp_path):
    world = World()
    dog, health = make(world, tmp_path, grace=60)
    run(dog, world, 300)
    assert dog.state == watchdog.IDLE and world.kills == 0 and world.asked == []
    world.rss = 300 * MiB
    run(dog, world, 55)                      # above, but not for 60 s yet
    world.rss = 150 * MiB                    # back below: the count starts again
    dog.tick()
    world.rss = 300 * MiB
    run(dog, world, 55)
    assert dog.state == watchdog.IDLE and health.ready() == (True, "ready")


def test_not_while_warming_up(tmp_path):
    world = World()
    health = probes.Health(2, warmup_paths=1, clock=lambda: world.now)
    dog, _ = make(world, tmp_path, health=health, grace=10)
    world.rss = 300 * MiB
    run(dog, world, 120)
    assert dog.state == watchdog.IDLE and world.asked == []


def test_over_the_limit_for_the_grace_drains_waits_for_idle_and_recycles(tmp_path):
    world = World()
    dog, health = make(world, tmp_path, grace=60, check_window=9, drain_timeout=120)
    world.rss = 300 * MiB
    run(dog, world, 60)                      # first seen above at the first tick, 5 s in
    assert dog.state == watchdog.IDLE
    run(dog, world, 5)
    assert dog.state == watchdog.CLAIMED
    ready, text = health.ready()
    assert not ready and text == "recycling: RSS 300 MiB above memory-limit 200 MiB for 60 s"
    world.advance(1)
    dog.tick()
    assert dog.state == watchdog.DRAINING
    token = health.begin()                   # a request still in the application
    run(dog, world, 30, step=1)
    assert world.kills == 0 and dog.state == watchdog.DRAINING   # the window is over, one request left
    health.end(token)
    world.advance(1)
    dog.tick()
    assert world.kills == 1 and dog.state == watchdog.RECYCLED
    assert not health.ready()[0]             # stays out until the process is gone
    assert watchdog.read_recycles(str(tmp_path / "memory-recycles")) == [pytest.approx(world.wall, abs=0.01)]


def test_drain_waits_the_check_window_even_when_idle(tmp_path):
    world = World()
    dog, health = make(world, tmp_path, grace=0, check_window=9)
    world.rss = 300 * MiB
    dog.tick()
    claimed = world.now
    run(dog, world, 30, step=0.5)
    assert world.now - claimed >= watchdog.CLAIM_DELAY + 9


def test_a_request_that_never_ends_does_not_block_the_recycle_forever(tmp_path, caplog):
    world = World()
    dog, health = make(world, tmp_path, grace=0, check_window=9, drain_timeout=120)
    world.rss = 300 * MiB
    health.begin()
    dog.tick()
    claimed = world.now
    run(dog, world, 300, step=1)
    assert world.kills == 1 and world.now - claimed >= 1 + 9 + 120
    assert "1 requests still in the application after 120 s; recycling anyway" in caplog.text


def test_never_the_last_one_a_peer_not_ready_stops_the_claim(tmp_path):
    world = World()
    dog, health = make(world, tmp_path, grace=0)
    world.peers["127.0.0.1:8072"] = (503, "warming up: 1 of 3 paths rendered")
    world.rss = 300 * MiB
    run(dog, world, 60)
    assert dog.state == watchdog.IDLE and health.ready() == (True, "ready") and world.kills == 0
    world.peers["127.0.0.1:8072"] = (None, "no answer: connection refused")
    run(dog, world, 60)
    assert dog.state == watchdog.IDLE
    world.peers["127.0.0.1:8072"] = READY
    run(dog, world, 60)
    assert world.kills == 1


def test_a_peer_that_goes_away_while_draining_puts_it_back(tmp_path):
    world = World()
    dog, health = make(world, tmp_path, grace=0, check_window=9)
    world.rss = 300 * MiB
    dog.tick()
    world.advance(1)
    dog.tick()
    assert dog.state == watchdog.DRAINING
    world.peers["127.0.0.1:8072"] = (503, "stuck: 2 requests in the application for more than 60 s")
    run(dog, world, 10, step=1)
    assert world.kills == 0 and dog.state == watchdog.IDLE and health.ready() == (True, "ready")


def test_two_claims_at_once_the_first_address_wins(tmp_path):
    """Both clients saw the other ready and claimed: each sees the other 'recycling' at its
    second look, CLAIM_DELAY (0.5 s) later; the one whose address sorts first goes on, the other withdraws."""
    a_world, b_world = World(), World()
    a, a_health = make(a_world, None, grace=0, address="127.0.0.1:8071",
                       peers=("127.0.0.1:8072",))
    b, b_health = make(b_world, None, grace=0, address="127.0.0.1:8072", peers=("127.0.0.1:8071",))
    for world in (a_world, b_world):
        world.rss = 300 * MiB
    a.tick(), b.tick()
    assert a.state == b.state == watchdog.CLAIMED
    a_world.peers["127.0.0.1:8072"] = (503, b_health.ready()[1])
    b_world.peers["127.0.0.1:8071"] = (503, a_health.ready()[1])
    for world in (a_world, b_world):
        world.advance(watchdog.CLAIM_DELAY)
    a.tick(), b.tick()
    assert a.state == watchdog.DRAINING and b.state == watchdog.IDLE and b_health.ready() == (True, "ready")
    # The final look of the winner is strict: the loser must be ready again.
    a_world.peers["127.0.0.1:8072"] = READY
    run(a, a_world, 20, step=1)
    assert a_world.kills == 1 and b_world.kills == 0


def test_a_peer_already_recycling_is_not_ready():
    world = World()
    dog, _ = make(world, None, grace=0, address="127.0.0.1:8071")
    world.peers["127.0.0.1:8072"] = (503, "recycling: RSS 300 MiB above memory-limit 200 MiB for 60 s")
    world.rss = 300 * MiB
    run(dog, world, 30)
    assert dog.state == watchdog.IDLE      # the lower address does not barge into a peer's recycle


def test_no_peer_never_recycles_and_says_so(tmp_path, caplog):
    world = World()
    m = registry = FakeMetrics()
    dog, health = make(world, tmp_path, grace=0, peers=(), metrics=m)
    world.rss = 300 * MiB
    run(dog, world, 60)
    assert world.kills == 0 and health.ready() == (True, "ready")
    assert registry.sample("blocked", "no_peer") == 1
    assert caplog.text.count("not recycling") == 1    # once, not every tick
    world.rss = 100 * MiB
    dog.tick()
    assert registry.sample("blocked", "no_peer") == 0


def test_backoff_after_the_restarts_of_an_hour_survives_the_restart(tmp_path, caplog):
    """A limit below the working size: each new process is above it at once. Three recycles
    in an hour, then the next process serves on, says so, and the alert's gauge is 1; the
    counter never goes down across the restarts."""
    world = World()
    world.rss = 300 * MiB
    seen = []
    for process in range(5):
        m = registry = FakeMetrics()
        dog, health = make(world, tmp_path, grace=60, max_restarts=3, metrics=m)
        before = world.kills
        run(dog, world, 600)
        seen.append((world.kills - before, registry.sample("plonedeploy_memory_restarts_total"),
                     registry.sample("blocked", "backoff")))
        world.advance(30)   # supervisord starts it again, the warm-up
    assert seen == [(1, 1, 0), (1, 2, 0), (1, 3, 0), (0, 3, 1), (0, 3, 1)]
    assert "3 recycles in the last hour (memory-limit-restarts 3); serving on" in caplog.text
    # An hour after the first recycle, it may recycle once more.
    world.advance(3600)
    registry = FakeMetrics()
    dog, health = make(world, tmp_path, grace=60, max_restarts=3, metrics=registry)
    run(dog, world, 600)
    assert world.kills == 4 and registry.sample("plonedeploy_memory_restarts_total") == 4


def test_memory_limit_restarts_0_only_alerts(tmp_path):
    world = World()
    dog, health = make(world, tmp_path, grace=0, max_restarts=0)
    world.rss = 300 * MiB
    run(dog, world, 60)
    assert world.kills == 0 and dog.blocked == "backoff"


def test_a_tick_that_raises_does_not_end_the_thread(caplog):
    import threading

    world = World()
    dog, _ = make(world, None, grace=0)
    calls = []

    def boom():
        calls.append(1)
        if len(calls) == 3:
            stop.set()
        raise RuntimeError("boom")

    dog.tick = boom
    stop = threading.Event()
    dog.run(stop, interval=0.001)
    assert len(calls) == 3 and "memory watchdog: tick failed" in caplog.text


@pytest.mark.parametrize("option, value, message", [
    ("memory_limit", "1GB", "memory_limit = '1GB' is invalid: expected bytes >= 1 or off"),
    ("memory_limit", "0", "memory_limit = '0' is invalid"),
    ("memory_limit_grace", "-1", "memory_limit_grace = '-1' is invalid: expected seconds > 0"),
    ("memory_limit_restarts", "many", "memory_limit_restarts = 'many' is invalid"),
    ("memory_limit_peers", "8072", "address = '8072' is invalid"),
    ("check_window", "0", "check_window = '0' is invalid"),
])
def test_filter_refuses_bad_watchdog_settings(option, value, message):
    settings = {"memory_limit": "1073741824", option: value}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        metrics.filter_factory({}, "127.0.0.1:1", **settings)


def test_filter_settings_off_and_on():
    assert metrics.watchdog_settings("off", "60", "3", "", "", "9") is None
    assert metrics.watchdog_settings("1073741824", "30", "2", "127.0.0.1:8072  10.0.0.2:8071", "/x", "9") == {
        "limit": 1073741824, "grace": 30.0, "max_restarts": 2, "peers": ["127.0.0.1:8072", "10.0.0.2:8071"],
        "state_file": "/x", "check_window": 9.0}


def test_the_default_memory_limit_rule():
    from plonedeploy.stack import rules

    GiB = 1024 * MiB
    # 75 % of what the host has beyond 1 GiB, split evenly, in whole MiB
    assert rules.default_memory_limit(16 * GiB, 3)[0] == 3840 * MiB
    assert rules.default_memory_limit(4 * GiB, 2)[0] == 1152 * MiB
    limit, reason = rules.default_memory_limit(2 * GiB, 3)
    assert limit == rules.MEMORY_LIMIT_FLOOR == 512 * MiB and "below the floor of 512 MiB" in reason
    assert rules.default_memory_limit(512 * MiB, 1)[0] == 512 * MiB   # less than the reserve: the floor
    with pytest.raises(ValueError):
        rules.default_memory_limit(16 * GiB, 0)
    # the watchdog's default check window is HAProxy's fall x inter + 3 s of haproxy.cfg.j2
    assert rules.recycle_check_window() == watchdog.CHECK_WINDOW == 9
    assert (str(watchdog.GRACE), str(watchdog.MAX_RESTARTS)) == ("60.0", rules.MEMORY_LIMIT_RESTARTS)


def test_ask_readyz_of_a_real_probe_server():
    """The peer asker against a probe server of this process: 200 ready, 503 with the
    watchdog's text, and no answer from a closed port."""
    from loadtests.core.procs import free_local_port

    health = probes.Health(1)
    port = free_local_port()
    server = probes.serve("127.0.0.1", port, probes.probe_app(health, lambda e, s: []))
    try:
        assert watchdog.ask_readyz(f"127.0.0.1:{port}") == (200, "ready")
        health.draining = "recycling: RSS 300 MiB above memory-limit 200 MiB for 60 s"
        assert watchdog.ask_readyz(f"127.0.0.1:{port}") == (503, health.draining)
    finally:
        server.shutdown()
        server.server_close()
    status, text = watchdog.ask_readyz(f"127.0.0.1:{port}", timeout=1)
    assert status is None and text.startswith("no answer: ")


def test_looks_come_faster_after_a_claim_and_while_draining():
    world = World()
    dog, _ = make(world, None, grace=0)
    assert dog.next_tick() == watchdog.INTERVAL == 5
    world.rss = 300 * MiB
    dog.tick()
    assert dog.state == watchdog.CLAIMED and dog.next_tick() == watchdog.CLAIM_DELAY == 0.5
    world.advance(0.5)
    dog.tick()
    assert dog.state == watchdog.DRAINING and dog.next_tick() == watchdog.DRAIN_INTERVAL == 1


def test_a_slow_peer_answer_means_no_claim_this_tick():
    """Asking the peers took longer than half the claim delay: another client may have
    claimed meanwhile unseen, so it looks again at the next tick instead of claiming."""
    world = World()
    dog, health = make(world, None, grace=0)
    world.rss = 300 * MiB
    slow = world.ask

    def ask(peer):
        world.now += 0.4
        return slow(peer)

    dog.ask = ask
    dog.tick()
    assert dog.state == watchdog.IDLE and health.ready() == (True, "ready")
    dog.ask = slow
    dog.tick()
    assert dog.state == watchdog.CLAIMED


def test_waiting_for_a_peer_is_logged_once_per_reason(caplog):
    caplog.set_level("INFO", logger="plonedeploy.watchdog")
    world = World()
    dog, _ = make(world, None, grace=0)
    world.peers["127.0.0.1:8072"] = (503, "warming up: 1 of 3 paths rendered")
    world.rss = 300 * MiB
    run(dog, world, 60)
    assert caplog.text.count("waiting: peer 127.0.0.1:8072") == 1
