"""smerge.transport."""
