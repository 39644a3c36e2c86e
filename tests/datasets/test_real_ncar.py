"""Real NCAR data (Debian's libncarg-data): Pstorm.cdf + Tstorm.cdf, 64 x 33 x 36 on one grid."""

from __future__ import annotations

import os

import netCDF4
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from smerge.cli.main import main
from smerge.datasets import open_input

RECORDS = 64 * 33 * 36  # 76,032


def grid_values(path: str, var: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    with netCDF4.Dataset(path) as ds:
        return (ds["timestep"][:].data, ds["lat"][:].data, ds["lon"][:].data,
                np.ma.filled(ds[var][:].astype(np.float64), np.nan))


def lookup(values, t, la, lo, out_t, out_lat, out_lon):
    it = np.searchsorted(t, out_t)
    ila = np.searchsorted(la, out_lat)
    ilo = np.searchsorted(lo, out_lon)
    assert (t[it] == out_t).all() and (la[ila] == out_lat).all() and (lo[ilo] == out_lon).all()
    return values[it, ila, ilo]


def assert_values_match(out: pa.Table, ncar_dir: str, b_keys=("timestep_b", "lat_b", "lon_b")):
    t, la, lo, p = grid_values(os.path.join(ncar_dir, "Pstorm.cdf"), "p")
    _, _, _, tt = grid_values(os.path.join(ncar_dir, "Tstorm.cdf"), "t")
    ot, ola, olo = (out[c].to_numpy() for c in ("timestep", "lat", "lon"))
    got_p = out["p"].cast(pa.float64()).fill_null(np.nan).to_numpy()
    got_t = out["t"].cast(pa.float64()).fill_null(np.nan).to_numpy()
    np.testing.assert_array_equal(got_p, lookup(p, t, la, lo, ot, ola, olo))
    bt, bla, blo = (out[c].to_numpy() for c in b_keys)
    np.testing.assert_array_equal(got_t, lookup(tt, t, la, lo, bt, bla, blo))


def test_reader_flattens_in_c_order(ncar_dir):
    src = open_input(os.path.join(ncar_dir, "Pstorm.cdf"), batch_rows=5000)
    assert src.keys == ("timestep", "lat", "lon") and src.num_rows == RECORDS
    batches = list(src.batches())
    assert max(b.num_rows for b in batches) <= 5000  # slabs of the outer dimension, bounded
    tab = pa.Table.from_batches(batches)
    t, la, lo, p = grid_values(os.path.join(ncar_dir, "Pstorm.cdf"), "p")
    np.testing.assert_array_equal(tab["timestep"].to_numpy(), np.repeat(t, 33 * 36))
    np.testing.assert_array_equal(tab["lon"].to_numpy(), np.tile(lo, 64 * 33))
    np.testing.assert_array_equal(tab["p"].cast(pa.float64()).fill_null(np.nan).to_numpy(), p.ravel())


def test_pstorm_tstorm_eps0_all_pairs(ncar_dir, tmp_path, capsys):
    out = tmp_path / "pt.parquet"
    rc = main(["cgm", f"{ncar_dir}/Pstorm.cdf", f"{ncar_dir}/Tstorm.cdf", "--local", "-o", str(out),
               "--with-ids", "--json"])
    assert rc == 0
    import json

    stats = json.loads(capsys.readouterr().out)
    assert stats["matched"] == RECORDS and stats["a_unmatched"] == 0 and stats["b_unmatched"] == 0
    tab = pq.read_table(out)
    assert tab.num_rows == RECORDS
    assert tab.schema.names == ["timestep", "lat", "lon", "p", "timestep_b", "lat_b", "lon_b", "t", "a_row", "b_row"]
    assert_values_match(tab, ncar_dir)
    # Identical grids: each record pairs with the record at the same position.
    np.testing.assert_array_equal(tab["a_row"].to_numpy(), tab["b_row"].to_numpy())


def test_pstorm_tstorm_with_b_locally_shuffled(ncar_dir, tmp_path, capsys):
    """10% of B's records moved up to 500 places: pairs still exact, match rate reported."""
    b = pa.Table.from_batches(list(open_input(os.path.join(ncar_dir, "Tstorm.cdf")).batches()))
    rng = np.random.default_rng(7)
    n = b.num_rows
    chosen = rng.choice(n, n // 10, replace=False)
    pos = np.arange(n, dtype=np.float64)
    pos[chosen] = np.clip(chosen + rng.integers(-500, 501, chosen.size), 0, n - 1) - 0.5
    shuffled = b.take(pa.array(np.argsort(pos, kind="stable")))
    bpath = tmp_path / "Tstorm_shuffled.parquet"
    pq.write_table(shuffled, bpath)
    out = tmp_path / "pt.parquet"
    rc = main(["cgm", f"{ncar_dir}/Pstorm.cdf", str(bpath), "--local", "-o", str(out), "--json", "--kappa-max"])
    assert rc == 0
    import json

    stats = json.loads(capsys.readouterr().out)
    print(f"match rate with 10% of B shuffled: {stats['match_pct']:.3f}% (kappa_max {stats['kappa_max']:.4f})")
    assert stats["kappa_max"] == 1.0
    assert stats["match_pct"] >= 99.0
    assert stats["matched"] + stats["a_unmatched"] == RECORDS
    assert_values_match(pq.read_table(out), ncar_dir)


def test_netcdf_output_on_a_grid(ncar_dir, tmp_path):
    out = tmp_path / "pt.nc"
    assert main(["cgm", f"{ncar_dir}/Pstorm.cdf", f"{ncar_dir}/Tstorm.cdf", "--local", "-o", str(out),
                 "--no-progress"]) == 0
    with netCDF4.Dataset(out) as ds, netCDF4.Dataset(f"{ncar_dir}/Pstorm.cdf") as p, \
            netCDF4.Dataset(f"{ncar_dir}/Tstorm.cdf") as t:
        assert ds["p"].dimensions == ("timestep", "lat", "lon") and ds["t"].dimensions == ("timestep", "lat", "lon")
        np.testing.assert_array_equal(np.ma.filled(ds["p"][:], np.nan), np.ma.filled(p["p"][:], np.nan))
        np.testing.assert_array_equal(np.ma.filled(ds["t"][:].astype(np.float64), np.nan),
                                      np.ma.filled(t["t"][:].astype(np.float64), np.nan))
        np.testing.assert_array_equal(ds["lat"][:], p["lat"][:])
        assert "smerge" in ds.history
