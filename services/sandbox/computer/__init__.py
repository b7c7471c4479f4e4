"""Computer sessions: a headless Chromium per session in the sandbox, screenshots out, actions in (issue 23).

`cdp.py` (the DevTools pipe client), `renderer.py` (one browser in bwrap), `task.py` (the task payload, validated),
`sessions.py` (sessions: open / act / finish, owner leases shared with the code sessions), `routes.py` (HTTP).
"""
