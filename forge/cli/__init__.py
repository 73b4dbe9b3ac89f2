"""The `forge` command line."""
