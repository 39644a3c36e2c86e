"""Parquet files through pyarrow's own reader and writer classes (``pyarrow._parquet``).

``pyarrow.parquet`` wraps these classes; importing it also loads pyarrow's filesystem modules
(S3, GCS, Azure, HDFS): about 20 ms of every process, 5% of a 0.4 s merge of local files. For
a local path and a flat column selection smerge opens the classes directly, as
``pyarrow.parquet.ParquetFile`` and ``ParquetWriter`` do for a local file, with the same
defaults (tests/datasets/test_parquet_io.py checks that both give the same batches and
byte-identical files). Anything else (a file object from an object store, a nested column
chosen by its path, an older pyarrow whose classes take other arguments) goes through
``pyarrow.parquet``.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import pyarrow as pa


class _LocalParquetFile:
    """The part of ``pyarrow.parquet.ParquetFile`` smerge uses, over a local file."""

    def __init__(self, path: str, *, pre_buffer: bool):
        from pyarrow._parquet import ParquetReader

        self._file = pa.OSFile(path, "rb")
        try:
            self.reader = ParquetReader()
            try:  # Arrow's extension types (UUID, JSON, ...) as pyarrow.parquet reads them
                self.reader.open(self._file, pre_buffer=pre_buffer, arrow_extensions_enabled=True)
            except TypeError:  # an older pyarrow: no such option (pyarrow.parquet has none either)
                self.reader.open(self._file, pre_buffer=pre_buffer)
        except BaseException:
            self._file.close()
            raise

    @property
    def schema_arrow(self) -> pa.Schema:
        return self.reader.schema_arrow

    @property
    def metadata(self):
        return self.reader.metadata

    def column_indices(self, columns: Sequence[str] | None) -> list[int] | None:
        """Leaf column indices of top-level ``columns`` (a nested column: all its leaves), as
        ``ParquetFile`` finds them; None for every column."""
        if columns is None:
            return None
        leaves: dict[str, list[int]] = {}
        for i, path in enumerate(self.reader.column_paths):
            leaves.setdefault(path[0], []).append(i)
        return [i for c in columns for i in leaves.get(c, [])]

    def iter_batches(self, batch_size: int, *, columns: Sequence[str] | None = None,
                     row_groups: Sequence[int] | None = None, use_threads: bool = True) -> Iterator[pa.RecordBatch]:
        if row_groups is None:
            row_groups = range(self.reader.metadata.num_row_groups)
        try:
            yield from self.reader.iter_batches(batch_size, row_groups=row_groups,
                                                column_indices=self.column_indices(columns), use_threads=use_threads)
        finally:
            self._file.close()

    def close(self) -> None:
        self._file.close()


def _flat(names: Sequence[str] | None) -> bool:
    return names is None or not any("." in n for n in names)


def parquet_file(source, *, pre_buffer: bool = True, columns: Sequence[str] | None = None):
    """A reader of ``source`` (a path or a file object) with ``schema_arrow``, ``metadata`` and
    ``iter_batches(batch_size, columns=, row_groups=)``; ``columns`` names the columns that will
    be read (a dotted name is a nested column's path: ``pyarrow.parquet`` resolves it)."""
    if isinstance(source, str) and _flat(columns):
        try:
            return _LocalParquetFile(source, pre_buffer=pre_buffer)
        except TypeError:  # an older pyarrow: its reader class takes other arguments
            pass
    import pyarrow.parquet as pq

    return pq.ParquetFile(source, pre_buffer=pre_buffer)


class _LocalParquetWriter:
    """``pyarrow.parquet.ParquetWriter(path, schema, **options)`` over a local file."""

    def __init__(self, path: str, schema: pa.Schema, options: dict):
        from pyarrow._parquet import ParquetWriter

        self.schema = schema
        self._file = pa.OSFile(path, "wb")
        try:
            # pyarrow.parquet.ParquetWriter's defaults, where its class's own differ
            self._w = ParquetWriter(self._file, schema, version="2.6", writer_engine_version="V2",
                                    data_page_version="1.0", use_deprecated_int96_timestamps=False, **options)
        except BaseException:
            self._file.close()
            raise

    def write_batch(self, batch: pa.RecordBatch) -> None:
        if not batch.schema.equals(self.schema, check_metadata=False):
            raise ValueError(f"batch schema does not match the file's:\n{batch.schema}\nvs.\n{self.schema}")
        self._w.write_table(pa.Table.from_batches([batch]), row_group_size=None)

    def close(self) -> None:
        try:
            self._w.close()
        finally:
            self._file.close()


def parquet_writer(path: str, schema: pa.Schema, **options):
    """A writer of a local Parquet file (``write_batch``, ``close``); ``options`` as
    ``pyarrow.parquet.ParquetWriter`` takes them."""
    try:
        return _LocalParquetWriter(path, schema, options)
    except TypeError:  # an older pyarrow: its writer class takes other arguments
        pass
    import pyarrow.parquet as pq

    return pq.ParquetWriter(path, schema, **options)
