"""The planning of a partitioned CGM run: the k1 scan and the outer-index runs (no Spark needed).

The scan reads a netCDF key in its stored form and maps only each chunk's range and samples
to key values (``InputSource.raw_key``); it must give exactly the statistics of the key values
read record by record, on keys built to be awkward: CF times in several calendars, integer and
packed times, fill values, NaN and infinite values, a float32 key, a key with a scale factor
that reverses its order.
"""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest

from smerge.datasets import open_input
from smerge.spark.cgm.plan import ORDER_PER_CHUNK, SAMPLE_PER_CHUNK, needed_runs, outer_runs, scan_chunks
from smerge.spark.cgm.tasks import SideSpec, key_columns


def _point_list(path, values, *, dtype="f8", attrs=None, fill=None, scale=None, name="time"):
    with netCDF4.Dataset(path, "w") as ds:
        n = len(values)
        ds.createDimension("obs", n)
        v = ds.createVariable(name, dtype, ("obs",), fill_value=fill)
        for a, x in (attrs or {}).items():
            v.setncattr(a, x)
        if scale is not None:
            v.scale_factor = scale
        if np.ma.isMaskedArray(values):
            v.set_auto_mask(True)
        v[:] = values
        lat = ds.createVariable("lat", "f4", ("obs",))
        lat[:] = np.linspace(-60, 60, n)
        p = ds.createVariable("p", "f4", ("obs",))
        p.coordinates = f"{name} lat"
        p[:] = np.arange(n, dtype=np.float32)
    return str(path)


def _spec(path, step, batch_rows=64):
    src = open_input(path, batch_rows=batch_rows)
    return SideSpec(path=path, keys=tuple(src.keys), variables=None, batch_rows=batch_rows, schema=src.schema,
                    step=step, inner=int(src.inner_size or 1), outer=src.outer_size), src


def _oracle(src, keys, step, inner, first, last):
    """The stats the scan must give, from the key values of every record (``batches()``)."""
    k1 = np.concatenate([key_columns(b, keys[:1])[:, 0] for b in src.batches()])
    rows = step * inner
    out = []
    for c in range(first, (len(k1) + rows - 1) // rows if last is None else last + 1):
        seg = k1[c * rows:(c + 1) * rows]
        nan = np.isnan(seg)
        good = seg[~nan]
        out.append({
            "chunk": c, "count": seg.size, "nan_k1": bool(nan.any()),
            "first_nan_row": c * rows + int(np.argmax(nan)) if nan.any() else -1,
            "k1_min": float(good.min()) if good.size else np.inf,
            "k1_max": float(good.max()) if good.size else -np.inf,
            "sample": good[::max(1, good.size // SAMPLE_PER_CHUNK)], "order": good[::max(1, good.size // ORDER_PER_CHUNK)],
        })
    return out


def _check(path, step=7, first=0, last=None):
    spec, src = _spec(path, step)
    assert src.raw_key is not None  # the stored-form path is the one under test
    got = scan_chunks("a", spec, first, last)
    want = _oracle(src, spec.keys, step, spec.inner, first, last)
    assert [s.chunk for s in got] == [w["chunk"] for w in want]
    for s, w in zip(got, want):
        assert (s.count, s.nan_k1, s.first_nan_row) == (w["count"], w["nan_k1"], w["first_nan_row"])
        assert (s.k1_min, s.k1_max) == (w["k1_min"], w["k1_max"])
        np.testing.assert_array_equal(s.sample, w["sample"])
        np.testing.assert_array_equal(s.order, w["order"])
    return got


RNG = np.random.default_rng(7)
TIMES = np.cumsum(RNG.uniform(0, 2, 500)) - 40 + RNG.normal(0, 3, 500)  # partially sorted, some negative


@pytest.mark.parametrize("calendar", ["standard", "proleptic_gregorian", "noleap", "360_day", "julian", "all_leap"])
def test_scan_of_cf_times_equals_the_decoded_keys(tmp_path, calendar):
    _check(_point_list(tmp_path / "t.nc", TIMES, attrs={"units": "hours since 2000-01-01 06:00", "calendar": calendar}))


def test_scan_with_missing_and_non_finite_times(tmp_path):
    vals = TIMES.copy()
    vals[[3, 80, 81, 499]] = np.nan
    vals[[10, 200]] = np.inf
    vals[300] = -np.inf
    masked = np.ma.masked_array(vals, mask=np.zeros(vals.size, bool))
    masked[[50, 51, 140]] = np.ma.masked
    got = _check(_point_list(tmp_path / "t.nc", masked, fill=-9999.0, attrs={"units": "days since 1850-01-01"}))
    assert got[0].first_nan_row == 3 and any(s.nan_k1 for s in got[1:])


def test_scan_of_integer_and_packed_times(tmp_path):
    ints = np.ma.masked_array(np.round(TIMES * 10).astype(np.int32), mask=np.zeros(TIMES.size, bool))
    ints[[5, 6, 400]] = np.ma.masked
    _check(_point_list(tmp_path / "i.nc", ints, dtype="i4", fill=-1, attrs={"units": "minutes since 1970-01-01"}))
    _check(_point_list(tmp_path / "p.nc", TIMES, dtype="i2", scale=0.01, attrs={"units": "days since 2010-01-01"}))
    # A negative scale factor reverses the stored order; the scan works on unpacked values.
    _check(_point_list(tmp_path / "n.nc", TIMES, dtype="i2", scale=-0.01, attrs={"units": "days since 2010-01-01"}))


def test_scan_of_plain_float_keys_keeps_infinities_as_keys(tmp_path):
    vals = (TIMES / 3).astype(np.float32)
    vals[[7, 8]] = np.nan
    vals[20] = np.inf
    got = _check(_point_list(tmp_path / "lat.nc", vals, dtype="f4", name="height"))
    assert got[2].k1_max == np.inf


def test_scan_of_part_of_the_chunks(tmp_path):
    path = _point_list(tmp_path / "t.nc", TIMES, attrs={"units": "seconds since 1999-12-31"})
    got = _check(path, step=13, first=3, last=9)
    assert [s.chunk for s in got] == list(range(3, 10))
    _check(path, step=13, first=30, last=None)  # the short last chunk


def test_outer_runs_are_exact_and_agree_with_chunk_runs():
    k1 = np.array([0, 1, 2, 3, np.nan, 5, 6, 4, 8, 9, 3.5, 11], dtype=np.float64)
    assert outer_runs(k1, 3, 6, False, False) == ((3, 4), (5, 6), (7, 8), (10, 11))
    assert outer_runs(k1, 3, 6, True, False) == ((3, 4), (5, 8), (10, 11))
    assert outer_runs(k1, -np.inf, 2, False, True) == ((0, 2), (4, 5))
    assert outer_runs(k1, 100, np.inf, False, False) == ()
    # Every index an exact run holds is in a chunk the chunk-level rule reads.
    from smerge.spark.cgm.plan import coord_chunk_stats

    spec = SideSpec(path="x", keys=("t",), variables=None, batch_rows=3, schema=None, step=3, inner=1,
                    outer=k1.size)
    chunks = needed_runs(coord_chunk_stats("a", spec, k1), 3, 6, False, False, 3)
    inside = {i for a, b in chunks for i in range(a, b)}
    assert {i for a, b in outer_runs(k1, 3, 6, False, False) for i in range(a, b)} <= inside
