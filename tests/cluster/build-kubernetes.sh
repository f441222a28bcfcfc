#!/usr/bin/env bash
# Build the Kubernetes server binaries that the local control plane runs, once,
# from Debian bookworm's `kubernetes` source package, into a cache outside the
# repository (ROTA_CACHE, default ~/.cache/rota). Run as root on Debian bookworm:
# it adds a deb-src list and installs golang-go and the reflect2 sources.
#
# The vendored github.com/modern-go/reflect2 1.0.1 does not work with Go >= 1.18
# (its unsafe map iteration breaks at run time); Debian's 1.0.2 sources replace it.
set -euo pipefail

K8S_DEB_VERSION=${K8S_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}
CACHE=${ROTA_CACHE:-$HOME/.cache/rota}
OUT="$CACHE/kubernetes-$K8S_DEB_VERSION"
WHAT=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

log() { printf '==> %s\n' "$*" >&2; }

have_all() {
  local name
  for name in "${WHAT[@]}"; do
    [[ -x "$OUT/bin/$name" ]] || return 1
  done
}

if have_all; then
  log "kubernetes binaries cached in $OUT/bin"
  exit 0
fi

[[ $(id -u) == 0 ]] || { echo "building Kubernetes needs root (apt-get)" >&2; exit 2; }

if ! apt-cache showsrc kubernetes 2>/dev/null | grep -q "^Version: $K8S_DEB_VERSION$"; then
  log "adding a deb-src list for bookworm"
  cat >/etc/apt/sources.list.d/rota-deb-src.sources <<'SOURCES'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  apt-get update -qq
fi
log "installing the Go toolchain and build tools from Debian"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  golang-go golang-github-modern-go-reflect2-dev dpkg-dev make rsync >/dev/null

mkdir -p "$OUT"
SRC="$OUT/src"
if [[ ! -f "$SRC/.unpacked" ]]; then
  rm -rf "$SRC" "$OUT/dl" && mkdir -p "$OUT/dl"
  log "fetching the kubernetes $K8S_DEB_VERSION source package"
  (cd "$OUT/dl" && apt-get source -qq "kubernetes=$K8S_DEB_VERSION" >/dev/null)
  mv "$(find "$OUT/dl" -mindepth 1 -maxdepth 1 -type d | head -n 1)" "$SRC"
  rm -rf "$OUT/dl"
  log "replacing the vendored reflect2 with Debian's"
  rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$SRC/vendor/github.com/modern-go/reflect2"
  touch "$SRC/.unpacked"
fi

targets=()
for name in "${WHAT[@]}"; do targets+=("cmd/$name"); done
log "building ${WHAT[*]} (15 to 40 minutes on 2 cores, depending on the load)"
start=$SECONDS
(
  cd "$SRC"
  export GOFLAGS=-mod=vendor GO111MODULE=on GOCACHE="$CACHE/go-build" GOPATH="$CACHE/gopath"
  export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=debian
  nice -n "${NICE:-10}" make WHAT="${targets[*]}" KUBE_VERBOSE=0
)
mkdir -p "$OUT/bin"
for name in "${WHAT[@]}"; do
  install -m 0755 "$SRC/_output/bin/$name" "$OUT/bin/$name"
done
log "built in $((SECONDS - start))s: $OUT/bin"
