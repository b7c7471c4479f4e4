"""`computer_use`: screenshots in, actions out, on small HTML tasks rendered by Chromium in the sandbox.

`actions` (the action tools and their JSON), `tasks` (the generated pages and their checks), `env` (the registered
environment and dataset). The episode itself runs in the rollout worker (`rollout/agent/computer.py`) over a sandbox
computer session (`sandbox_client/computer.py`); docs/computer-use.md shows the whole path.
"""
