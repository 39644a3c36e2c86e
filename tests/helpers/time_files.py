"""The same station observations and grid in every time representation (CF netCDF, pandas,
polars, DuckDB, CSV, Arrow IPC), and an oracle for their pairs on UTC instants (pandas)."""

from __future__ import annotations

import duckdb
import netCDF4
import numpy as np
import pandas as pd
import pyarrow as pa

GRID_T = pd.to_datetime(["2000-01-01 06:00", "2000-01-01 12:00", "2000-01-01 18:00", "2000-01-02 00:00"])
LATS, LONS = [10.0, 20.0], [100.0, 110.0]
# Station observations (UTC): within 30 min of a cell, exactly 30 min (kept: |d| <= eps), 30 min
# and 1 s (dropped), and 1 h off (dropped).
OBS = pd.DataFrame({
    "station": ["S5", "S1", "S2", "S3", "S4"],
    "time": pd.to_datetime(["2000-01-01 05:00:00", "2000-01-01 06:10:00", "2000-01-01 12:29:59",
                            "2000-01-01 18:30:01", "2000-01-01 23:30:00"]),
    "lat": [10.0, 10.1, 19.9, 10.0, 20.0],
    "lon": [100.0, 100.2, 110.0, 110.0, 100.0],
    "obs": [5.0, 1.0, 2.0, 3.0, 4.0],
})
EPS = "time=30min,lat=0.5,lon=0.5"
EXPECTED = {(0, 1), (7, 2), (14, 4)}  # S1 at 06:00 (10,100); S2 at 12:00 (20,110); S4 at 00:00 (20,100)


def grid_records() -> pd.DataFrame:
    t, la, lo = np.meshgrid(np.arange(4), np.arange(2), np.arange(2), indexing="ij")
    return pd.DataFrame({"time": GRID_T[t.ravel()], "lat": np.array(LATS)[la.ravel()],
                         "lon": np.array(LONS)[lo.ravel()], "temp": np.arange(16, dtype=np.float32)})


def oracle(a: pd.DataFrame, b: pd.DataFrame, eps_t=pd.Timedelta("30min")) -> set[tuple[int, int]]:
    """(a_row, b_row) of every A and B record within eps on each key, on UTC instants (pandas)."""
    x = a[["time", "lat", "lon"]].reset_index(names="a_row").merge(
        b[["time", "lat", "lon"]].reset_index(names="b_row"), how="cross")
    ok = ((x.time_x - x.time_y).abs() <= eps_t) & ((x.lat_x - x.lat_y).abs() <= 0.5) & \
        ((x.lon_x - x.lon_y).abs() <= 0.5)
    return set(zip(x.a_row[ok].tolist(), x.b_row[ok].tolist()))


# ---- writers: the same records (times: naive UTC instants) in one representation ----------

def write_grid_nc(path, df, units, calendar="standard"):
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in (("time", 4), ("lat", 2), ("lon", 2)):
            ds.createDimension(d, n)
        t = ds.createVariable("time", "f8", ("time",))
        t.units, t.calendar = units, calendar
        t[:] = [0, 6, 12, 18]
        ds.createVariable("lat", "f4", ("lat",))[:] = LATS
        ds.createVariable("lon", "f4", ("lon",))[:] = LONS
        ds.createVariable("temp", "f4", ("time", "lat", "lon"))[:] = df.temp.to_numpy().reshape(4, 2, 2)


def write_csv(path, df, fmt):
    out = df.copy()
    out["time"] = [fmt(t) for t in df.time]
    out.to_csv(path, index=False)


def _duckdb(path, df, tz: bool):
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("src", df)
    t = "CAST(time AS TIMESTAMP) AT TIME ZONE 'UTC'" if tz else "CAST(time AS TIMESTAMP)"
    rest = ", ".join(f'"{c}"' for c in df.columns if c != "time")
    con.execute(f"COPY (SELECT {t} AS time, {rest} FROM src) TO '{path}' (FORMAT parquet)")
    con.close()


def _polars(path, df):
    import polars as pl

    pl.from_pandas(df).with_columns(pl.col("time").cast(pl.Datetime("us"))).write_parquet(path)


def _ipc(path, df):
    t = pa.Table.from_pandas(df, preserve_index=False)
    col = pa.array(df.time.to_numpy().astype("datetime64[ms]").astype(np.int64), pa.timestamp("ms", "+05:30"))
    t = t.set_column(t.schema.get_field_index("time"), "time", col)
    with pa.ipc.new_file(path, t.schema) as w:
        w.write_table(t)


TABULAR = {
    "pandas-ns": (".parquet", lambda p, d: d.to_parquet(p)),
    "pandas-utc": (".parquet", lambda p, d: d.assign(time=d.time.dt.tz_localize("UTC")).to_parquet(p)),
    "pandas-paris": (".parquet", lambda p, d: d.assign(
        time=d.time.dt.tz_localize("UTC").dt.tz_convert("Europe/Paris")).to_parquet(p)),
    "polars-us": (".parquet", _polars),
    "duckdb": (".parquet", lambda p, d: _duckdb(p, d, tz=False)),
    "duckdb-tz": (".parquet", lambda p, d: _duckdb(p, d, tz=True)),
    "csv-iso": (".csv", lambda p, d: write_csv(p, d, lambda t: t.strftime("%Y-%m-%dT%H:%M:%S"))),
    "csv-offset": (".csv", lambda p, d: write_csv(p, d, lambda t: (t + pd.Timedelta("2h")).strftime(
        "%Y-%m-%dT%H:%M:%S+02:00"))),
    "arrow-ipc": (".arrow", _ipc),
}
GRIDS = {
    "cf-hours": "hours since 2000-01-01 06:00",
    "cf-offset": "hours since 2000-01-01 08:00 +02:00",
}
# The type each representation's time column has as smerge reads it.
READ_TYPE = {
    "cf-hours": pa.timestamp("us"), "cf-offset": pa.timestamp("us"), "pandas-ns": pa.timestamp("ns"),
    "pandas-utc": pa.timestamp("ns", "UTC"), "pandas-paris": pa.timestamp("ns", "Europe/Paris"),
    "polars-us": pa.timestamp("us"), "duckdb": pa.timestamp("us"), "duckdb-tz": pa.timestamp("us", "UTC"),
    "csv-iso": pa.timestamp("s"), "csv-offset": pa.timestamp("s", "UTC"), "arrow-ipc": pa.timestamp("ms", "+05:30"),
}


def write_files(d) -> dict[tuple[str, str], str]:
    """{(representation, "grid" | "obs"): path} under folder ``d``: the grid (A) in every
    representation, the observations (B) in every tabular one."""
    out = {}
    for name, units in GRIDS.items():
        out[name, "grid"] = str(d / f"grid-{name}.nc")
        write_grid_nc(out[name, "grid"], grid_records(), units)
    for name, (ext, write) in TABULAR.items():
        for what, df in (("grid", grid_records()), ("obs", OBS)):
            out[name, what] = str(d / f"{what}-{name}{ext}")
            write(out[name, what], df)
    return out
