#!/usr/bin/env bash
# Install the system packages plonedeploy needs on Debian 12: HAProxy (Debian's 2.6
# package), Python's venv module, wrk (the load generator of loadtests.connections and
# the matrix), strace (tests/test_blob_sendfile.py counts the pyruvate client's
# sendfile calls with it), and for wsgi-server = bjoern (an sdist with a C extension)
# libev's and Python's headers and a C compiler; rsync (bin/backup copies the blob storage
# with hard links to the previous copy) and logrotate (parts/logrotate/logrotate.conf);
# openssl (the build makes HAProxy's self-signed certificate with it) and curl (the TLS
# tests speak HTTP/2 with it); prometheus for its promtool; varnish (the cache tier, started
# by bin/stack with the kit's own VCL and ports) and prometheus-varnish-exporter (its metrics);
# postgresql (storage = relstorage); for wsgi-server = mod_wsgi Apache's binary and headers
# (apache2-bin, apache2-dev: no apache2 service package, and any system apache2 service is
# stopped) and mod_wsgi itself, compiled against /usr/bin/python3 into a venv of its own
# (MOD_WSGI_VENV); acl (setfacl); libjemalloc2 (the ZEO clients' malloc = jemalloc). Does
# nothing when they are already there.
set -euo pipefail
need=()
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
[ -f /usr/include/ev.h ] || need+=(libev-dev)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
python3 -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' || need+=(python3-dev)
command -v strace >/dev/null 2>&1 || need+=(strace)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
command -v logrotate >/dev/null 2>&1 || [ -x /usr/sbin/logrotate ] || need+=(logrotate)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# promtool (tests/test_alert_rules.py checks the monitoring role's alert rules with it);
# the kit never uses the package's own service.
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v varnishd >/dev/null 2>&1 || [ -x /usr/sbin/varnishd ] || need+=(varnish)
command -v prometheus-varnish-exporter >/dev/null 2>&1 || need+=(prometheus-varnish-exporter)
# PostgreSQL 15 for storage = relstorage (relstorage.cfg: bin/stack runs its own cluster in
# var/postgresql with initdb/postgres from here; tests/test_relstorage.py). The package's
# own cluster and service are not used (no systemd here; the kit's cluster has its own port).
[ -x /usr/lib/postgresql/15/bin/initdb ] || need+=(postgresql)
# wsgi-server = mod_wsgi: Apache (the binary and its modules only: apache2-bin has no service)
# and apxs (apache2-dev) to compile mod_wsgi against it.
[ -x /usr/sbin/apache2 ] || need+=(apache2-bin)
[ -x /usr/bin/apxs ] || need+=(apache2-dev)
# setfacl (acl): bin/stack, bin/postgresql and the mod_wsgi runner give the user they run a
# program as search permission (u:<user>:x) on the parents of a checkout it cannot enter.
command -v setfacl >/dev/null 2>&1 || [ -x /usr/bin/setfacl ] || need+=(acl)
# mod_wsgi-express's httpd.conf reads TypesConfig /etc/mime.types (not a dependency of apache2-bin).
[ -f /etc/mime.types ] || need+=(media-types)
# malloc = jemalloc (the instance recipe's option): bin/<part> preloads Debian's libjemalloc.so.2
# into the client's server process; bin/buildout fails without it.
dpkg-query -W -f='${Status}' libjemalloc2 2>/dev/null | grep -q 'ok installed' || need+=(libjemalloc2)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOD_WSGI_VERSION="$(sed -n 's/^mod_wsgi==//p' "$here/../requirements-mod_wsgi.txt")"
# The instance recipe's mod-wsgi-express default (plonedeploy.stack.rules.MOD_WSGI_EXPRESS).
MOD_WSGI_VENV="/usr/local/lib/plonedeploy/mod_wsgi-$MOD_WSGI_VERSION"

# A system apache2 service (the apache2 package, if someone installed it) must not run: the
# kit's mod_wsgi clients run their own Apache on their own ports.
stop_system_apache() {
  local pidfile=/var/run/apache2/apache2.pid
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "system packages: stopping the system apache2 service (pid $(cat "$pidfile"))"
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet apache2 2>/dev/null; then
      $SUDO systemctl disable --now apache2.service || true
    else
      { command -v apache2ctl >/dev/null 2>&1 && $SUDO apache2ctl stop; } \
        || $SUDO kill "$(cat "$pidfile")" || true
    fi
  fi
}

# mod_wsgi compiled against the system Python 3 (Debian's, the eggs' cp311 ABI) and Apache:
# the daemon runs as a service user, who must be able to read that Python
# (docs/reference/servers.md).
install_mod_wsgi() {
  if [ -x "$MOD_WSGI_VENV/bin/mod_wsgi-express" ]; then
    return 0
  fi
  echo "system packages: building mod_wsgi $MOD_WSGI_VERSION into $MOD_WSGI_VENV"
  $SUDO mkdir -p "$(dirname "$MOD_WSGI_VENV")"
  $SUDO rm -rf "$MOD_WSGI_VENV"
  $SUDO /usr/bin/python3 -m venv "$MOD_WSGI_VENV"
  if ! $SUDO env PIP_DISABLE_PIP_VERSION_CHECK=1 "$MOD_WSGI_VENV/bin/pip" install --quiet \
      -r "$here/../requirements-mod_wsgi.txt"; then
    $SUDO rm -rf "$MOD_WSGI_VENV"  # no half-made venv: the next run builds it again
    return 1
  fi
}
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
  SUDO=sudo
fi
if [ ${#need[@]} -eq 0 ]; then
  stop_system_apache
  install_mod_wsgi
  echo "system packages: present ($(/usr/sbin/haproxy -v 2>/dev/null | head -n1 || haproxy -v | head -n1); $(command -v wrk))"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "install as root: apt-get install ${need[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "system packages: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
# On a machine with systemd the package starts its own varnish on :6081, the kit's port:
# the kit runs its own (bin/stack, Ansible), so the package's service is stopped again.
if [[ " ${need[*]} " == *" varnish "* ]] && command -v systemctl >/dev/null 2>&1 \
    && systemctl is-active --quiet varnish 2>/dev/null; then
  echo "system packages: stopping and disabling the varnish package's own service (the kit runs its own)"
  $SUDO systemctl disable --now varnish.service varnishncsa.service prometheus-varnish-exporter.service || true
fi
stop_system_apache
install_mod_wsgi
