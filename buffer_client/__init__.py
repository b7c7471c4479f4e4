"""The one client of the replay buffer, for the trainer and the rollout workers alike (shared wire code, a floor
below both fleets, like `sandbox_client`): every RPC with a deadline, retried through an outage."""

from buffer_client.client import BufferClient

__all__ = ["BufferClient"]
