"""The trusted test runner: the files here are copied, with pytest and its dependencies, into a folder the sandbox sees
read-only (`services/sandbox/trusted.py` builds it). Stdlib and pytest only: nothing here may import the project, since
inside the sandbox the project is not there."""
