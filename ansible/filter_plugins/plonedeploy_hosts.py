"""Jinja2 filters of the host roles (process_manager, firewall): paths and networks.

- ``path | plonedeploy_parents``: the directories above ``path``, outermost first
  (``/a/b/c`` -> ``["/", "/a", "/a/b"]``): the ones a service user must be able to
  search to reach ``path``.
- ``networks | plonedeploy_cidr_errors``: a message for each entry that is no IPv4 or
  IPv6 address or CIDR network (a host name, a range, a typo); empty when all are.
- ``networks | plonedeploy_networks(family)``: the entries of one family (``ip`` or
  ``ip6``, nftables' words) as normalized networks (``10.0.0.5`` -> ``10.0.0.5/32``,
  host bits cleared), sorted, overlaps merged, for an nftables set.
- ``"host:port" | plonedeploy_port``: the port (int) of an address (``[::1]:80`` too);
  an address without a port 1-65535 is an error that names it.
"""
import ipaddress
import posixpath


def parents(path):
    path = posixpath.normpath(str(path))
    result, current = [], posixpath.dirname(path)
    while True:
        result.append(current)
        if current == "/":
            break
        current = posixpath.dirname(current)
    return list(reversed(result))


def _network(value):
    return ipaddress.ip_network(str(value).strip(), strict=False)


def cidr_errors(networks):
    errors = []
    for value in networks or []:
        try:
            _network(value)
        except ValueError:
            errors.append(f"{value!r} is no IPv4/IPv6 address or CIDR network")
    return errors


def networks_of(networks, family):
    version = {"ip": 4, "ip6": 6}[family]
    found = [_network(v) for v in networks or [] if _network(v).version == version]
    # overlapping networks in one nftables set are an error ("conflicting intervals")
    return [str(n) for n in ipaddress.collapse_addresses(found)]


def port(address):
    """The port of ``"host:port"``; AnsibleFilterError naming the value when there is none
    (the firewall role reads the services' addresses before their own roles check them)."""
    from ansible.errors import AnsibleFilterError

    host, _, number = str(address).rpartition(":")
    if not host or not number.isdigit() or not 1 <= int(number) <= 65535:
        raise AnsibleFilterError(f"{address!r} is invalid: expected host:port with a port 1-65535")
    return int(number)


class FilterModule:
    def filters(self):
        return {
            "plonedeploy_parents": parents,
            "plonedeploy_cidr_errors": cidr_errors,
            "plonedeploy_networks": networks_of,
            "plonedeploy_port": port,
        }
