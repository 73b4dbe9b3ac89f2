"""The pure core: models, placement, reconcile, autoscale, invariants.

Nothing here imports temporalio or does I/O; `now` is always a parameter.
"""
