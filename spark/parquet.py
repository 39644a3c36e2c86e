"""Parquet part files written by executors, and their byte-level concatenation into one file.

Executors encode their part of the output as Parquet files (in parallel). When the user asked
for one file, the driver joins the parts without decoding them: it copies each part's column
chunks (the bytes between the leading ``PAR1`` and the footer) one after the other and writes
one footer whose row groups are the parts' row groups with every absolute file offset shifted
by where the part's bytes now start. The footer is Thrift (compact protocol); the small codec
below reads and writes it generically and rewrites only the offset fields, so every other
piece of metadata (schema, statistics, encodings, key-value metadata) is kept as written.

Parts must be written without page indexes and bloom filters (``PART_WRITE_OPTIONS``): those
live outside the footer and hold absolute offsets of their own. ``concat_parquet`` checks this
and refuses parts it cannot join exactly.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import pyarrow as pa

MAGIC = b"PAR1"
PART_WRITE_OPTIONS = {"write_page_index": False, "write_statistics": True}

# Thrift compact protocol type ids.
_BOOL_TRUE, _BOOL_FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)

# Field ids (parquet.thrift) of the offsets to shift.
_FMD_NUM_ROWS, _FMD_ROW_GROUPS = 3, 4
_RG_COLUMNS, _RG_FILE_OFFSET, _RG_ORDINAL = 1, 5, 7
_CC_FILE_PATH, _CC_FILE_OFFSET, _CC_META, _CC_OFFSET_INDEX, _CC_COLUMN_INDEX, _CC_CRYPTO = 1, 2, 3, 4, 6, 8
_CMD_OFFSETS = (9, 10, 11)  # data_page_offset, index_page_offset, dictionary_page_offset
_CMD_BLOOM = 14


class ParquetConcatError(ValueError):
    """A part file cannot be joined byte-for-byte (encrypted, page index, bloom filter, ...)."""


# --------------------------------------------------------------------------------------------
# Thrift compact codec: a struct is a list of [field_id, type, value].


class _Reader:
    def __init__(self, buf: bytes):
        self.buf, self.pos = buf, 0

    def byte(self) -> int:
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, t: int) -> Any:
        if t in (_BOOL_TRUE, _BOOL_FALSE):
            return t == _BOOL_TRUE
        if t == _BYTE:
            return self.byte()
        if t in (_I16, _I32, _I64):
            return self.zigzag()
        if t == _DOUBLE:
            v = self.buf[self.pos:self.pos + 8]
            self.pos += 8
            return v
        if t == _BINARY:
            n = self.varint()
            v = self.buf[self.pos:self.pos + n]
            self.pos += n
            return v
        if t in (_LIST, _SET):
            h = self.byte()
            size, et = h >> 4, h & 0x0F
            if size == 15:
                size = self.varint()
            if et in (_BOOL_TRUE, _BOOL_FALSE):
                return (et, [self.byte() == 1 for _ in range(size)])
            return (et, [self.value(et) for _ in range(size)])
        if t == _MAP:
            size = self.varint()
            if not size:
                return (0, 0, [])
            h = self.byte()
            kt, vt = h >> 4, h & 0x0F
            return (kt, vt, [(self.value(kt), self.value(vt)) for _ in range(size)])
        if t == _STRUCT:
            return self.struct()
        raise ParquetConcatError(f"unknown Thrift type {t}")

    def struct(self) -> list:
        fields, last = [], 0
        while True:
            h = self.byte()
            if h == 0:
                return fields
            t, delta = h & 0x0F, h >> 4
            fid = last + delta if delta else self.zigzag()
            fields.append([fid, t, self.value(t)])
            last = fid


class _Writer:
    def __init__(self):
        self.out = bytearray()

    def varint(self, n: int) -> None:
        while True:
            if n < 0x80:
                self.out.append(n)
                return
            self.out.append((n & 0x7F) | 0x80)
            n >>= 7

    def zigzag(self, n: int) -> None:
        self.varint((n << 1) ^ (n >> 63))

    def value(self, t: int, v: Any) -> None:
        if t in (_BOOL_TRUE, _BOOL_FALSE):
            return  # carried by the field header
        if t == _BYTE:
            self.out.append(v & 0xFF)
        elif t in (_I16, _I32, _I64):
            self.zigzag(v)
        elif t == _DOUBLE:
            self.out += v
        elif t == _BINARY:
            self.varint(len(v))
            self.out += v
        elif t in (_LIST, _SET):
            et, items = v
            self._list_header(et, len(items))
            if isinstance(items, _Encoded):  # structs encoded before: their bytes as they are
                self.out += b"".join(items)
                return
            for it in items:
                if et in (_BOOL_TRUE, _BOOL_FALSE):
                    self.out.append(1 if it else 2)
                else:
                    self.value(et, it)
        elif t == _MAP:
            kt, vt, items = v
            self.varint(len(items))
            if items:
                self.out.append((kt << 4) | vt)
                for k, x in items:
                    self.value(kt, k)
                    self.value(vt, x)
        elif t == _STRUCT:
            self.struct(v)
        else:
            raise ParquetConcatError(f"unknown Thrift type {t}")

    def _list_header(self, et: int, n: int) -> None:
        if n < 15:
            self.out.append((n << 4) | et)
        else:
            self.out.append(0xF0 | et)
            self.varint(n)

    def struct(self, fields: list) -> None:
        last = 0
        for fid, t, v in fields:
            if t in (_BOOL_TRUE, _BOOL_FALSE):
                t = _BOOL_TRUE if v else _BOOL_FALSE
            delta = fid - last
            if 0 < delta <= 15:
                self.out.append((delta << 4) | t)
            else:
                self.out.append(t)
                self.zigzag(fid)
            self.value(t, v)
            last = fid
        self.out.append(0)


class _Encoded(list):
    """List items (bytes) already in the compact protocol, written as they are."""


def _field(fields: list, fid: int) -> list | None:
    return next((f for f in fields if f[0] == fid), None)


# --------------------------------------------------------------------------------------------
# Parts


def read_footer(path: str, f=None) -> tuple[list, int]:
    """(the parsed FileMetaData struct, the byte offset where the footer starts); ``f``: the file
    already open (binary, unbuffered or buffered), else ``path`` is opened."""
    if f is None:
        with open(path, "rb") as g:
            return read_footer(path, g)
    size = os.fstat(f.fileno()).st_size
    head = os.pread(f.fileno(), 4, 0)
    tail = os.pread(f.fileno(), 8, max(0, size - 8))
    if size < 12 or head != MAGIC or tail[4:] != MAGIC:
        raise ParquetConcatError(f"{path}: not a plain Parquet file (encrypted or damaged)")
    n = struct.unpack("<I", tail[:4])[0]
    start = size - 8 - n
    meta = _Reader(os.pread(f.fileno(), n, start)).struct()
    return meta, start


def _shift_row_group(rg: list, shift: int, ordinal: int, path: str) -> None:
    for f in rg:
        if f[0] == _RG_FILE_OFFSET:
            f[2] += shift
        elif f[0] == _RG_ORDINAL:
            f[2] = ordinal
    cols = _field(rg, _RG_COLUMNS)
    for cc in (cols[2][1] if cols else []):
        for f in cc:
            if f[0] in (_CC_FILE_PATH, _CC_OFFSET_INDEX, _CC_COLUMN_INDEX, _CC_CRYPTO):
                raise ParquetConcatError(f"{path}: has page indexes, external or encrypted columns; cannot join it")
            if f[0] == _CC_FILE_OFFSET:
                f[2] += shift
            elif f[0] == _CC_META:
                for m in f[2]:
                    if m[0] in _CMD_OFFSETS:
                        m[2] += shift
                    elif m[0] == _CMD_BLOOM:
                        raise ParquetConcatError(f"{path}: has bloom filters; cannot join it")


class ParquetJoin:
    """Parquet parts appended one at a time (in order) into ``out_path``; ``finish`` writes the
    one footer. ``take_first``: the first part is moved to ``out_path`` and extended in place (its
    bytes are not copied; same filesystem; consumed). ``truncate(i)`` forgets parts ``i..``
    (appended again later). Memory: the parts' footers (metadata only)."""

    def __init__(self, out_path: str, *, take_first: bool = False):
        self.out_path, self.take_first = out_path, take_first
        self._f = None
        self._reset()

    def _reset(self) -> None:
        if self._f is not None:
            self._f.close()
        self._f = None
        self.pos = len(MAGIC)  # where the next part's bytes go
        self.row_groups: list = []
        self.num_rows = 0
        self.first: list | None = None  # FileMetaData of the first part (schema, key-value metadata)
        self._schema_bytes = b""
        self.parts: list[tuple[str, int, int, int, tuple]] = []  # (path, start, row groups, rows before, identity)
        self._footer_intact = False  # the moved first part still ends with its own footer

    def __len__(self) -> int:
        return len(self.parts)

    def add(self, path: str) -> tuple:
        """Append the part at ``path``; returns its identity (device, inode, size, mtime) as read."""
        if self.take_first and not self.parts:
            os.replace(path, self.out_path)
            self._f = open(self.out_path, "r+b", buffering=0)
            src, own = self._f, True
        else:
            if self._f is None:
                self._f = open(self.out_path, "wb", buffering=0)
                self._f.write(MAGIC)
            src, own = open(path, "rb", buffering=0), False
        try:
            st = os.fstat(src.fileno())
            ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            meta, footer_start = read_footer(path, src)
            sb = _writer_bytes(_field(meta, 2))
            if self.first is None:
                self.first, self._schema_bytes = meta, sb
            elif sb != self._schema_bytes:
                raise ParquetConcatError(f"{path}: its Parquet schema differs from {self.parts[0][0]}'s")
            shift = self.pos - len(MAGIC)
            rg0 = len(self.row_groups)
            rgs = _field(meta, _FMD_ROW_GROUPS)
            for rg in (rgs[2][1] if rgs else []):
                _shift_row_group(rg, shift, len(self.row_groups), path)
                w = _Writer()
                w.struct(rg)
                self.row_groups.append(bytes(w.out))  # encoded now: finish only joins them
            rows0 = self.num_rows
            self.num_rows += _field(meta, _FMD_NUM_ROWS)[2]
            n = footer_start - len(MAGIC)
            if not own:
                _copy(src.fileno(), self._f.fileno(), len(MAGIC), self.pos, n)
            self._footer_intact = own
            self.parts.append((path, self.pos, rg0, rows0, ident))
            self.pos += n
        finally:
            if not own:
                src.close()
        return ident

    def truncate(self, i: int) -> None:
        """Forget parts ``i..`` (the first part moved in place cannot be forgotten alone: i = 0
        starts over, with ``out_path`` removed)."""
        if i >= len(self.parts):
            return
        if i == 0:
            self._reset()
            if os.path.exists(self.out_path):
                os.unlink(self.out_path)
            return
        _, self.pos, rg0, self.num_rows, _ = self.parts[i]
        del self.row_groups[rg0:]
        del self.parts[i:]
        self._footer_intact = False

    def finish(self, schema: pa.Schema) -> int:
        """Write the footer (an empty file of ``schema`` when no part was added); the row count."""
        if not self.parts:
            import pyarrow.parquet as pq

            self._reset()
            pq.write_table(pa.Table.from_batches([], schema=schema), self.out_path)  # empty_table() imports pandas
            return 0
        out = self._f
        try:
            if len(self.parts) == 1 and self._footer_intact:
                return self.num_rows  # the moved part is the whole file, its footer as written
            out.seek(self.pos)
            out.truncate()
            merged = [list(f) for f in self.first if f[0] != _FMD_ROW_GROUPS]
            merged.append([_FMD_ROW_GROUPS, _LIST, (_STRUCT, _Encoded(self.row_groups))])
            merged.sort(key=lambda f: f[0])
            for f in merged:
                if f[0] == _FMD_NUM_ROWS:
                    f[2] = self.num_rows
            w = _Writer()
            w.struct(merged)
            out.write(bytes(w.out) + struct.pack("<I", len(w.out)) + MAGIC)
            return self.num_rows
        finally:
            out.close()
            self._f = None

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def concat_parquet(parts: list[str], out_path: str, schema: pa.Schema, *, take_first: bool = False) -> int:
    """Join Parquet ``parts`` (same schema, in order; missing paths skipped) into ``out_path``;
    return the row count.

    No data is decoded: the parts' column chunks are copied as bytes and one footer is written.
    ``take_first``: the first part is moved to ``out_path`` and extended in place (its bytes are
    not copied; it must be on the same filesystem and is consumed; alone, it is the output as
    written). An empty list gives a valid empty file of ``schema``.
    """
    join = ParquetJoin(out_path, take_first=take_first)
    try:
        for p in parts:
            if os.path.exists(p):
                join.add(p)
        return join.finish(schema)
    finally:
        join.close()


def _writer_bytes(field: list | None) -> bytes:
    w = _Writer()
    if field is not None:
        w.value(field[1], field[2])
    return bytes(w.out)


def _copy(src_fd: int, dst_fd: int, src_off: int, dst_off: int, n: int) -> None:
    """Copy ``n`` bytes between files at explicit offsets (in the kernel when it can)."""
    done = 0
    fast = hasattr(os, "copy_file_range")
    while done < n:
        k = 0
        if fast:
            try:
                k = os.copy_file_range(src_fd, dst_fd, n - done, src_off + done, dst_off + done)
            except OSError:
                fast = False
        if not fast or k == 0:
            chunk = os.pread(src_fd, min(n - done, 1 << 24), src_off + done)
            if not chunk:
                raise ParquetConcatError("a part file ended early")
            k = os.pwrite(dst_fd, chunk, dst_off + done)
        done += k


__all__ = ["concat_parquet", "ParquetJoin", "read_footer", "ParquetConcatError", "PART_WRITE_OPTIONS"]
