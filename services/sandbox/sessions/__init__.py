"""The executor's sessions (agent mode): bounded, owned trees an agent edits and runs commands in, graded on `finish`
exactly like a submitted patch.

`manager.py` makes and runs code sessions (`SessionManager`), in a tree here or in a task's instance image
(`image.py`); `registry.py` is the bookkeeping every session kind shares, computer sessions included (bounds, owner
leases, the reaper, tombstones, slots); `files.py` reads and writes inside a session's tree; `diff.py` is the diff
that `finish` grades (test files left out, and why that cannot be gamed); `http.py` serves `/session/*`.
"""
