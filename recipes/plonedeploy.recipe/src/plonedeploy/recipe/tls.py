"""TLS at HAProxy: Mozilla's "intermediate" profile and a self-signed certificate when none is given.

Used by ``plonedeploy.recipe:haproxy`` (and the Ansible haproxy role through
``ansible/filter_plugins/plonedeploy_edge.py``); no zc.buildout import, so any Python 3 can
use it. The certificate is made with Debian's ``openssl`` command (OpenSSL 3).
"""
import ipaddress
import os
import subprocess
import tempfile

#: Mozilla server-side TLS guidelines, "intermediate" configuration (version 5.7) for HAProxy
#: 2.6 / OpenSSL 3: TLS 1.2 with forward-secret AEAD ciphers, and TLS 1.3. Source:
#: https://ssl-config.mozilla.org/#server=haproxy&config=intermediate
INTERMEDIATE_CIPHERS = ":".join((
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
    "DHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES256-GCM-SHA384", "DHE-RSA-CHACHA20-POLY1305",
))
INTERMEDIATE_CIPHERSUITES = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
INTERMEDIATE_OPTIONS = "ssl-min-ver TLSv1.2 prefer-client-ciphers no-tls-tickets"

#: Strict-Transport-Security max-age (seconds) Mozilla recommends: two years.
DEFAULT_HSTS_MAX_AGE = 63072000

#: Days a generated self-signed certificate is valid, and the days before its end at which
#: a build makes a new one.
SELF_SIGNED_DAYS = 365
RENEW_BEFORE_DAYS = 30


class TLSError(Exception):
    """openssl failed or a certificate file is unusable; the message says which and why."""


def san_entry(name):
    """subjectAltName entry of a server name: ``"IP:127.0.0.1"``, ``"IP:::1"`` (from
    ``[::1]``), ``"DNS:www.example.org"``."""
    bare = name.strip("[]")
    try:
        return f"IP:{ipaddress.ip_address(bare).compressed}"
    except ValueError:
        return f"DNS:{name}"


def _san(names):
    return ",".join(san_entry(name) for name in names)


def profile(name="intermediate"):
    """``{"ciphers", "ciphersuites", "options"}`` of Mozilla's profile (only "intermediate")."""
    if name != "intermediate":
        raise ValueError(f"TLS profile {name!r}: only 'intermediate' is offered")
    return {"ciphers": INTERMEDIATE_CIPHERS, "ciphersuites": INTERMEDIATE_CIPHERSUITES,
            "options": INTERMEDIATE_OPTIONS}


def certificate_names(path):
    """The subjectAltName entries of the PEM at ``path`` as a set like ``{"DNS:a", "IP:1.2.3.4"}``.

    Raises TLSError if openssl cannot read it.
    """
    result = subprocess.run(["openssl", "x509", "-in", path, "-noout", "-ext", "subjectAltName"],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise TLSError(f"openssl cannot read the certificate {path}: {result.stderr.strip()}")
    text = result.stdout.split("\n", 1)[1] if "\n" in result.stdout else ""
    names = set()
    for item in (i.strip() for i in text.replace("\n", ",").split(",")):
        if item.startswith("IP Address:"):  # openssl writes IPv6 in full: compare compressed
            names.add("IP:" + ipaddress.ip_address(item.split(":", 1)[1]).compressed)
        elif item:
            names.add(item)
    return names


def needs_new(path, names):
    """True when the self-signed PEM at ``path`` is missing, does not cover exactly ``names``
    (host names or addresses), or ends within RENEW_BEFORE_DAYS days."""
    if not os.path.exists(path):
        return True
    try:
        if certificate_names(path) != set(_san(names).split(",")):
            return True
    except TLSError:
        return True
    result = subprocess.run(["openssl", "x509", "-in", path, "-noout", "-checkend",
                             str(RENEW_BEFORE_DAYS * 86400)], capture_output=True, check=False)
    return result.returncode != 0


def make_self_signed(path, names, days=SELF_SIGNED_DAYS):
    """Write a self-signed certificate for ``names`` and its key (ECDSA P-256) into ``path``
    as one PEM (HAProxy's ``crt`` format), mode 0600; the key never exists elsewhere on disk.

    ``names``: host names, IPv4 or ``[IPv6]`` addresses (the first is the subject CN).
    Raises TLSError with openssl's message.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        os.chmod(tmp, 0o700)
        key, cert = os.path.join(tmp, "key.pem"), os.path.join(tmp, "cert.pem")
        result = subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", key, "-out", cert, "-days", str(days),
             "-subj", f"/CN={names[0].strip('[]')}", "-addext", f"subjectAltName={_san(names)}"],
            capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise TLSError(f"openssl req failed: {result.stderr.strip()}")
        combined = os.path.join(tmp, "combined.pem")
        fd = os.open(combined, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            for part in (cert, key):
                with open(part, encoding="ascii") as fp:
                    out.write(fp.read())
        os.replace(combined, path)


def template_context(tls_bind, certificate, redirect, hsts_max_age, redirect_exempt=()):
    """The TLS variables of ``haproxy/haproxy.cfg.j2`` as a dict.

    ``tls_bind``: ``host:port`` of the HTTPS listener, or empty/None for no TLS (the other
    values are then ignored); ``certificate``: PEM path; ``redirect``: bool, 301 from the
    plain port; ``hsts_max_age``: seconds, 0 for no header; ``redirect_exempt``: networks
    (CIDR strings) served on the plain port without the redirect (the A/B's load generators).
    """
    if not tls_bind:
        return {"tls_bind": "", "tls_certificate": "", "tls_redirect": False, "tls_port": 443,
                "tls_redirect_exempt": [], "hsts_max_age": 0, "tls_ciphers": "", "tls_ciphersuites": "",
                "tls_options": ""}
    return {
        "tls_bind": tls_bind,
        "tls_certificate": certificate,
        "tls_redirect": bool(redirect),
        "tls_redirect_exempt": list(redirect_exempt),
        "tls_port": int(tls_bind.rpartition(":")[2]),
        "hsts_max_age": int(hsts_max_age),
        "tls_ciphers": INTERMEDIATE_CIPHERS,
        "tls_ciphersuites": INTERMEDIATE_CIPHERSUITES,
        "tls_options": INTERMEDIATE_OPTIONS,
    }
