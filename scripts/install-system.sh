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
# postgresql (storage = relstorage). Does nothing when they are already there.
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
if [ ${#need[@]} -eq 0 ]; then
  echo "system packages: present ($(/usr/sbin/haproxy -v 2>/dev/null | head -n1 || haproxy -v | head -n1); $(command -v wrk))"
  exit 0
fi
SUDO=""
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
