"""Truncation check for classic netCDF files (CDF-1, CDF-2, CDF-5).

The netCDF library reads past the end of a truncated classic file without an error (the
missing data comes back as fill values), so we read the header ourselves (the format is
public and small) and compare the file size with the end of the last variable's data.
"""

from __future__ import annotations

import os
import struct

_TYPE_SIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 4, 6: 8, 7: 1, 8: 2, 9: 4, 10: 8, 11: 8}


class _Header:
    def __init__(self, data: bytes):
        self.d = data
        self.p = 0
        self.version = data[3]
        self.big = self.version == 5  # CDF-5: 64-bit counts

    def i4(self) -> int:
        v = struct.unpack_from(">i", self.d, self.p)[0]
        self.p += 4
        return v

    def count(self) -> int:
        if self.big:
            v = struct.unpack_from(">q", self.d, self.p)[0]
            self.p += 8
            return v
        return self.i4()

    def offset(self) -> int:
        if self.version == 1:
            return self.i4()
        v = struct.unpack_from(">q", self.d, self.p)[0]
        self.p += 8
        return v

    def name(self) -> str:
        n = self.count()
        s = self.d[self.p:self.p + n]
        self.p += (n + 3) // 4 * 4
        return s.decode("utf-8", "replace")

    def atts(self) -> None:
        tag = self.i4()
        n = self.count()
        if tag == 0:
            return
        for _ in range(n):
            self.name()
            t = self.i4()
            k = self.count()
            self.p += (k * _TYPE_SIZE[t] + 3) // 4 * 4


def expected_size(path: str) -> int | None:
    """Bytes a complete classic netCDF file needs, or None when it is not classic/parseable."""
    with open(path, "rb") as f:
        head = f.read(4)
        if head[:3] != b"CDF" or head[3:4] not in (b"\x01", b"\x02", b"\x05"):
            return None
        f.seek(0)
        data = f.read(min(os.path.getsize(path), 16 << 20))
    try:
        h = _Header(data)
        h.p = 4
        numrecs = h.count()
        if numrecs in (-1, 0xFFFFFFFF):
            return None  # streaming: size not recorded
        dims = []
        tag = h.i4()
        n = h.count()
        for _ in range(n if tag else 0):
            h.name()
            dims.append(h.count())
        h.atts()
        tag = h.i4()
        n = h.count()
        end = 0
        recsize = 0
        rec_vars = []
        for _ in range(n if tag else 0):
            h.name()
            nd = h.count()
            ids = [h.count() for _ in range(nd)]
            h.atts()
            t = h.i4()
            h.count() if h.big else h.i4()  # vsize (may be clamped; recomputed below)
            begin = h.offset()
            is_rec = bool(ids) and dims[ids[0]] == 0
            size = _TYPE_SIZE[t]
            for i in ids[1:] if is_rec else ids:
                size *= dims[i]
            if is_rec:
                rec_vars.append((begin, size))
            else:
                end = max(end, begin + size)
        if rec_vars:
            if len(rec_vars) == 1:
                recsize = rec_vars[0][1]
            else:
                recsize = sum((s + 3) // 4 * 4 for _, s in rec_vars)
            if numrecs > 0:
                end = max(end, max(b + (numrecs - 1) * recsize + s for b, s in rec_vars))
        return end
    except (struct.error, KeyError, IndexError):
        return None
