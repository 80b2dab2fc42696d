"""Read your own writes at the balancer (haproxy/haproxy.cfg.j2, cookie ``lb_wrote``), with and
without the write lane: a real HAProxy of the project's template over two stand-in ZEO clients
that say who they are. tests/test_writes.py checks the same on the built stack (write lane on).
"""
import shutil
from urllib.parse import urlsplit

import pytest
import requests

from http_stub import answering_server
from loadtests.core.balancers import TemporaryBalancer, free_port_pair
from stack_like import stack_like

requires_haproxy = pytest.mark.skipif(not shutil.which("haproxy"), reason="no haproxy binary")


def _client(name):
    """A stand-in ZEO client: 200 to health checks and reads, 201 to writes, its name in the body."""
    def answer(request):
        return (201 if request.method == "POST" else 200), {}, name.encode()
    return answer


@requires_haproxy
@pytest.mark.parametrize("write_lane", [True, False], ids=["write-lane", "no-write-lane"])
def test_the_writers_next_read_goes_to_the_client_that_wrote(tmp_path, write_lane):
    with answering_server(_client("instance")) as first, answering_server(_client("client2")) as second:
        config = stack_like(tmp_path, [urlsplit(first).port, urlsplit(second).port], write_lane=write_lane)
        balancer = TemporaryBalancer(config["haproxy_binary"], config, "leastconn", str(tmp_path / "lb"),
                                     free_port_pair())
        with balancer:
            balancer.start("zeoclients", config["servers"])
            url = balancer.frontend_url + "/Plone"
            writers = set()
            for _ in range(12):
                session = requests.Session()
                wrote = session.post(url, data=b"x", timeout=10)
                assert wrote.status_code == 201
                writer = wrote.headers["X-Served-By"]
                writers.add(writer)
                position = config["servers"].index(writer) + 1
                assert session.cookies.get("lb_wrote") == str(position), wrote.headers
                assert "HttpOnly" in wrote.headers["Set-Cookie"] and "Secure" not in wrote.headers["Set-Cookie"]
                read = session.get(url, timeout=10)
                assert (read.status_code, read.headers["X-Served-By"], read.text) == (200, writer, writer)
                assert "lb_wrote" not in session.cookies, "the read's answer should delete the cookie"
            # the lane sends every write to the first client; without it the pool shares them
            assert writers == ({"instance"} if write_lane else {"instance", "client2"})
