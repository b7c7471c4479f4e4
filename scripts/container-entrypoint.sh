#!/bin/sh
# Entrypoint of the fleet images (Dockerfile, `runtime`): makes the executor's per-task cgroups possible, then runs
# the command. services/sandbox/cgroups.py makes one child group per task under the executor's own group, in the v1
# `memory` and `pids` hierarchies. Docker mounts those read-only, and in the host's cgroup namespace they show the
# container's group under a path (/docker/ID) that the mount does not have. In a private cgroup namespace (compose:
# `cgroup: private`) the mount's root *is* the container's group: remounting it writable lets the executor make groups
# below its own only, nested inside the container's limits. Needs CAP_SYS_ADMIN, which the sandbox has for
# bubblewrap; elsewhere (other services, cgroup v2 hosts, Kubernetes, which replaces the entrypoint) nothing changes
# and the executor runs without per-task groups (sandbox.cgroups=auto) or refuses to start (=required).
set -eu
for controller in memory pids; do
  dir=/sys/fs/cgroup/$controller
  [ -e "$dir/cgroup.procs" ] && [ ! -w "$dir/cgroup.procs" ] || continue
  grep -qx "[0-9]*:$controller:/" /proc/self/cgroup || continue  # not the container's own namespace
  mount -o remount,bind,rw "$dir" 2>/dev/null || echo "[entrypoint] cannot make $dir writable" >&2
done
exec "$@"
