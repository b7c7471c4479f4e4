"""The network services of a run: the shared gRPC runtime, the replay buffer and the sandbox executor."""
