#!/usr/bin/env bash
# Install the system packages plonedeploy needs on Debian 12: HAProxy (Debian's 2.6
# package), Python's venv module, and strace (tests/test_blob_sendfile.py counts the
# pyruvate client's sendfile calls with it). Does nothing when they are already there.
# The blob benchmark (python -m loadtests.blobbench) also needs wrk: apt-get install wrk.
set -euo pipefail
need=()
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
command -v strace >/dev/null 2>&1 || need+=(strace)
if [ ${#need[@]} -eq 0 ]; then
  echo "system packages: present ($(/usr/sbin/haproxy -v 2>/dev/null | head -n1 || haproxy -v | head -n1))"
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
