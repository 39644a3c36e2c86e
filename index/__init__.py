"""smerge.index."""
