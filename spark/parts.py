"""Part files of the Spark runners' tasks: written under a temporary name and renamed when
complete (a retried task simply replaces its part), read back by the driver."""

from __future__ import annotations

import os
import time

import pyarrow as pa


class PartWriter:
    """A part file (Arrow IPC or Parquet) written to a temporary name and renamed on close
    (a retried task simply replaces it)."""

    def __init__(self, path: str, schema: pa.Schema, fmt: str = "arrow"):
        self.path, self.tmp = path, f"{path}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        self.schema = schema
        if fmt == "parquet":
            import pyarrow.parquet as pq

            from smerge.datasets.writers import parquet_options
            from smerge.spark.parquet import PART_WRITE_OPTIONS

            self._sink = None
            self._w = pq.ParquetWriter(self.tmp, schema, **parquet_options(schema), **PART_WRITE_OPTIONS)
        else:
            self._sink = pa.OSFile(self.tmp, "wb")
            self._w = pa.ipc.new_file(self._sink, schema)
        self.rows = 0

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        if isinstance(batch, pa.Table):
            for b in batch.to_batches():
                self.write(b)
            return
        if batch.num_rows:
            if batch.schema.names != self.schema.names:
                batch = pa.RecordBatch.from_arrays([batch.column(n) for n in self.schema.names], schema=self.schema)
            self._w.write_batch(batch)
            self.rows += batch.num_rows

    def close(self) -> None:
        self._w.close()
        if self._sink is not None:
            self._sink.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        try:
            self._w.close()
            if self._sink is not None:
                self._sink.close()
        finally:
            if os.path.exists(self.tmp):
                os.unlink(self.tmp)


def read_part(path: str):
    """The record batches of the Arrow IPC part file ``path`` (none when the file is missing:
    the task had nothing to write); memory-mapped, one batch at a time."""
    if not os.path.exists(path):
        return
    with pa.memory_map(path) as src:
        reader = pa.ipc.open_file(src)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


__all__ = ["PartWriter", "read_part"]
