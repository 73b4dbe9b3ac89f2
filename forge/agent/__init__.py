"""The node agent: runs the replicas Forge binds to its node as real processes.

It is a client of the store (heartbeats, bindings, task reports) and of Temporal
(one signal to register its node); it never imports the workflow. Modules:
``config`` (options, machine detection), ``supervisor`` (processes),
``state`` (what survives an agent restart), ``reporter`` (in-order reports through
store outages), ``usage`` (psutil sampling), ``logfiles`` and ``server`` (task
logs over HTTP), ``limits`` (what the machine can enforce), ``agent`` (the loop),
``run`` (the entry points the CLI calls).
"""
