"""smerge.xarray: merge/align with a tolerance, on the examples of the xarray issues that asked for it."""

from __future__ import annotations

import datetime
import os

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
hyp = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

import smerge.xarray as sx  # noqa: E402
from smerge.errors import UsageError  # noqa: E402

HOWS = ["cgm", "exact-grid"]


def _grid(name, values, **coords):
    return xr.DataArray(values, coords=list(coords.items()), name=name).to_dataset()


@pytest.mark.parametrize("how", HOWS)
def test_issue_2694_float32_and_float64_coordinates(how):
    """pydata/xarray#2694: d1 * d2 on f64 vs f32 lon/lat gave a (3, 2) array; wanted (11, 6)."""
    lon, lat = np.arange(0, 1.1, 0.1), np.arange(0, 0.6, 0.1)
    a = _grid("d1", np.full((11, 6), 2.0), lon=lon, lat=lat)
    b = _grid("d2", np.full((11, 6), 5.0), lon=lon.astype(np.float32), lat=lat.astype(np.float32))
    m = sx.merge(a, b, eps=1e-6, how=how)
    prod = m.d1 * m.d2
    assert prod.shape == (11, 6) and bool((prod == 10.0).all())
    np.testing.assert_array_equal(m.lat.values, lat)  # A's coordinates
    a2, b2 = sx.align(a, b, eps=1e-6, how=how)
    assert (a2.d1 * b2.d2).shape == (11, 6)


@pytest.mark.parametrize("how", HOWS)
def test_issue_2217_noise_of_1e_14_then_concat(how):
    """pydata/xarray#2217: x = 1..5 plus 1e-14 noise in two files; concatenation must keep 5 x values."""
    rng = np.random.default_rng(0)
    x1, x2 = np.arange(1, 6) + 1e-14 * rng.random(5), np.arange(1, 6) + 1e-14 * rng.random(5)
    a = _grid("v", np.array([9, 0, 2, 1, 0.0]), x=x1)
    b = _grid("v", np.array([9, 0, 2, 1, 0.0]), x=x2)
    assert xr.concat([a, b], "f", join="outer").sizes["x"] == 10  # what the reporter got
    a2, b2 = sx.align(a, b, eps=1e-12, how=how)
    c = xr.concat([a2, b2], "f")
    assert c.sizes["x"] == 5 and not bool(c.v.isnull().any())
    m = sx.merge(a, b, eps=1e-12, how=how)
    np.testing.assert_array_equal(m.v_b.values, b.v.values)


def test_issue_4465_annual_files_with_noisy_lat_combine_along_time():
    """pydata/xarray#4465: yearly files whose lat differs by 1e-14 must combine along time without
    doubling lat: an outer alignment on (time, lat, lon), then fill A's gaps from B."""
    lat = np.linspace(-60, 60, 7)
    lon = np.linspace(0, 300, 6)
    t1 = np.array(["2001-01-01", "2001-07-01"], dtype="datetime64[ns]")
    t2 = np.array(["2002-01-01", "2002-07-01"], dtype="datetime64[ns]")
    a = _grid("sst", np.random.default_rng(1).random((2, 7, 6)), time=t1, lat=lat, lon=lon)
    b = _grid("sst", np.random.default_rng(2).random((2, 7, 6)), time=t2, lat=lat + 1e-14, lon=lon)
    a2, b2 = sx.align(a, b, eps={"lat": 1e-9}, join="outer")
    combined = a2.fillna(b2)
    assert dict(combined.sizes) == {"time": 4, "lat": 7, "lon": 6}
    np.testing.assert_array_equal(combined.sst.values, np.concatenate([a.sst.values, b.sst.values]))
    np.testing.assert_array_equal(combined.lat.values, lat)


