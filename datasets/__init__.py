"""smerge.datasets."""
