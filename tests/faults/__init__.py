"""The fault matrix (issue 6): real dev servers, real ``worker.py`` processes, real
``kill -9``, real databases. Every test is ``slow`` and runs in CI.

    .venv/bin/pytest tests/faults -q -s

- ``test_kill_random``: workers killed at random moments while passes run;
- ``test_store_outage``: the SQLite file locked, PostgreSQL stopped and started;
- ``test_server_restart``: the Temporal server restarted on its database file;
- ``test_stale_persist``: late, colliding and newer fences; a workflow reset.

Environment: ``FORGE_FAULT_SEED`` replays the kill test's choices (its seed is
printed), ``FORGE_FAULT_TRIALS`` sets its trials (at least 20), ``FORGE_FAULT_REPORT``
names a JSON file that collects every test's figures, ``FORGE_FAULT_STRICT=1`` fails
the kill test instead of marking it xfail when the SDK's nondeterminism wedge
(see ``test_kill_random``) had to be recovered by a reset.
"""