@pytest.mark.parametrize("how", HOWS)
def test_issue_784_regridded_grid_equal_up_to_1e_4(how):
    """pydata/xarray#784: a region mask regridded by CDO sits on the model grid up to ~1e-4."""
    lat, lon = np.linspace(-90, 90, 19), np.arange(0, 360, 10.0)
    rng = np.random.default_rng(3)
    model = _grid("tas", rng.random((19, 36)), lat=lat, lon=lon)
    mask = _grid("region", (rng.random((19, 36)) > 0.5).astype(np.int8),
                 lat=lat + rng.uniform(-1e-4, 1e-4, 19), lon=lon + rng.uniform(-1e-4, 1e-4, 36))
    m = sx.merge(model, mask, eps=1e-3, how=how)
    assert not bool(m.region.isnull().any())
    np.testing.assert_array_equal(m.region.values, mask.region.values)
    assert m.smerge.stats["match_pct"] == 100.0


def test_issue_2644_concat_with_tolerance_outer():
    """pydata/xarray#2644: concat of almost aligned arrays with tolerance 0.2: the union grid."""
    da1 = xr.DataArray([[0, 1], [2, 3]], coords=[[0, 1], [0, 1]], dims=["x", "y"], name="v")
    da2 = xr.DataArray([[4, 5], [6, 7]], coords=[[1.1, 2.1], [1.1, 2.1]], dims=["x", "y"], name="v")
    a, b = sx.align(da1.to_dataset(), da2.to_dataset(), eps=0.2, join="outer")
    da = xr.concat([a.v, b.v], "z")
    nan = np.nan
    expected = [[[0, 1, nan], [2, 3, nan], [nan, nan, nan]], [[nan, nan, nan], [nan, 4, 5], [nan, 6, 7]]]
    np.testing.assert_array_equal(da.values, np.array(expected))
    np.testing.assert_array_equal(da.x.values, [0, 1, 2.1])
    np.testing.assert_array_equal(da.y.values, [0, 1, 2.1])


def test_issue_5094_exact_align_after_fft_round_trip():
    """pydata/xarray#5094: coordinates changed by a forward and inverse transform in the last bits."""
    data = np.random.default_rng(4).random((150, 150))
    c = np.fft.fftshift(np.fft.fftfreq(150, 200 / 150))
    noisy = c * (1 + 1e-13)
    a = xr.DataArray(data, dims=["d1", "d2"], coords={"d1": c, "d2": c}, name="f").to_dataset()
    b = xr.DataArray(data, dims=["d1", "d2"], coords={"d1": noisy, "d2": c}, name="g").to_dataset()
    with pytest.raises(ValueError):
        xr.align(a, b, join="exact")
    a2, b2 = sx.align(a, b, eps=1e-9)
    xr.align(a2, b2, join="exact")  # now exact
    assert bool(xr.where(a2.f > 0.5, b2.g, 0).notnull().all())
    np.testing.assert_array_equal(b2.g.values, data)


# ---- equality with reindex_like(method="nearest", tolerance=...) ---------------------------------


@st.composite
def _grids(draw):
    """A grid with spacing >= 1 per axis and a B grid: some of A's values with noise < eps,
    others moved beyond 2 eps, some extra; eps < 1/4 of the spacing, so nearest is unambiguous."""
    eps = draw(st.sampled_from([1e-9, 1e-6, 0.01, 0.2]))
    axes_a, axes_b = [], []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 6))
        steps = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
        a = np.cumsum(steps).astype(np.float64) + draw(st.integers(-5, 5))
        b = []
        for v in a:
            kind = draw(st.sampled_from(["near", "near", "far", "gone"]))
            if kind == "near":
                b.append(v + draw(st.floats(-0.9, 0.9)) * eps)
            elif kind == "far":
                b.append(v + 0.3)
        b += [float(v) + 0.5 for v in draw(st.lists(st.integers(-8, 30), max_size=2, unique=True))]
        b = np.unique(np.array(b, dtype=np.float64))
        if b.size == 0:
            b = np.array([1000.0])
        axes_a.append(a)
        axes_b.append(b[::-1] if draw(st.booleans()) else b)
    return eps, axes_a, axes_b


