"""Parquet backend (pyarrow's Parquet reader, datasets/parquet_io.py): streamed by row groups in batches of bounded size."""

from __future__ import annotations

import bisect
from typing import Iterator, Sequence

import pyarrow as pa

from smerge.datasets.base import DEFAULT_BATCH_ROWS, InputSource, register_backend
from smerge.datasets.tabular import resolve_columns, sliced
from smerge.errors import InputError

THREADED_DECODE_ROWS = 1 << 18


class ParquetBackend:
    name = "parquet"
    extensions = (".parquet", ".pq")

    def guess_can_open(self, path: str, magic: bytes) -> bool:
        # By extension too: guess_backend asks by content first, so a .parquet file that gets
        # here matched no format and is reported by open() as not readable as Parquet.
        return magic.startswith(b"PAR1") or path.lower().endswith(self.extensions)

    def open(self, path: str, *, keys: Sequence[str] | None = None, variables: Sequence[str] | None = None,
             batch_rows: int = DEFAULT_BATCH_ROWS, decode_times: bool = False) -> InputSource:
        from smerge.datasets.parquet_io import parquet_file
        from smerge.datasets.remote import open_file, source

        try:
            pf = parquet_file(source(path))
        except (OSError, pa.ArrowException) as e:
            with open_file(path, "rb") as f:
                head = f.read(4)
            if not head:
                raise InputError(f"{path}: is empty (0 bytes), not a Parquet file; "
                                 "write it again, or leave it out") from None
            if head != b"PAR1":
                raise InputError(f"{path}: not readable as Parquet: it does not start with the Parquet marker PAR1, "
                                 "so the file is corrupt or truncated, or not Parquet despite its extension") from None
            raise InputError(f"{path}: not readable as Parquet ({e}); the file is truncated or corrupt") from None
        schema, columns, key_names = resolve_columns(path, pf.schema_arrow, keys, variables)
        meta = pf.metadata
        n = meta.num_rows

        # First row of every row group: a row range starts decoding at its first row group.
        group_starts = [0]
        for i in range(meta.num_row_groups):
            group_starts.append(group_starts[-1] + meta.row_group(i).num_rows)
        pf.close()

        def batches(start: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
            try:
                first = max(0, bisect.bisect_right(group_starts, start) - 1)
                last = len(group_starts) - 1 if stop is None else bisect.bisect_left(group_starts, stop)
                groups = list(range(first, min(last, len(group_starts) - 1)))
                if not groups:
                    return
                # pre_buffer=False: pyarrow 26 pre-buffers by default, which held a whole 8M-row file.
                # Arrow's thread pool decodes the columns in parallel only for a range of more than
                # THREADED_DECODE_ROWS rows: its threads' stacks and memory heaps cost ~6 MB of peak
                # memory, for nothing measurable at tens of thousands of rows.
                rows = group_starts[groups[-1] + 1] - group_starts[groups[0]]
                it = parquet_file(source(path), pre_buffer=False, columns=columns).iter_batches(
                    batch_size=batch_rows, columns=columns, row_groups=groups,
                    use_threads=rows > THREADED_DECODE_ROWS)
                base = group_starts[first]
                yield from sliced(it, start - base, None if stop is None else stop - base, schema)
            except (OSError, pa.ArrowException) as e:
                raise InputError(f"{path}: cannot read Parquet data ({e}); the file may be truncated or corrupt") from None

        return InputSource(path=path, format=self.name, schema=schema, keys=key_names, num_rows=n,
                           outer_size=n, inner_size=1, open_batches=batches)


register_backend(ParquetBackend())
