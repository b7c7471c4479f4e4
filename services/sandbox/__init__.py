"""The sandbox executor: turns a patch into a verdict inside bubblewrap (seed-compatible HTTP API)."""
