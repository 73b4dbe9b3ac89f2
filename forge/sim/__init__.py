"""Simulation tools: a fleet of nodes in one process (:mod:`forge.sim.fleet`)."""
