"""Archived streams (docs/semantics.md section 8): a folder holding one stream, appended run by run.

::

    ARCHIVE/manifest.json                 format, version, layout, schema, time column, runs, checksums
    ARCHIVE/.lock                         held (flock) by an append while it runs
    ARCHIVE/runs/<run id>.blocks          one run: its blocks back to back, each a standalone Parquet file
    ARCHIVE/aggregates/<name>/<run id>.parquet   optional tumbling-window aggregates of that run

Layout ``randomize-then-sort`` (OSCAR section 4.1.3): appended records are cut into runs of R
blocks; each record goes to one of the run's R blocks chosen uniformly at random (seeded); the
run is closed when one of its blocks holds B records (or the source ends), as in the paper, so
blocks are not all full. Each block is sorted by time (stable) and stored as its own Parquet
bytes at a recorded offset of the run's file, so it can be read alone with I/O of its own size.

Layout ``eager`` (OnWriteReplicate, 4.1.1): runs of R x B records in time order (the primary
copy, cut into blocks of B) plus, per reduction level L of ``copies``, a copy keeping each
record independently with probability 1 - L (time order, blocks of B). A read at fraction f
reads the smallest copy keeping at least f (``manifest.blocks_for_fraction``).

The manifest lists every block with its run, offset, record count, time range, bytes and
SHA-256, and carries its own SHA-256.

Modules: ``probe`` (``is_archive``, with no heavy import: the CLI asks it of every input),
``manifest`` (the manifest, its checks, reading one block, the blocks for a fraction, ``info``),
``append`` (the writer), ``blocks`` (one run laid out in blocks), ``aggregate`` (aggregate
copies), ``read`` (sampled reads and the ``archive`` input backend), ``sampling`` (one run's
sampled reads: the fraction asked per input and what each read reported; no heavy import).
Nothing is imported here.
"""
