"""Task-set build tooling (`grpo-fleet data build|list`, the first run's slice): sdists -> bugs -> sandbox-validated
tasks. On the launch floor because it runs the real sandbox executor in process; `envs/swe/taskset.py` reads what it
writes."""
