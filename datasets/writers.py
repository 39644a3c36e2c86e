"""Writers: Parquet (default), CSV, Arrow IPC, netCDF and Zarr; every write is atomic.

A writer writes to a hidden temporary file beside the target and puts it in place only on
``commit()``; ``abort()`` (or an exception inside ``with``) removes it, so a failed run
leaves no half-written output. What may be replaced, temporary names and modes follow the one
rule in ``smerge.datasets.outputs`` (a dataset folder carries its ``MARKER``): without
``overwrite`` the name is claimed atomically at the commit (a run that lost the race for it, or
finds a file created there meanwhile, fails with nothing written); a full disk, quota or file
size limit is an ``OutputError`` naming the cause, with the partial output removed.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

import pyarrow as pa

from smerge.datasets.output_commit import claim_file, identity, replace_dir, retract
from smerge.datasets.output_space import space_errors
from smerge.datasets.output_staging import make_staging, make_temp_file
from smerge.datasets.outputs import check_target
from smerge.errors import OutputError, UsageError, param

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".arrow": "arrow", ".feather": "arrow",
           ".nc": "netcdf", ".nc4": "netcdf", ".cdf": "netcdf", ".zarr": "zarr"}
# A directory of Parquet part files: -o ending with "/" or without extension, or --format parquet-dataset.
DATASET_FORMAT = "parquet-dataset"
GRID_FORMATS = ("netcdf", "zarr")  # on A's grid: the pairs must carry a_row
FOLDER_FORMATS = (DATASET_FORMAT, "zarr")  # written as a staging folder renamed into place


def _ext(path: str) -> str:
    return os.path.splitext(path.rstrip("/" + os.sep))[1].lower()


def is_dataset_path(path: str, fmt: str | None = None) -> bool:
    """True when ``path`` names a folder output: a Parquet dataset directory (see
    ``DATASET_FORMAT``) or a Zarr store (``.zarr``, ``--format zarr``)."""
    if fmt:
        return fmt in FOLDER_FORMATS
    return _ext(path) == ".zarr" or path.endswith(("/", os.sep)) or not _ext(path)


def format_for(path: str, fmt: str | None = None) -> str:
    if fmt:
        if fmt not in set(FORMATS.values()) | {DATASET_FORMAT}:
            raise UsageError(f"{param.format} {fmt!r} is not supported; use one of parquet, csv, arrow, netcdf, zarr, "
                             f"{DATASET_FORMAT}")
        return fmt
    if _ext(path) == ".zarr":
        return "zarr"
    if is_dataset_path(path):
        return DATASET_FORMAT
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise UsageError(
            f"output {path!r}: cannot tell the format from {ext or 'no extension'}; "
            f"use .parquet, .csv, .arrow, .nc or .zarr, or pass {param.format}"
        )
    return FORMATS[ext]


def check_output_path(path: str, *, overwrite: bool, fmt: str | None = None, inputs: Iterable[str | None] = (),
                      opt: str = "-o") -> None:
    """Fail early (``OutputError``) unless ``path`` may be written: the rule of
    ``smerge.datasets.outputs.check_target`` (exists without ``overwrite``, a folder smerge did
    not write, an input, a missing or unwritable directory)."""
    check_target(path, overwrite=overwrite, folder=is_dataset_path(path, fmt), inputs=inputs, opt=opt)


def check_output_schema(path: str, fmt: str, schema: pa.Schema, *, opt: str = "-o") -> None:
    """CSV holds flat values only: refuse (``OutputError``, before the run) a column of nested
    values (struct, list, map, union) for CSV output, naming it and the formats that keep it."""
    if fmt != "csv":
        return
    for f in schema:
        if pa.types.is_nested(f.type) or pa.types.is_dictionary(f.type) and pa.types.is_nested(f.type.value_type):
            raise OutputError(f"{opt} {path!r}: CSV cannot hold column {f.name!r} of nested values ({f.type}); write "
                              "Parquet (.parquet) or Arrow IPC (.arrow), or leave the column out")


class Output:
    """An atomic output file. Use as a context manager, or call ``commit()``/``abort()``."""

    def __init__(self, path: str, schema: pa.Schema, fmt: str, *, overwrite: bool = False, **options: Any):
        check_output_path(path, overwrite=overwrite, fmt=fmt)
        check_output_schema(path, fmt, schema)
        self.path, self.schema, self.format, self.overwrite = path, schema, fmt, overwrite
        self.tmp = make_temp_file(path)  # owner-tagged, 0666 minus the umask
        self.rows = 0
        self._done = False
        self._claimed = None  # (device, inode) of what the commit put at ``path``
        try:
            with space_errors(self.path, where=self.tmp):
                self._w = _make_writer(self.tmp, schema, fmt, **options)
        except BaseException:
            self._discard()
            raise

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            with space_errors(self.path, where=self.tmp, cleanup=self.abort):
                self._w.write(batch)
            self.rows += batch.num_rows

    def commit(self) -> None:
        if self._done:
            return
        try:
            with space_errors(self.path, where=self.tmp):
                self._w.close()
                self._publish()
        except BaseException:
            self._done = True
            self._discard()
            raise
        self._done = True
        if not self.overwrite:
            self._claimed = identity(self.path)

    def retract(self) -> None:
        """Remove the committed output again when it is a new name this run claimed (a later
        output of the run failed to commit); a replaced output cannot be given back."""
        retract(self.path, self._claimed)
        self._claimed = None

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            getattr(self._w, "abort", self._w.close)()  # a writer may drop its work without finishing it
        except Exception:
            pass
        self._discard()

    def _publish(self) -> None:
        """Move the finished temporary output into place (``claim_file``)."""
        claim_file(self.tmp, self.path, overwrite=self.overwrite)

    def _discard(self) -> None:
        if os.path.lexists(self.tmp):
            os.unlink(self.tmp)

    def __enter__(self) -> "Output":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class DatasetOutput(Output):
    """A Parquet dataset directory (part files), written in a hidden staging directory beside
    the target and moved into place on ``commit()``. In-process runs write one part. The
    staging directory holds smerge's marker from the start."""

    def __init__(self, path: str, schema: pa.Schema, fmt: str = DATASET_FORMAT, *, overwrite: bool = False,
                 **options: Any):
        import shutil

        check_output_path(path, overwrite=overwrite, fmt=fmt)
        self.path, self.schema, self.format, self.overwrite = path.rstrip("/" + os.sep), schema, fmt, overwrite
        self.tmp = make_staging(self.path, "tmp", dataset=True)  # marker first; 0777 minus the umask
        self.rows = 0
        self._done = False
        self._claimed = None
        try:
            with space_errors(self.path, where=self.tmp):
                self._w = self._writer(schema, **options)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def _writer(self, schema: pa.Schema, **options: Any):
        return _ParquetWriter(os.path.join(self.tmp, "part-00000.parquet"), schema)

    def _publish(self) -> None:
        replace_dir(self.tmp, self.path, overwrite=self.overwrite)

    def _discard(self) -> None:
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)


