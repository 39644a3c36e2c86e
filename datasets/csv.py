"""CSV backend (pyarrow.csv streaming reader): blocks of bounded size, types inferred.

A row range ``batches(start, stop)`` starts parsing at the byte where data row ``start`` begins,
found by counting line ends (a vectorised pass over the bytes, no parsing), with the column
names and types of the whole file (inferred from its first block, as a read from the start
does). Rows are lines: pyarrow's reader ends a record at every line end (values with line
breaks are refused) and skips empty lines, and the count does the same. A file whose lines end
with a bare ``\r`` is parsed from its start.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import pyarrow as pa

from smerge.datasets.base import DEFAULT_BATCH_ROWS, InputSource, register_backend
from smerge.datasets.remote import is_remote, open_file, source
from smerge.datasets.tabular import rebatch, resolve_columns, sliced
from smerge.errors import InputError


# Bytes parsed per block. pyarrow's streaming reader reads ahead of the consumer: with 8 MiB
# blocks its pool grew with the file (308 MiB peak for an 8M-row, 590 MB file; 89 MiB at 1M
# rows); with 1 MiB blocks it stays at 38 MiB for both.
CSV_BLOCK_BYTES = 1 << 20
MAX_HEADER_BYTES = 64 << 20  # a header line longer than this is refused, not read without bound


def _block_size(path: str) -> int:
    """Arrow's CSV reader needs the header line (and each row) within one block: a block of at
    least four header lines (1 MiB at least); a header longer than MAX_HEADER_BYTES is refused."""
    n = 0
    with open_file(path, "rb") as f:
        while n <= MAX_HEADER_BYTES:
            chunk = f.read(1 << 20)
            i = chunk.find(b"\n")
            if i >= 0 or not chunk:
                n += i if i >= 0 else 0
                break
            n += len(chunk)
    if n > MAX_HEADER_BYTES:
        raise InputError(f"{path}: its header line is longer than {MAX_HEADER_BYTES >> 20} MiB; a CSV header names "
                         "the columns: check that the file is CSV with one header line, or convert it to Parquet")
    return max(CSV_BLOCK_BYTES, 4 * (n + 1))

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

    def _delimiter(self, path: str) -> str:
        delim = "\t" if path.lower().endswith(".tsv") else ","
        if not path.lower().endswith((".csv", ".tsv")):
            with open_file(path, "rb") as f:
                head = f.readline(65536)
            if b"\t" in head and b"," not in head:
                delim = "\t"
        return delim

    def _reader(self, path: str, *, offset: int = 0, schema: pa.Schema | None = None):
        """The streaming reader of the whole file, or (``offset`` > 0) of the data rows from byte
        ``offset`` on, with ``schema``'s column names and types (the file's, from its header)."""
        import pyarrow.csv as pcsv

        parse = pcsv.ParseOptions(delimiter=self._delimiter(path))
        block = _block_size(path)
        if not offset:
            return pcsv.open_csv(source(path), read_options=pcsv.ReadOptions(block_size=block), parse_options=parse)
        stream = open_file(path, "rb") if is_remote(path) else pa.OSFile(path, "rb")
        stream.seek(offset)
        return pcsv.open_csv(stream, read_options=pcsv.ReadOptions(block_size=block, column_names=schema.names),
                             parse_options=parse,
                             convert_options=pcsv.ConvertOptions(column_types={f.name: f.type for f in schema}))

    def open(self, path: str, *, keys: Sequence[str] | None = None, variables: Sequence[str] | None = None,
             batch_rows: int = DEFAULT_BATCH_ROWS, decode_times: bool = False) -> InputSource:
        from smerge.datasets.base import MAGIC_BYTES, _is_text

        with open_file(path, "rb") as f:
            head = f.read(MAGIC_BYTES)
            if not head:
                raise InputError(f"{path}: is empty (0 bytes), not a CSV file with a header row; write it again, "
                                 "or leave it out")
            if not _is_text(head):
                raise InputError(f"{path}: not readable as CSV: it holds binary data, not UTF-8 text, so the file is "
                                 "corrupt, compressed, or not CSV despite its extension")
        try:
            reader = self._reader(path)
            file_schema = reader.schema
        except (OSError, pa.ArrowException) as e:
            raise InputError(f"{path}: cannot read as CSV ({e}); check that it is a CSV file with a header row") from None
        if any(pa.types.is_null(f.type) for f in file_schema):
            _check_inferred_types(path, reader, file_schema, keys)
        schema, columns, key_names = resolve_columns(path, file_schema, keys, variables)

        def batches(start: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
            try:
                offset = row_offset(path, start) if start > 0 else 0
                if offset > 0:
                    reader = self._reader(path, offset=offset, schema=file_schema)
                    yield from sliced(rebatch(reader, batch_rows), 0, None if stop is None else stop - start, schema)
                    return
                if offset < 0:  # past the last row
                    return
                yield from sliced(rebatch(self._reader(path), batch_rows), start, stop, schema)
            except (OSError, pa.ArrowException) as e:
                hint = ("every value must fit its column's type, which the file's first rows set"
                        if "conversion error" in str(e).lower() else "every row needs every column")
                raise InputError(f"{path}: cannot read CSV data ({e}); fix the file ({hint})") from None

        return InputSource(path=path, format=self.name, schema=schema, keys=key_names, num_rows=None,
                           outer_size=None, inner_size=1, open_batches=batches)


def _check_inferred_types(path: str, reader, file_schema: pa.Schema, keys: Sequence[str] | None) -> None:
    """CSV has no types: pyarrow infers them from the first block, and a column without a value
    there has none (``null``). A header-only file has no types at all: refused with a clear
    message rather than read as zero records of unknown types (an empty Parquet or Arrow file
    keeps its types and reads as zero records)."""
    try:
        first = reader.read_next_batch()
    except StopIteration:
        first = None
    except (OSError, pa.ArrowException):
        return  # reported when the rows are read
    if first is None or first.num_rows == 0:
        raise InputError(f"{path}: a header ({', '.join(file_schema.names)}) and no data rows, so its column types "
                         "cannot be known (CSV stores none); for an empty input write an empty Parquet or Arrow "
                         "file, which keeps the types, or leave the file out")
    empty = [k for k in keys or () if k in file_schema.names and pa.types.is_null(file_schema.field(k).type)]
    if empty:
        raise InputError(f"{path}: key column {', '.join(map(repr, empty))} has no values in the first rows, so its "
                         "type cannot be inferred (CSV stores none); fill the missing keys or convert the file to "
                         "Parquet")


LINE_BLOCK = 16 << 20



def row_offset(path: str, row: int) -> int:
    """The byte offset where data row ``row`` (0-based, after the header) begins; -1 when the
    file has at most ``row`` data rows; 0 when it cannot tell (a bare ``\r`` line end before
    the row): parse from the start then. Empty lines (``\n`` or ``\r\n`` alone) are not rows."""
    import numpy as np

    want = row + 1  # non-empty lines to pass: the header, then ``row`` data rows
    seen = 0
    pos = 0
    prev_nl = -1  # file offset of the last line end seen
    prev_byte = -1  # the byte just before the current block
    with (open_file(path, "rb") if is_remote(path) else open(path, "rb", buffering=0)) as f:
        while True:
            block = f.read(LINE_BLOCK)
            if not block:
                break
            buf = np.frombuffer(block, dtype=np.uint8)
            nl = np.flatnonzero(buf == 10)
            # A bare \r (not followed by \n) also ends a line for pyarrow: not counted here.
            cr = np.flatnonzero(buf[:-1] == 13)
            if (prev_byte == 13 and buf[0] != 10) or (cr.size and (buf[cr + 1] != 10).any()):
                return 0
            if nl.size:
                ends = nl + pos
                starts = np.concatenate([[prev_nl + 1], ends[:-1] + 1])
                length = ends - starts
                first = np.where(starts - pos >= 0, buf[np.clip(starts - pos, 0, buf.size - 1)], prev_byte)
                full = (length > 1) | ((length == 1) & (first != 13))
                counts = np.cumsum(full)
                if seen + int(counts[-1]) >= want:
                    i = int(np.searchsorted(counts, want - seen))  # the line holding the last passed row
                    start = int(ends[i]) + 1
                    return start if start < pos + buf.size or f.read(1) else -1
                seen += int(counts[-1])
                prev_nl = int(ends[-1])
            prev_byte = int(buf[-1])
            pos += buf.size
    return -1


register_backend(CSVBackend())
