"""The Temporal-facing client Forge's CLI, worker and tools share."""
