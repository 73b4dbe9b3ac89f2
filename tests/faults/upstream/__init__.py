"""A defect of the Temporal SDK (Core), reproduced with a tiny workflow and no Forge
code, so that the day an SDK upgrade fixes it the suite says so
(``tests/faults/test_upstream_query_takeover.py``)."""
