"""smerge.cli."""
