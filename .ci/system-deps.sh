#!/usr/bin/env bash
# Debian packages the test-suite needs: Ceph (real S3 via RGW), Chromium (report rendering test) and a
# Compose client (`docker-compose config` validates docker/compose.yaml; no Docker engine is needed for that).
# Installs only what is missing; does nothing without root.
set -euo pipefail
packages=(ceph-mon ceph-osd ceph-mgr radosgw ceph-common chromium docker-compose)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "system-deps: all present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "system-deps: not root; missing ${missing[*]} (Ceph and browser tests will skip)" >&2
  exit 0
fi
echo "system-deps: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
