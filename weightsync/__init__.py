"""Weight sync: how the trainer's weights reach the rollout fleet. Shared wire code, below both fleets: the trainer
imports the sending halves, the rollout worker the receiving halves, and neither imports the other.

- `header`: the codec of `WeightSetHeader` (what a push announces: version, run epoch, every tensor's name, shape
  and dtype, and where the bytes come from) and the checks a receiver makes on it before any byte arrives.
- `dtypes`: the one table of dtype names the wire (and the trainer's precision) uses.
- `base`: the interfaces, `WeightSender` (trainer rank 0 -> a set of workers) and `WeightReceiver` (one push).
- `tcp`, `grpc`, `nccl`: one module per transport (`policy.weight_sync.transport`), each with both halves.
- `factory`: `make_senders` from the config, `make_receiver` from a header, `receive` for one `PushWeights` call.

The gRPC `PushWeights` call always carries the header; only the bytes take the transport's way. This file imports
nothing, so `weightsync.dtypes` and `weightsync.header` cost only torch (no pydantic, no gRPC stubs).
"""
