#!/usr/bin/env bash
# An OCI registry on loopback (Debian's docker-registry) for image tasks where no hub is reachable.
#   scripts/local-registry.sh start [PORT]   start it (default port 5000), storage in $STATE/data; prints HOST:PORT
#   scripts/local-registry.sh stop           stop the one `start` started (by its pid); the stored images are kept
#   scripts/local-registry.sh status         exit 0 when it answers
# Then: grpo-fleet data build --images --registry 127.0.0.1:5000 --insecure-registry, and run the fleet with
# sandbox.image_registry=127.0.0.1:5000 sandbox.image_tls_verify=false (docs/swe-datasets.md).
set -euo pipefail
STATE=${GRPO_FLEET_REGISTRY_STATE:-/var/lib/grpo-fleet/registry}
log() { echo "[local-registry] $*" >&2; }
port() { cat "$STATE/port" 2>/dev/null || echo "${1:-5000}"; }
answers() { curl -fsS "http://127.0.0.1:$(port)/v2/" >/dev/null 2>&1 || python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:' + sys.argv[1] + '/v2/', timeout=2)" "$(port)" 2>/dev/null; }

start() {
  command -v docker-registry >/dev/null || { log "docker-registry missing (apt-get install docker-registry)"; exit 1; }
  if [ -f "$STATE/pid" ] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then echo "127.0.0.1:$(port)"; return; fi
  local p=${1:-5000}
  mkdir -p "$STATE/data"
  printf 'version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:%s\n' \
    "$STATE/data" "$p" >"$STATE/config.yml"
  echo "$p" >"$STATE/port"
  docker-registry serve "$STATE/config.yml" >"$STATE/registry.log" 2>&1 &
  echo $! >"$STATE/pid"
  for _ in $(seq 1 100); do
    if answers; then echo "127.0.0.1:$p"; return; fi
    kill -0 "$(cat "$STATE/pid")" 2>/dev/null || { log "it exited:"; tail -5 "$STATE/registry.log" >&2; exit 1; }
    sleep 0.1
  done
  log "no answer within 10 s"; exit 1
}

stop() {
  [ -f "$STATE/pid" ] || { log "none started by this script"; return; }
  kill "$(cat "$STATE/pid")" 2>/dev/null || true
  rm -f "$STATE/pid"
  log "stopped"
}

case "${1:-}" in
  start) start "${2:-}" ;;
  stop) stop ;;
  status) answers ;;
  *) echo "usage: $0 start [PORT]|stop|status" >&2; exit 2 ;;
esac
