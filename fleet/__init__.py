"""grpo-fleet's ground floor, imported by every process: the config tree (`config`), the contracts that are Python
rather than .proto (`contracts`), where locally made artefacts live (`paths`), the log format (`logs`), what every
entry point does first (`entry`), the guard that outlives a service to kill its children (`lifeline`), progress
bars for a first run's waits (`progress`), the tokenizer loader every process uses (`tokenizer`) and the proto code
generator (`protogen`). It imports nothing of the project but the generated protos; the command line and the
launcher live in `launch/`, the models made here in `workshop/`."""
