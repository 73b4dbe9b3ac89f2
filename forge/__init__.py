"""Forge: a durable cluster reconciler."""
