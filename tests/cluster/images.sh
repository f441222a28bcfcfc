#!/usr/bin/env bash
# Build Rota's images without Docker: buildah, from local Debian base images
# with python3 that mmdebstrap makes once (cached in ROTA_CACHE, default
# ~/.cache/rota): trixie (Python 3.13) for the worker, as its Dockerfile's
# python:3.13 base, and bookworm (Python 3.11) for the operator.
# The Dockerfiles build unchanged; only their base-image argument points at the
# local base. Builds run on the host network with the host's CA bundle, so pip
# inside RUN reaches PyPI through whatever the host trusts.
#
#   images.sh build          build rota-worker, rota-operator and the two handler images
#   images.sh load ADDRESS   import them into the containerd listening on ADDRESS (k8s.io namespace)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${ROTA_CACHE:-$HOME/.cache/rota}
TAG=${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml")}
WORKER_BASE=localhost/rota-base:trixie-python3
OPERATOR_BASE=localhost/rota-base:bookworm-python3
IMAGES=(rota-worker rota-operator rota-worker-e2e rota-worker-cluster)

log() { printf '==> %s\n' "$*" >&2; }

base_image() {
  local suite=$1 image="localhost/rota-base:$1-python3"
  if podman image exists "$image"; then
    return
  fi
  local tarball="$CACHE/images/$suite-python3.tar"
  if [[ ! -s $tarball ]]; then
    log "making the $suite base image with mmdebstrap"
    mkdir -p "$CACHE/images"
    # python3-venv for the build stage's virtualenv, python-is-python3 for the
    # Dockerfiles' `python`; the image's own trust store is not needed. The hook's
    # $1 is mmdebstrap's, expanded when it runs the hook.
    # shellcheck disable=SC2016
    mmdebstrap --variant=minbase --format=tar --quiet \
      --include=python3,python3-venv,python-is-python3 \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
      "$suite" "$tarball.part" http://deb.debian.org/debian
    mv "$tarball.part" "$tarball"
  fi
  podman import --quiet "$tarball" "$image" >/dev/null
}

build() {
  command -v buildah >/dev/null || { echo "buildah is missing: apt-get install buildah podman mmdebstrap" >&2; exit 2; }
  base_image trixie
  base_image bookworm
  local conf="$CACHE/images/pip.conf"
  mkdir -p "$CACHE/images"
  {
    echo "[global]"
    [[ -f /etc/ssl/certs/ca-certificates.crt ]] && echo "cert = /etc/ssl/certs/ca-certificates.crt"
    [[ -n ${PIP_INDEX_URL:-} ]] && echo "index-url = $PIP_INDEX_URL"
    true
  } >"$conf"
  local mounts=(--volume "$conf:/etc/pip.conf:ro")
  if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    mounts+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
  fi
  local common=(--quiet --layers --network host --isolation chroot "${mounts[@]}"
    --build-arg "VERSION=$TAG")
  log "building rota-worker:$TAG and rota-operator:$TAG"
  buildah bud "${common[@]}" --build-arg "PYTHON_IMAGE=$WORKER_BASE" \
    -f "$ROOT/Dockerfile.worker" -t "rota-worker:$TAG" "$ROOT" >/dev/null
  buildah bud "${common[@]}" --build-arg "PYTHON_IMAGE=$OPERATOR_BASE" \
    -f "$ROOT/Dockerfile.operator" -t "rota-operator:$TAG" "$ROOT" >/dev/null
  log "building the handler images"
  buildah bud --quiet --layers --isolation chroot --build-arg "WORKER_IMAGE=localhost/rota-worker:$TAG" \
    -f "$ROOT/tests/e2e/Dockerfile.handlers" -t "rota-worker-e2e:$TAG" "$ROOT/tests/e2e" >/dev/null
  buildah bud --quiet --layers --isolation chroot --build-arg "WORKER_IMAGE=localhost/rota-worker:$TAG" \
    -f "$ROOT/tests/cluster/Dockerfile.handlers" -t "rota-worker-cluster:$TAG" "$ROOT/tests/cluster" >/dev/null
  podman images --filter reference='localhost/rota-*' --format '{{.Repository}}:{{.Tag}} {{.Size}}' >&2
}

# Import the images into containerd under the names the kubelet resolves
# (rota-worker:TAG means docker.io/library/rota-worker:TAG), unless containerd
# already holds that very build (its image id is noted at import).
load() {
  local address=$1 name id dir="$CACHE/images/archives" present
  mkdir -p "$dir"
  present=$(ctr --address "$address" -n k8s.io images ls -q)
  for name in "${IMAGES[@]}"; do
    id=$(podman image inspect --format '{{.Id}}' "localhost/$name:$TAG")
    if grep -qx "docker.io/library/$name:$TAG" <<<"$present" &&
      [[ $(cat "$dir/$name.id" 2>/dev/null) == "$id" ]]; then
      continue
    fi
    log "loading $name:$TAG into containerd"
    podman tag "localhost/$name:$TAG" "docker.io/library/$name:$TAG"
    rm -f "$dir/$name.tar"
    podman save --quiet --format docker-archive -o "$dir/$name.tar" "docker.io/library/$name:$TAG"
    ctr --address "$address" -n k8s.io images import "$dir/$name.tar" >/dev/null
    rm -f "$dir/$name.tar"
    echo "$id" >"$dir/$name.id"
  done
}

case ${1:-} in
  build) build ;;
  load) load "${2:?containerd address}" ;;
  *) echo "usage: $0 build | load CONTAINERD_ADDRESS" >&2; exit 2 ;;
esac
