"""The contracts that are Python rather than .proto, on the ground floor so that both ends of a wire import them:
`sandbox` (what a task is and what a verdict says: the sandbox's HTTP JSON, spoken by the executor, sandbox_client,
the environments and the rollout worker), `buffer` (the replay buffer's plain answers and where a scored group's bytes
live in Redis: spoken by the buffer, its client and both fleets), `groups` (a prompt group, its trajectories and the
scored group as plain types: both fleets work on them, `buffer_client/wire.py` alone converts them), `weights`
(which weights, and a registered worker as the weight pusher sees it) and
`scored_group` (a scored group at the byte level, spoken by the rollout worker and the replay buffer). They import
nothing of the project but the generated protos."""
