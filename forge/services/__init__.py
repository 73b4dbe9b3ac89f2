"""Long-running helpers around the loop: the dev stack and the codec server."""
