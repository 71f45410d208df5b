#!/usr/bin/env bash
# Makes `docker compose` usable on a Debian machine, installing only what is
# missing (every step is skipped when its result is already there):
#   1. Debian's docker.io (the engine and a CLI with BuildKit built in) and
#      debootstrap (deploy/images-local.sh's base image);
#   2. dockerd, started in the background as root when `docker info` fails
#      (log: /var/log/n8nbrain-dockerd.log), waited for until it answers;
#   3. the compose v2 CLI plugin, built from its Go module at
#      $COMPOSE_VERSION into ~/.docker/cli-plugins when `docker compose
#      version` does not report that version (`go install` refuses the module:
#      its go.mod has exclude directives).
# A machine whose Docker (Desktop, docker-ce) already has compose passes all
# three checks and is left alone.
set -euo pipefail
COMPOSE_VERSION=${COMPOSE_VERSION:-v5.6.0}
log() { printf 'ensure-docker: %s\n' "$*" >&2; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} (Debian packages)"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    log "the Docker engine is not running and this is not root: start it (sudo systemctl start docker)"
    exit 1
  fi
  log "starting dockerd (log: /var/log/n8nbrain-dockerd.log)"
  nohup dockerd >>/var/log/n8nbrain-dockerd.log 2>&1 </dev/null &
  deadline=$((SECONDS + 120))
  until docker info >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      log "dockerd did not answer within 120 s; its log ends with:"
      tail -n 30 /var/log/n8nbrain-dockerd.log >&2
      exit 1
    fi
    sleep 0.5
  done
fi

if [ "$(docker compose version --short 2>/dev/null)" != "${COMPOSE_VERSION#v}" ]; then
  log "building the compose plugin $COMPOSE_VERSION from its Go module (a few minutes the first time)"
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  # Outside any module, so the download touches no go.mod.
  dir=$(cd "$src" && go mod download -json "github.com/docker/compose/v5@$COMPOSE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir" ] || { log "go mod download gave no folder for github.com/docker/compose/v5@$COMPOSE_VERSION"; exit 1; }
  cp -r "$dir/." "$src"
  chmod -R u+w "$src"
  mkdir -p "$HOME/.docker/cli-plugins"
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-trimpath go build \
    -ldflags "-s -w -X github.com/docker/compose/v5/internal.Version=$COMPOSE_VERSION" \
    -o "$HOME/.docker/cli-plugins/docker-compose" ./cmd)
fi
docker compose version >&2
