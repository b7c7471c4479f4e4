#!/usr/bin/env bash
# Local images the Dockerfile builds from where nothing can be pulled from a hub; prints what compose needs to use them.
#   eval "$(scripts/docker-base.sh)"  ->  GRPO_FLEET_BASE_IMAGE, GRPO_FLEET_PIP_LOCAL exported
# - grpo-fleet/debian:bookworm: Debian bookworm minbase from debootstrap (the tarball envs.swe.images.base_tarball
#   builds once and caches under /var/cache/grpo-fleet/base; the SWE instance images share it), `docker import`ed.
# - grpo-fleet/pip-local:<hash>: this host's pip find-links wheels (the CPU torch wheel) and extra CA certificates, which
#   a container build does not inherit from the host's pip configuration.
# Both are kept in the engine's storage and made again only when missing or when what they hold changed.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[docker-base] $*" >&2; }
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3

BASE=grpo-fleet/debian:bookworm
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  log "making $BASE (debootstrap the first time, ~1-2 min; then cached)"
  tar=$("$PY" -c 'from envs.swe.images import base_tarball; print(base_tarball())')
  docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$BASE" <"$tar" >/dev/null
fi

# What the host's pip finds locally: find-links folders (only their wheel files) and the extra CA certificates.
links=$(python3 -m pip config get global.find-links 2>/dev/null || true)
certs=(/usr/local/share/ca-certificates/*.crt)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/wheels" "$stage/ca-certificates"
for dir in $links; do
  dir=${dir#file://}
  [ -d "$dir" ] && find "$dir" -maxdepth 1 -name '*.whl' -exec ln -s {} "$stage/wheels/" \;
done
[ -e "${certs[0]}" ] && cp "${certs[@]}" "$stage/ca-certificates/"
hash=$( (cd "$stage" && find . -mindepth 2 -printf '%P\n' | sort && find -L . -type f -printf '%s\n' | sort \
  && cat ca-certificates/* 2>/dev/null) | sha256sum | cut -c1-12)
LOCAL=grpo-fleet/pip-local:$hash
if ! docker image inspect "$LOCAL" >/dev/null 2>&1; then
  log "making $LOCAL ($(find "$stage/wheels" -name '*.whl' | wc -l) wheels, ${#certs[@]} CA certificates)"
  tar -C "$stage" -ch . | docker import - "$LOCAL" >/dev/null
fi
echo "export GRPO_FLEET_BASE_IMAGE=$BASE GRPO_FLEET_PIP_LOCAL=$LOCAL"