class ZarrOutput(DatasetOutput):
    """A Zarr store on A's grid (``zarr_writer.ZarrGridWriter``: the netCDF output's content),
    written into a staging directory (smerge's marker in it) renamed into place on ``commit()``."""

    def _writer(self, schema: pa.Schema, **options: Any):
        from smerge.datasets.zarr_writer import ZarrGridWriter

        return ZarrGridWriter(self.tmp, schema, **options)


def open_output(path: str, schema: pa.Schema, *, fmt: str | None = None, overwrite: bool = False, **options: Any) -> Output:
    """An atomic writer for ``path``; the format from ``fmt`` or the extension.

    netCDF and Zarr output take ``template`` (A's ``InputSource``) and optionally ``template_b``.
    """
    fmt = format_for(path, fmt)
    if fmt == DATASET_FORMAT:
        return DatasetOutput(path, schema, fmt, overwrite=overwrite)
    if fmt == "zarr":
        return ZarrOutput(path, schema, fmt, overwrite=overwrite, **options)
    return Output(path, schema, fmt, overwrite=overwrite, **options)


def parquet_options(schema: pa.Schema) -> dict:
    """Writer options for smerge's Parquet output: dictionary encoding for non-float columns only
    (on float payload it falls back to plain pages after costing ~5x the write time, and the file
    comes out larger); snappy, except on floating-point columns, whose random mantissas it does
    not compress (1.5% smaller at a third of the writer's CPU on a cgm output of float keys and
    payload). With a nested column, snappy throughout (a per-column codec names leaf paths)."""
    floats = {f.name for f in schema if pa.types.is_floating(f.type)}
    nested = any(pa.types.is_nested(f.type) for f in schema)
    compression = "snappy" if nested or not floats else {f.name: "none" if f.name in floats else "snappy"
                                                         for f in schema}
    return {"compression": compression, "use_dictionary": [f.name for f in schema if f.name not in floats]}


