"""CSV backend (pyarrow.csv streaming reader): blocks of bounded size, types inferred."""

from __future__ import annotations

from typing import Iterator, Sequence

import pyarrow as pa

from smerge.datasets.base import DEFAULT_BATCH_ROWS, InputSource, register_backend
from smerge.datasets.tabular import rebatch, resolve_columns, sliced
from smerge.errors import InputError


class CSVBackend:
    name = "csv"
    extensions = (".csv", ".tsv", ".txt")

    def guess_can_open(self, path: str, magic: bytes) -> bool:
        if path.lower().endswith(self.extensions):
            return True
        # No telling extension: UTF-8 text whose first line has a delimiter looks like CSV.
        if not magic or b"\x00" in magic:
            return False
        try:
            first = magic.decode("utf-8").splitlines()[0]
        except (UnicodeDecodeError, IndexError):
            return False
        return "," in first or "\t" in first

    def _reader(self, path: str):
        import pyarrow.csv as pcsv

        delim = "\t" if path.lower().endswith(".tsv") else ","
        if not path.lower().endswith((".csv", ".tsv")):
            with open(path, "rb") as f:
                head = f.readline(65536)
            if b"\t" in head and b"," not in head:
                delim = "\t"
        return pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=8 << 20),
                             parse_options=pcsv.ParseOptions(delimiter=delim))

    def open(self, path: str, *, keys: Sequence[str] | None = None, variables: Sequence[str] | None = None,
             batch_rows: int = DEFAULT_BATCH_ROWS, decode_times: bool = False) -> InputSource:
        try:
            reader = self._reader(path)
            file_schema = reader.schema
        except (OSError, pa.ArrowException) as e:
            raise InputError(f"{path}: cannot read as CSV ({e}); check that it is a CSV file with a header row") from None
        schema, columns, key_names = resolve_columns(path, file_schema, keys, variables)

        def batches(start: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
            try:
                yield from sliced(rebatch(self._reader(path), batch_rows), start, stop, schema)
            except (OSError, pa.ArrowException) as e:
                raise InputError(f"{path}: cannot read CSV data ({e}); fix the file (every row needs every column)") from None

        return InputSource(path=path, format=self.name, schema=schema, keys=key_names, num_rows=None,
                           outer_size=None, inner_size=1, open_batches=batches)


register_backend(CSVBackend())
