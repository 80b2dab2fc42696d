"""A stack.json dict of the shape the load tools' TemporaryBalancer renders, without a build:
the project's HAProxy template with the variables the recipe gives it, for pyruvate clients on
127.0.0.1 (TLS, cache tier and user drop off). The suite's one copy (test_headline.py's
variants, test_read_own_writes.py's pool)."""
import shutil

from plonedeploy.recipe import edge, options, tls


def stack_like(run_directory, ports, write_lane=False):
    """The dict for one pyruvate client per port of ``ports`` (named ``instance``, then
    ``client2``, ``client3`` ...; 2 threads, its health check on its own port), HAProxy's
    files in ``run_directory`` (a path), the write lane on or off."""
    names = ["instance"] + [f"client{number}" for number in range(2, len(ports) + 1)]
    servers = [{"name": name, "host": "127.0.0.1", "port": port, "maxconn": 2, "wsgi_server": "pyruvate",
                "check_addr": "127.0.0.1", "check_port": port, "max_body": 1024}
               for name, port in zip(names, ports)]
    return {"haproxy_binary": shutil.which("haproxy"), "haproxy_template": options.HAPROXY_TEMPLATE,
            "backend": "zeoclients", "servers": names, "haproxy_context": dict(
                part="haproxy", servers=servers, bind="127.0.0.1:1", stats_bind="127.0.0.1:2",
                balance="leastconn", health_check="/readyz", timeout_queue=5, max_body_size=1024, maxconn=100,
                fd_limit=1000, manage_networks=["127.0.0.1/32"], write_lane=write_lane,
                run_directory=str(run_directory), user="", group="", chroot="", cache_server="",
                cache_fill_bind="", cache_health_path="/_varnish/ok", **edge.template_context(["127.0.0.1"]),
                **tls.template_context("", "", False, 0))}