class _ParquetWriter:
    def __init__(self, path: str, schema: pa.Schema):
        from smerge.datasets.parquet_io import parquet_writer

        self._w = parquet_writer(path, schema, **parquet_options(schema))

    def write(self, batch: pa.RecordBatch) -> None:
        self._w.write_batch(batch)

    def close(self) -> None:
        self._w.close()


def csv_calendar(field: pa.Field) -> str | None:
    """The calendar a CSV column of ``field`` is written in as dates (see ``_CSVWriter``), or None."""
    from smerge.datasets.cf_time import field_calendar

    return None if pa.types.is_timestamp(field.type) else field_calendar(field)


def calendar_dates(values: pa.Array | pa.ChunkedArray, calendar: str) -> pa.Array:
    """Decoded CF times (int64 microseconds since 1970-01-01 in ``calendar``) as the dates
    cftime writes in that calendar: ``YYYY-MM-DD HH:MM:SS[.ffffff]`` (missing values stay null).
    cftime dates each distinct day (every CF calendar has 86,400-second days); the time of day
    is formatted by Arrow (1M times: about 10 s through cftime alone)."""
    import warnings

    import cftime
    import numpy as np
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    us = values.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    day_us = np.int64(86_400_000_000)
    days, rem = np.divmod(us, day_us)
    uniq, inv = np.unique(days, return_inverse=True)
    with warnings.catch_warnings():  # years before 1: cftime's note on the year-zero convention
        warnings.simplefilter("ignore", cftime.CFWarning)
        dates = np.atleast_1d(cftime.num2date(uniq, "days since 1970-01-01", calendar=calendar)) if len(uniq) else []
    day_text = [str(d).split(" ")[0] for d in dates]

    def two(x):
        return pc.utf8_lpad(pa.array(x).cast(pa.string()), 2, "0")

    sec, frac = np.divmod(rem, 1_000_000)
    fraction = pc.if_else(pa.array(frac != 0), pc.binary_join_element_wise(
        ".", pc.utf8_lpad(pa.array(frac).cast(pa.string()), 6, "0"), ""), "")
    text = pc.binary_join_element_wise(pa.array(day_text, pa.string()).take(pa.array(inv.reshape(-1))), " ",
                                       two(sec // 3600), ":", two(sec // 60 % 60), ":", two(sec % 60), fraction, "")
    return pc.if_else(values.is_null(), pa.scalar(None, pa.string()), text)


class _CSVWriter:
    """CSV has no field metadata, so a decoded CF time that is not a timestamp (a calendar other
    than standard/proleptic_gregorian, or standard dates before 1582-10-15) would be a bare count
    of microseconds read in the wrong calendar. Such a column is written as its dates in its own
    calendar (``calendar_dates``: ``2001-02-30 00:00:00`` in 360_day), under the header
    ``<name> [<calendar>]``: text that no reader takes for a Gregorian date. Every other column,
    timestamps included, is written as pyarrow writes it."""

    def __init__(self, path: str, schema: pa.Schema):
        import pyarrow.csv as pcsv

        self._dates = {i: cal for i, f in enumerate(schema) if (cal := csv_calendar(f))}
        self._schema = pa.schema([pa.field(f"{f.name} [{self._dates[i]}]", pa.string()) if i in self._dates else f
                                  for i, f in enumerate(schema)])
        self._w = pcsv.CSVWriter(path, self._schema)

    def write(self, batch: pa.RecordBatch) -> None:
        if self._dates:
            batch = pa.RecordBatch.from_arrays(
                [calendar_dates(c, self._dates[i]) if i in self._dates else c for i, c in enumerate(batch.columns)],
                schema=self._schema)
        self._w.write_batch(batch)

    def close(self) -> None:
        self._w.close()


class _ArrowWriter:
    def __init__(self, path: str, schema: pa.Schema):
        self._sink = pa.OSFile(path, "wb")
        self._w = pa.ipc.new_file(self._sink, schema)

    def write(self, batch: pa.RecordBatch) -> None:
        self._w.write_batch(batch)

    def close(self) -> None:
        self._w.close()
        self._sink.close()


def _make_writer(path: str, schema: pa.Schema, fmt: str, **options: Any):
    if fmt == "parquet":
        return _ParquetWriter(path, schema)
    if fmt == "csv":
        return _CSVWriter(path, schema)
    if fmt == "arrow":
        return _ArrowWriter(path, schema)
    if fmt == "netcdf":
        from smerge.datasets.netcdf_writer import GridWriter

        return GridWriter(path, schema, **options)
    raise UsageError(f"unknown output format {fmt!r}")