@settings(max_examples=60, deadline=None)
@given(_grids(), st.sampled_from(HOWS))
def test_equals_reindex_like_nearest_with_tolerance(g, how):
    eps, axes_a, axes_b = g
    dims = [f"d{j}" for j in range(len(axes_a))]
    rng = np.random.default_rng(0)
    a = xr.Dataset({"va": (dims, rng.random([x.size for x in axes_a]))}, coords=dict(zip(dims, axes_a)))
    b = xr.Dataset({"vb": (dims, rng.random([x.size for x in axes_b]))}, coords=dict(zip(dims, axes_b)))
    expected = b.reindex_like(a, method="nearest", tolerance=eps)
    m = sx.merge(a, b, eps=eps, how=how, slab_records=7)
    np.testing.assert_array_equal(m.vb.values, expected.vb.values)
    s = m.smerge.stats
    assert s["matched"] == int(expected.vb.notnull().sum())
    assert s["a_records"] == a.va.size and s["b_records"] == b.vb.size


# ---- the NCAR storm files: lazily opened, streamed, equal to the data ----------------------------


def _storm(ncar_dir, v):
    return xr.open_dataset(os.path.join(ncar_dir, f"{v}storm.cdf"))


@pytest.mark.parametrize("how", HOWS)
def test_storm_files_lazy_streamed_and_equal(ncar_dir, how):
    p = _storm(ncar_dir, "P")
    m = p
    for v in "TUV":
        other = _storm(ncar_dir, v)
        m = sx.merge(m, other, eps={"lat": 1e-3, "lon": 1e-3}, how=how, slab_records=2000)
        assert not other[v.lower()].variable._in_memory  # B was read slab by slab, never cached whole
        xr.testing.assert_equal(m[v.lower()].reset_coords(drop=True), other[v.lower()].load().reset_coords(drop=True))
        assert m.smerge.stats["match_pct"] == 100.0
    assert not m.p.variable._in_memory  # A's variables stay lazy
    assert m.t.attrs == _storm(ncar_dir, "T").t.attrs
    assert "reftime_b" in m  # name clash: B's reftime gets _b


def test_storm_b_transposed_descending_and_float_noise(ncar_dir, tmp_path):
    p, t = _storm(ncar_dir, "P"), _storm(ncar_dir, "T").load()
    noisy = t.assign_coords(lat=t.lat.astype(np.float64) + 1e-7, lon=t.lon.astype(np.float64) - 1e-7)
    b = noisy.isel(lat=slice(None, None, -1)).transpose("lon", "lat", "timestep")
    path = tmp_path / "tb.nc"
    b.to_netcdf(path)
    with xr.open_dataset(path) as lazy:
        m = sx.merge(p, lazy, eps={"lat": 1e-5, "lon": 1e-5}, slab_records=500)
    xr.testing.assert_equal(m.t.reset_coords(drop=True), t.t.reset_coords(drop=True))
    assert m.t.dims == ("timestep", "lat", "lon")
    assert m.smerge.stats["kappa_min"] == 1.0


def test_stats_have_the_keys_of_the_cli(ncar_dir, tmp_path):
    from smerge.jobs import CGMJob, prepare, run_local

    cli = run_local(prepare(CGMJob(a=os.path.join(ncar_dir, "Pstorm.cdf"), b=os.path.join(ncar_dir, "Tstorm.cdf"),
                                   output=str(tmp_path / "o.parquet"), eps={"lat": 1e-3, "lon": 1e-3})))
    m = _storm(ncar_dir, "P").smerge.merge(_storm(ncar_dir, "T"), eps={"lat": 1e-3, "lon": 1e-3})
    assert set(cli) <= set(m.smerge.stats)
    for k in ("a_records", "b_records", "matched", "match_pct", "drop_rate_moving_max"):
        assert m.smerge.stats[k] == cli[k], k


# ---- times, attributes, encodings, errors -----------------------------------------------------------


