"""NCAR-like gridded test data: time x lat x lon, float32 variables, ~28 bytes per record.

Records: ``time`` (6-hourly from 2000-01-01: ``timestamp[us]`` in tabular files, CF hours in netCDF), ``lat``, ``lon`` (float32 on a
regular grid), and float32 variables (default ``p, t, u``): 8 + 4 + 4 + 3 x 4 = 28 bytes, as
in the paper's files. Values are smooth fields plus seeded noise.

Displacement model of ``randomize`` (PCT %): round(PCT/100 x records) records, chosen
uniformly without replacement, are each moved from stream position i to i + o with o uniform
in [-displacement, +displacement] (clipped to the stream), keeping the others in order. With
``jitter`` > 0 every lat/lon gets uniform noise in [-jitter, +jitter] (float noise between two
grids, so that eps > 0 is needed). The same arguments and seed give the same bytes.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from smerge.errors import UsageError, param

TIME_UNITS = "hours since 2000-01-01 00:00:00"
_EPOCH_2000_US = 946684800 * 10**6  # 2000-01-01 00:00 UTC in microseconds since 1970


COORDINATES = ("time", "lat", "lon")
# bytes per record of the shuffled arrival order (positions, their sort and the chosen indices)
ORDER_RECORD_BYTES = 40
# the least a record of time, lat, lon and three float32 variables takes in any output format
MIN_RECORD_BYTES = 12
MAX_RECORDS = 10**12  # --records and --displacement: 28 TB of records is far past any test
MAX_GRID = 10**6  # NLAT and NLON each
MAX_JITTER = 360.0  # degrees
_MAX_TIME_STEP = (2**63 - 1 - _EPOCH_2000_US) // (6 * 3600 * 10**6)  # last 6-hourly step in timestamp[us]


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class GenParams:
    """Validated at construction; every limit below is exit 2 in the CLI (README, docs/cgm.md).

    ``records`` 1..10^12; ``randomize`` 0..100 (percent); ``displacement`` 0..10^12 records;
    ``jitter`` 0..360 degrees (finite); ``seed`` an integer >= 0; ``nlat``/``nlon`` 1..10^6;
    ``variables`` distinct names, none of them time/lat/lon (compared ignoring case, as Spark
    does), without control characters.
    """

    records: int
    randomize: float = 0.0
    displacement: int = 1000
    jitter: float = 0.0
    seed: int = 0
    nlat: int = 50
    nlon: int = 100
    variables: tuple[str, ...] = ("p", "t", "u")

    def __post_init__(self) -> None:
        if not _is_int(self.records) or not 1 <= self.records <= MAX_RECORDS:
            raise UsageError(f"{param.records} is {self.records}; give an integer from 1 to 10^12")
        if not (isinstance(self.randomize, numbers.Real) and 0 <= self.randomize <= 100):
            raise UsageError(f"{param.randomize} is {self.randomize}; give a percentage from 0 to 100")
        if not _is_int(self.displacement) or not 0 <= self.displacement <= MAX_RECORDS:
            raise UsageError(f"{param.displacement} is {self.displacement}; give a number of records from 0 to 10^12")
        if not (isinstance(self.jitter, numbers.Real) and 0 <= self.jitter <= MAX_JITTER):
            raise UsageError(f"{param.jitter} is {self.jitter}; give a finite number of degrees from 0 to {MAX_JITTER:g}")
        if not _is_int(self.seed) or self.seed < 0:
            raise UsageError(f"{param.seed} is {self.seed}; give an integer >= 0")
        for name, n in (("NLAT", self.nlat), ("NLON", self.nlon)):
            if not _is_int(n) or not 1 <= n <= MAX_GRID:
                raise UsageError(f"{param.grid} {self.nlat},{self.nlon}: {name} is {n}; give NLAT,NLON from 1 to 10^6 each")
        steps = -(-self.records // (self.nlat * self.nlon))
        if steps - 1 > _MAX_TIME_STEP:
            raise UsageError(f"{param.records} {self.records} on a {self.nlat}x{self.nlon} grid is {steps:,} 6-hourly "
                             f"time steps, past the last date a timestamp holds; use a larger {param.grid} or fewer records")
        self._check_variables()

    def check_memory(self) -> None:
        """Before generating: the shuffled arrival order is built in memory (``smerge.memory``)."""
        if self.randomize:
            from smerge.memory import check_fits

            check_fits(self.records * ORDER_RECORD_BYTES, f"{param.randomize} on {self.records:,} records (their "
                       "arrival order is built in memory)", f"lower {param.records}, or leave out {param.randomize}")

    def _check_variables(self) -> None:
        names = tuple(self.variables)
        if not names:
            raise UsageError(f"{param.variables} is empty; give variable names such as p,t,u")
        seen: dict[str, str] = {c: c for c in COORDINATES}
        for v in names:
            if not isinstance(v, str) or not v.strip() or v != v.strip():
                raise UsageError(f"{param.variables} name {v!r} is empty or has spaces around it; give names such as p,t,u")
            if any(ord(c) < 32 or ord(c) == 127 for c in v):
                raise UsageError(f"{param.variables} name {v!r} has a control character; use printable names")
            other = seen.get(v.lower())
            if other in COORDINATES:
                what = ("is a coordinate column" if other == v else
                        f"clashes with the coordinate column {other!r} (names differing only in case clash in Spark)")
                raise UsageError(f"{param.variables} {','.join(names)}: {v!r} {what}; the records already have "
                                 f"{', '.join(COORDINATES)}, so name the variables otherwise")
            if other is not None:
                same = "twice" if other == v else f"and {other!r} (names differing only in case clash in Spark)"
                raise UsageError(f"{param.variables} {','.join(names)} names {v!r} {same}; give each variable once")
            seen[v.lower()] = v

    @property
    def per_step(self) -> int:
        return self.nlat * self.nlon

    @property
    def gridded(self) -> bool:
        """True when the records form a whole grid in C order (no shuffle, no jitter)."""
        return self.randomize == 0 and self.jitter == 0 and self.records % self.per_step == 0


def axes(p: GenParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    nt = math.ceil(p.records / p.per_step)
    time = np.arange(nt, dtype=np.float64) * 6.0
    lat = np.linspace(-60.0, 60.0, p.nlat, dtype=np.float32) if p.nlat > 1 else np.zeros(1, np.float32)
    lon = (np.arange(p.nlon, dtype=np.float32) * np.float32(360.0 / p.nlon) - np.float32(180.0))
    return time, lat, lon


def stream_order(p: GenParams) -> np.ndarray | None:
    """Arrival order of the grid records (None when unshuffled)."""
    n = p.records
    k = int(round(p.randomize / 100.0 * n))
    if k == 0:
        return None
    rng = np.random.default_rng([p.seed, 1])
    chosen = rng.choice(n, size=k, replace=False)
    pos = np.arange(n, dtype=np.float64)
    off = rng.integers(-p.displacement, p.displacement + 1, size=k)
    pos[chosen] = np.clip(chosen + off, 0, n - 1) - 0.5
    return np.argsort(pos, kind="stable")


def _values(p: GenParams, flat: np.ndarray, time, lat, lon, rng) -> dict[str, np.ndarray]:
    per = p.per_step
    ti, rest = np.divmod(flat, per)
    li, oi = np.divmod(rest, p.nlon)
    la, lo, t = lat[li].astype(np.float64), lon[oi].astype(np.float64), time[ti]
    out = {}
    for j, name in enumerate(p.variables):
        base = np.cos(np.radians(la)) * np.sin(np.radians(lo + 7.5 * (j + 1)) + t / 48.0)
        out[name] = (100.0 * (j + 1) + 10.0 * base + rng.standard_normal(flat.size)).astype(np.float32)
    return out


def generate(p: GenParams, *, batch_rows: int = 262144, raw_time: bool = False) -> Iterator[pa.RecordBatch]:
    """The records in arrival order, as batches of the schema ``time, lat, lon, vars...``.

    ``time`` is ``timestamp[us]`` (what smerge's netCDF reader decodes the CF time to), or with
    ``raw_time`` the stored numbers (float64 hours since 2000-01-01)."""
    time, lat, lon = axes(p)
    order = stream_order(p)
    for start in range(0, p.records, batch_rows):
        stop = min(start + batch_rows, p.records)
        flat = np.arange(start, stop, dtype=np.int64) if order is None else order[start:stop]
        rng = np.random.default_rng([p.seed, 2, start])
        ti, rest = np.divmod(flat, p.per_step)
        li, oi = np.divmod(rest, p.nlon)
        la, lo = lat[li], lon[oi]
        if p.jitter > 0:
            la = (la + rng.uniform(-p.jitter, p.jitter, flat.size)).astype(np.float32)
            lo = (lo + rng.uniform(-p.jitter, p.jitter, flat.size)).astype(np.float32)
        vals = _values(p, flat, time, lat, lon, rng)
        t = pa.array(time[ti]) if raw_time else pa.array(
            (time[ti] * 3600e6).astype(np.int64) + _EPOCH_2000_US, type=pa.timestamp("us"))
        cols = {"time": t, "lat": pa.array(la), "lon": pa.array(lo)}
        cols.update({k: pa.array(v) for k, v in vals.items()})
        yield pa.RecordBatch.from_pydict(cols)


def check_netcdf_names(p: GenParams) -> None:
    """Refuse variable names netCDF cannot hold (or would read as a group path, ``a/b``), before
    any file is made: each name is tried in a diskless dataset."""
    import netCDF4

    for v in p.variables:
        if "/" in v:
            raise UsageError(f"{param.variables} name {v!r} has a '/', which netCDF reads as a group path; rename it "
                             "or write .parquet")
    with netCDF4.Dataset("smerge-gen-names.nc", "w", diskless=True, persist=False) as ds:
        ds.createDimension("record", 1)
        for v in p.variables:
            try:
                ds.createVariable(v, "f4", ("record",))
            except (RuntimeError, ValueError) as e:
                reason = str(e).split(":")[1].strip() if str(e).count(":") >= 1 else str(e)
                raise UsageError(f"{param.variables} name {v!r} is not a valid netCDF variable name ({reason}); rename it "
                                 "or write .parquet") from None


def write_netcdf(path: str, p: GenParams) -> None:
    """netCDF: a (time, lat, lon) grid when ``p.gridded``, else a CF point list on ``record``."""
    import netCDF4

    time, lat, lon = axes(p)
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.Conventions = "CF-1.8"
        ds.title = "smerge gen: NCAR-like gridded test data"
        ds.smerge_gen = repr(p)
        if p.gridded:
            ds.createDimension("time", len(time))
            ds.createDimension("lat", p.nlat)
            ds.createDimension("lon", p.nlon)
            tv = ds.createVariable("time", "f8", ("time",))
            tv.units = TIME_UNITS
            ds.createVariable("lat", "f4", ("lat",)).units = "degrees_north"
            ds.createVariable("lon", "f4", ("lon",)).units = "degrees_east"
            tv[:] = time
            ds["lat"][:] = lat
            ds["lon"][:] = lon
            vars_ = {v: ds.createVariable(v, "f4", ("time", "lat", "lon")) for v in p.variables}
            # Whole time steps per batch, so that each batch reshapes to (steps, lat, lon).
            for b in generate(p, batch_rows=p.per_step * max(1, 262144 // p.per_step), raw_time=True):
                t0 = int(round(b.column("time")[0].as_py() / 6.0))
                nt = b.num_rows // p.per_step
                for v, var in vars_.items():
                    var[t0:t0 + nt] = b.column(v).to_numpy().reshape(nt, p.nlat, p.nlon)
            return
        ds.featureType = "point"
        ds.createDimension("record", p.records)
        tv = ds.createVariable("time", "f8", ("record",))
        tv.units = TIME_UNITS
        ds.createVariable("lat", "f4", ("record",)).units = "degrees_north"
        ds.createVariable("lon", "f4", ("record",)).units = "degrees_east"
        for v in p.variables:
            ds.createVariable(v, "f4", ("record",)).coordinates = "time lat lon"
        pos = 0
        for b in generate(p, raw_time=True):
            n = b.num_rows
            for name in b.schema.names:
                ds[name][pos:pos + n] = b.column(name).to_numpy()
            pos += n
