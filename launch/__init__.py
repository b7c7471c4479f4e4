"""`grpo-fleet up`: the whole fleet as local processes (the same services compose.yaml runs in containers)."""