def test_datetime_keys_with_a_duration_tolerance():
    t = np.arange("2020-01-01", "2020-01-03", dtype="datetime64[h]").astype("datetime64[ns]")
    a = _grid("x", np.arange(t.size, dtype=float), time=t)
    b = _grid("y", np.arange(t.size, dtype=float) * 2, time=t + np.timedelta64(20, "s"))
    for eps in ("1min", np.timedelta64(30, "s"), datetime.timedelta(minutes=1)):
        m = sx.merge(a, b, eps={"time": eps})
        np.testing.assert_array_equal(m.y.values, b.y.values)
    assert bool(sx.merge(a, b, eps={"time": "10s"}).y.isnull().all())
    with pytest.raises(UsageError, match="duration"):
        sx.merge(a, b, eps={"time": 60})
    c = _grid("y", np.zeros(t.size), time=np.arange(t.size, dtype=float))
    with pytest.raises(UsageError, match="same kind"):
        sx.merge(a, c)


def test_attributes_encodings_missing_values_and_netcdf_round_trip(tmp_path):
    a = _grid("v", np.zeros((3, 4)), lat=[0.0, 1.0, 2.0], lon=[0.0, 1.0, 2.0, 3.0])
    b = _grid("v", np.arange(6, dtype=np.int16).reshape(2, 3), lat=[1.0, 2.0], lon=[0.0, 1.0, 2.0])
    b.v.attrs.update(units="K", long_name="temp")
    b.v.encoding.update(dtype="int16", zlib=True)
    m = sx.merge(a, b)
    assert m.v_b.attrs == {"units": "K", "long_name": "temp"}
    assert m.v_b.encoding.get("zlib") is True and "dtype" not in m.v_b.encoding
    assert int(m.v_b.isnull().sum()) == 12 - 6
    np.testing.assert_array_equal(m.v_b.sel(lat=[1.0, 2.0], lon=[0.0, 1.0, 2.0]).values, b.v.values)
    m.to_netcdf(tmp_path / "m.nc")
    with xr.open_dataset(tmp_path / "m.nc") as back:
        xr.testing.assert_equal(back.v_b.load(), m.v_b)


def test_accessor_and_usage_errors():
    a = _grid("u", np.zeros(3), x=[0.0, 1.0, 2.0])
    b = _grid("w", np.ones(3), z=[0.0, 1.0, 2.0])
    with pytest.raises(UsageError, match="keys_b"):
        sx.merge(a, b)
    m = a.smerge.merge(b, keys_b=["z"])
    np.testing.assert_array_equal(m.w.values, 1.0)
    assert a.smerge.stats is None and m.smerge.stats["matched"] == 3
    with pytest.raises(UsageError, match="how"):
        sx.merge(a, b, keys_b=["z"], how="nearest")
    with pytest.raises(UsageError, match="not merge keys"):
        sx.merge(a, b, keys_b=["z"], eps={"y": 1})
    with pytest.raises(UsageError, match="to_dataset"):
        sx.merge(a.u, b, keys_b=["z"])
    with pytest.raises(UsageError, match="slab_records"):
        sx.merge(a, b, keys_b=["z"], slab_records=0)
    assert sx.merge(a, b, keys_b=["z"], eps=np.float32(0.5)).smerge.stats["params"]["eps"] == {"x": 0.5}


def test_dask_backed_inputs_stay_lazy(ncar_dir):
    pytest.importorskip("dask")
    p = xr.open_dataset(os.path.join(ncar_dir, "Pstorm.cdf"), chunks={"timestep": 8})
    t = xr.open_dataset(os.path.join(ncar_dir, "Tstorm.cdf"), chunks={"timestep": 8})
    m = sx.merge(p, t, eps={"lat": 1e-3, "lon": 1e-3}, slab_records=5000)
    assert m.p.chunks is not None  # A's variable still dask-backed
    xr.testing.assert_equal(m.t.reset_coords(drop=True), t.t.load().reset_coords(drop=True))
