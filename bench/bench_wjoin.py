"""W-join benchmark: 2, 3, 4-way HW-joins over ~1M records per stream, side by side with peers.

Peers, in the same run on the same data:
  * DuckDB running the equivalent SQL query as one batch (materialised as an Arrow table);
  * the seed's comparison (section 6.2.4): HW-join vs a symmetric hash join (XJoin-style) that
    purges its hash tables only every 10,000 input tuples. Both are the same compiled
    per-arrival loop (below), differing only in (a) probing the bucket only inside the window
    period vs scanning the whole bucket and (b) purging by the rule after every arrival vs
    every 10,000 arrivals — the algorithmic difference the seed measures.

Data: per stream N records, integer times uniform on [0, N) (about 1 record per time unit,
so a window of W units holds about W records per stream), join key uniform on [0, K).

Usage: .venv/bin/python bench/bench_wjoin.py [--records 1000000] [--window 1000] [--keys 5000] [--skip-duckdb] [--rounds 5]
           [--ways 2,3,4] [--seed-cases uniform:100,zipf:100] [--items 10000] [--zipf 1.0] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

import duckdb
import numba as nb
import numpy as np
import pyarrow as pa

from smerge.merge.wjoin import wjoin
from smerge.merge.wjoin_params import WJoinParams
from smerge.merge.wjoin_stats import WJoinStats

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402 - bench/common.py


def make_streams(n: int, records: int, keys: int, seed: int = 1) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    return [pa.table({"t": np.sort(rng.integers(0, records, records)).astype(np.int64),
                      "k": rng.integers(0, keys, records).astype(np.int64),
                      "v": rng.normal(size=records)}) for _ in range(n)]


def run_engine(tables, window: int) -> tuple[float, WJoinStats]:
    n = len(tables)
    p = WJoinParams(n, ("t",), window=window, on=("k",))
    stats = WJoinStats()
    t0 = time.perf_counter()
    for _ in wjoin([t.to_batches(max_chunksize=65536) for t in tables], [t.schema for t in tables], p, stats=stats):
        pass
    return time.perf_counter() - t0, stats


def run_duckdb(tables, window: int) -> tuple[float, int]:
    n = len(tables)
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    for i, t in enumerate(tables):
        con.register(f"s{i + 1}", t)
    conds = []
    for i in range(n):
        for j in range(i + 1, n):
            conds.append(f"s{i + 1}.k = s{j + 1}.k" if i == 0 else "TRUE")
            conds.append(f"abs(s{i + 1}.t - s{j + 1}.t) <= {window}")
    q = f"SELECT * FROM {', '.join(f's{i + 1}' for i in range(n))} WHERE " + " AND ".join(c for c in conds if c != "TRUE")
    t0 = time.perf_counter()
    res = con.sql(q).to_arrow_table()
    dt = time.perf_counter() - t0
    con.close()
    return dt, res.num_rows


# ---- the seed's comparison: HW-join vs the periodically purged symmetric hash join ----------
#
# Both are the same compiled per-arrival loop over the same data structures, so that only the
# algorithmic difference the seed measures remains:
#   * per stream, records live in arrival order (= time order) in an array; ``ptr[j]`` is the
#     purge pointer (records below it are gone); each hash bucket is a newest-first chain
#     (``tail`` = newest record of a key, ``prv`` = the previous record of the same key);
#   * HW-join walks a bucket from its newest record back to the start of the probe's period
#     (t >= t_arrival - w) and purges by the rule after every arrival (the cutoff of stream j
#     is min over k != j of latest_k - w: O(n) per arrival with the two smallest latest times;
#     a purge only advances the pointer, the chains need no unlinking since walks stop at it);
#   * the symmetric hash join (XJoin-style) walks the whole bucket down to its purge pointer,
#     testing the window on every entry, and applies the same purge only every
#     ``purge_every`` input tuples, so between purges its buckets fill with stale entries.
# The tuple enumeration over the candidates (pairwise |dt| <= w) is shared code.

@nb.njit(inline="always")
def _count_tuples(n, i, cand, ncand, w, idx, chosen):
    """n-tuples over the candidate lists (stream i fixed) with max - min <= w, iteratively."""
    if n == 2:
        return ncand[1 - i]
    others = np.empty(n - 1, np.int64)
    c = 0
    for j in range(n):
        if j != i:
            others[c] = j
            c += 1
    m = n - 1
    for d in range(m):
        idx[d] = -1
    total = 0
    d = 0
    while d >= 0:
        idx[d] += 1
        j = others[d]
        if idx[d] >= ncand[j]:
            d -= 1
            continue
        t = cand[j, idx[d]]
        ok = True
        for e in range(d):
            if abs(chosen[e] - t) > w:
                ok = False
                break
        if not ok:
            continue
        chosen[d] = t
        if d == m - 1:
            total += 1
        else:
            d += 1
            idx[d] = -1
    return total


@nb.njit
def hash_join_loop(arr_s, arr_r, times, keys, nkeys, w, windowed, purge_every):
    """Per-arrival n-way hash join with a uniform window ``w``: HW-join (windowed=True) or the
    symmetric hash join purged every ``purge_every`` arrivals (windowed=False).
    Returns (tuples, bucket entries visited, peak records held in the tables)."""
    n, m = times.shape
    tail = np.full((n, nkeys), -1, np.int64)
    prv = np.full((n, m), -1, np.int64)
    ptr = np.zeros(n, np.int64)
    arrived = np.zeros(n, np.int64)
    neg = -(1 << 62)
    latest = np.full(n, neg, np.int64)
    lastcut = np.full(n, neg, np.int64)
    cap = 1 << 16
    cand = np.empty((n, cap), np.int64)
    ncand = np.zeros(n, np.int64)
    idx = np.empty(n, np.int64)
    chosen = np.empty(n, np.int64)
    tuples = 0
    visited = 0
    peak = 0
    held = 0
    for a in range(arr_s.shape[0]):
        i = arr_s[a]
        r = arr_r[a]
        ti = times[i, r]
        k = keys[i, r]
        latest[i] = ti
        empty = False
        lo = ti - w
        for j in range(n):
            if j == i:
                continue
            c = 0
            q = tail[j, k]
            p0 = ptr[j]
            if windowed:  # newest first, stop at the period start
                while q >= p0:
                    t = times[j, q]
                    visited += 1
                    if t < lo:
                        break
                    if c < cap:
                        cand[j, c] = t
                        c += 1
                    q = prv[j, q]
            else:  # the whole bucket, window tested on every entry
                while q >= p0:
                    t = times[j, q]
                    visited += 1
                    if t >= lo and c < cap:
                        cand[j, c] = t
                        c += 1
                    q = prv[j, q]
            ncand[j] = c
            if c == 0:
                empty = True
                break
        if not empty:
            tuples += _count_tuples(n, i, cand, ncand, w, idx, chosen)
        prv[i, r] = tail[i, k]
        tail[i, k] = r
        arrived[i] = r + 1
        held += 1
        if windowed or (a + 1) % purge_every == 0:
            # cutoff_j = min_{k != j} latest_k - w, from the two smallest latest times
            m1, m2, k1 = 1 << 62, 1 << 62, -1
            for kk in range(n):
                v = latest[kk]
                if v < m1:
                    m2, m1, k1 = m1, v, kk
                elif v < m2:
                    m2 = v
            for j in range(n):
                mn = m2 if j == k1 else m1
                if mn == neg:
                    continue
                cut = mn - w
                if cut <= lastcut[j]:
                    continue  # cutoff unchanged since the last purge of stream j: nothing to drop
                lastcut[j] = cut
                p = ptr[j]
                e = arrived[j]
                while p < e and times[j, p] < cut:
                    p += 1
                held -= p - ptr[j]
                ptr[j] = p
        if held > peak:
            peak = held
    return tuples, visited, peak


def zipf_keys(rng, records: int, items: int, s: float) -> np.ndarray:
    """Item numbers with Zipf(s) popularity over ``items`` items (s = 0: uniform)."""
    if s == 0:
        return rng.integers(0, items, records).astype(np.int64)
    p = 1.0 / np.arange(1, items + 1) ** s
    return rng.choice(items, records, p=p / p.sum()).astype(np.int64)


def arrival(tables):
    T = np.concatenate([t["t"].to_numpy() for t in tables])
    S = np.concatenate([np.full(t.num_rows, i, np.int64) for i, t in enumerate(tables)])
    R = np.concatenate([np.arange(t.num_rows, dtype=np.int64) for t in tables])
    o = np.lexsort((R, S, T))
    times = np.stack([t["t"].to_numpy() for t in tables])
    keys = np.stack([t["k"].to_numpy() for t in tables])
    return S[o], R[o], times, keys


def machine() -> str:
    """One line for the report: bench/common.machine() plus this bench's peers' versions."""
    m = common.machine()
    return (f"{m['nproc']} cores, {m['cpu']}, {m['memory_gb']} GiB; Python {m['python']}, "
            f"pyarrow {m['pyarrow']}, numba {m['numba']}, duckdb {duckdb.__version__}")


SEED_CASES = "uniform:100,uniform:1000,zipf:100,zipf:1000"
SEED_SKIP = {("zipf", 1000, 4)}  # ~1e11 tuples: the shared tuple enumeration alone would take hours


def seed_tables(n: int, records: int, items: int, dist: str, zipf_s: float, seed: int) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    return [pa.table({"t": np.sort(rng.integers(0, records, records)).astype(np.int64),
                      "k": zipf_keys(rng, records, items, zipf_s if dist == "zipf" else 0.0)}) for _ in range(n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--keys", type=int, default=5000)
    ap.add_argument("--ways", default="2,3,4")
    ap.add_argument("--purge-every", type=int, default=10_000)
    ap.add_argument("--seed-cases", default=SEED_CASES,  # "none": only the DuckDB comparison
                    help="HW-join vs SHJ cases DIST:WINDOW (DIST uniform or zipf item popularity)")
    ap.add_argument("--items", type=int, default=10_000, help="item numbers in the HW-join vs SHJ comparison")
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of item popularity")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each HW-join / SHJ case (best time kept)")
    ap.add_argument("--skip-duckdb", action="store_true", help="only the HW-join vs SHJ comparison")
    ap.add_argument("--rounds", type=int, default=5, help="alternating engine / DuckDB rounds per way count")
    ap.add_argument("--write", default=None, help="BENCHMARKS.md to update (the wjoin section)")
    a = ap.parse_args(argv)
    ways = [int(x) for x in a.ways.split(",")]
    # warm up the compiled kernels
    small = make_streams(2, 2000, 10)
    run_engine(small, 10)
    s_, r_, tm, ky = arrival(small)
    for n in (2, 3):
        s_, r_, tm, ky = arrival(make_streams(n, 2000, 10))
        hash_join_loop(s_, r_, tm, ky, 10, 10, True, 100)
        hash_join_loop(s_, r_, tm, ky, 10, 10, False, 100)
    rows = []
    for n in ([] if a.skip_duckdb else ways):
        tables = make_streams(n, a.records, a.keys, seed=n)
        tes, tds, loads = [], [], [os.getloadavg()[0]]
        for r in range(a.rounds):  # alternating which goes first; the median of per-round ratios
            for side in (("e", "d") if r % 2 == 0 else ("d", "e")):
                if side == "e":
                    te, st = run_engine(tables, a.window)
                    tes.append(te)
                else:
                    td, nd = run_duckdb(tables, a.window)
                    tds.append(td)
            assert nd == st.tuples, (nd, st.tuples)
            loads.append(os.getloadavg()[0])
        te, td = statistics.median(tes), statistics.median(tds)
        ratio = statistics.median(d / e for d, e in zip(tds, tes))
        recs = n * a.records
        rows.append(dict(n=n, tuples=st.tuples, engine=te, duckdb=td, ratio=ratio, peak=st.peak_buffered,
                         held=max(st.peak_held), rounds=a.rounds, load=statistics.median(loads)))
        print(f"{n}-way: {st.tuples:,} tuples | smerge {te:.2f}s ({recs / te / 1e6:.2f} M rec/s) vs DuckDB {td:.2f}s "
              f"-> {ratio:.2f}x DuckDB's throughput (median of {a.rounds} alternating rounds; per round "
              f"{', '.join(f'{d / e:.2f}' for d, e in zip(tds, tes))}; load {statistics.median(loads):.1f}) | "
              f"peak buffered {st.peak_buffered} held {max(st.peak_held)}", flush=True)
    seed_rows = []
    for case in ([] if a.seed_cases == "none" else a.seed_cases.split(",")):
        dist, w = case.split(":")
        w = int(w)
        for n in ways:
            if (dist, w, n) in SEED_SKIP:
                continue
            tables = seed_tables(n, a.records, a.items, dist, a.zipf, seed=100 + n)
            s_, r_, tm, ky = arrival(tables)
            t_hw = t_x = float("inf")
            for _ in range(a.repeat):  # interleaved; the best of each (a shared 2-core machine)
                t0 = time.perf_counter()
                th, vh, ph = hash_join_loop(s_, r_, tm, ky, a.items, w, True, a.purge_every)
                t_hw = min(t_hw, time.perf_counter() - t0)
                t0 = time.perf_counter()
                tx, vx, px = hash_join_loop(s_, r_, tm, ky, a.items, w, False, a.purge_every)
                t_x = min(t_x, time.perf_counter() - t0)
            assert th == tx, (th, tx)
            if n <= 3 and a.records <= 1_000_000 and th < 50_000_000:  # the kernel's count is the engine's
                _, st = run_engine(tables, w)
                assert st.tuples == th, (st.tuples, th)
            recs = n * a.records
            stale = (w + a.purge_every / (2 * n)) / w
            seed_rows.append(dict(dist=dist, w=w, n=n, tuples=th, hw_us=1e6 * t_hw / recs, x_us=1e6 * t_x / recs,
                                  hw_out_ns=1e9 * t_hw / max(th, 1), x_out_ns=1e9 * t_x / max(th, 1),
                                  speedup=t_x / t_hw, vh=vh / recs, vx=vx / recs, ph=ph, px=px, stale=stale))
            print(f"{dist} W={w} {n}-way: {th:,} tuples | HW {1e6 * t_hw / recs:.3f} vs SHJ/{a.purge_every} "
                  f"{1e6 * t_x / recs:.3f} us per arriving tuple -> {t_x / t_hw:.2f}x (entries visited per arrival "
                  f"{vh / recs:.2f} vs {vx / recs:.2f}; peak table records {ph:,} vs {px:,}; bound {stale:.1f}x)",
                  flush=True)
    if a.write:
        write_section(a, rows, seed_rows)
    return 0


def write_section(a, rows, seed_rows) -> None:
    lines = [
        f"Machine: {machine()}.",
        "",
        f"Data: {a.records:,} records per stream, integer times uniform on [0, {a.records:,}) (about one record per "
        f"time unit per stream), uniform window {a.window} (about {a.window} records per stream inside the window), "
        f"HW-join on a key uniform over {a.keys:,} values. Reproduce: `.venv/bin/python bench/bench_wjoin.py "
        f"--records {a.records} --window {a.window} --keys {a.keys} --write BENCHMARKS.md` "
        "(wall time and peak memory also with `/usr/bin/time -v`).",
        "",
        "Throughput: `smerge.merge.wjoin.wjoin` (streaming, input in 65,536-row batches, full output batches with "
        "every column) beside DuckDB running the equivalent SQL as one batch (2 threads, `to_arrow_table`). "
        "Both give the same number of tuples (asserted).",
        "",
        "| ways | tuples | smerge wjoin s | DuckDB s | smerge throughput / DuckDB's | peak buffered per stream (rule) | peak held per stream |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['n']} | {r['tuples']:,} | {r['engine']:.2f} | {r['duckdb']:.2f} | {r['ratio']:.2f}x | "
                     f"{', '.join(f'{v:,}' for v in r['peak'])} | {r['held']:,} |")
    lines += [
        "",
        f"Seed comparison (section 6.2.4, Figure 7b): HW-join vs a symmetric hash join (XJoin-style) whose hash "
        f"tables are purged only every {a.purge_every:,} input tuples. Measure: the seed's service time per arriving "
        "tuple (total time / input tuples; per output tuple beside it). Both are the same compiled per-arrival "
        f"loop (`hash_join_loop` in the bench script; best of {a.repeat} interleaved runs each; same chains, same shared tuple enumeration, same tuples — "
        "asserted, and equal to the engine's count); only the probe (HW: newest-first to the period start; SHJ: "
        "the whole bucket) and the purge schedule (HW: the rule after every arrival; SHJ: every "
        f"{a.purge_every:,} tuples) differ. Data: {a.records:,} records per stream, times as above, the join key "
        f"an item number out of {a.items:,} — `uniform` popularity, or `zipf` (Zipf exponent {a.zipf:g}, like item "
        "sales, the seed's Wal*Mart query). `W` = window in time units = records per stream in the window. "
        "`bound` = (W + purge interval / 2n) / W, the average number of SHJ table entries per window entry: the "
        "most the SHJ can lose from stale entries, reached only when bucket walks dominate everything else. "
        "Reproduce: `.venv/bin/python bench/bench_wjoin.py --skip-duckdb`.",
        "",
        "| item popularity | W | ways | tuples | HW-join us / input tuple | SHJ us / input tuple | HW ns / output tuple | SHJ ns / output tuple | HW-join faster by | bound | entries visited per arrival HW / SHJ | peak table records HW / SHJ |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in seed_rows:
        lines.append(f"| {r['dist']} | {r['w']:,} | {r['n']} | {r['tuples']:,} | {r['hw_us']:.3f} | {r['x_us']:.3f} | "
                     f"{r['hw_out_ns']:.1f} | {r['x_out_ns']:.1f} | **{r['speedup']:.2f}x** | {r['stale']:.1f}x | "
                     f"{r['vh']:.2f} / {r['vx']:.2f} | {r['ph']:,} / {r['px']:,} |")
    skipped = [f"{d} W={w} {n}-way" for d, w, n in sorted(SEED_SKIP)]
    if skipped:
        lines.append(f"\nNot run: {', '.join(skipped)} (about 1e11 tuples; the shared enumeration dominates both).")
    text = "\n".join(lines)
    path = a.write
    doc = open(path).read()
    m = re.search(r"<!-- wjoin: begin -->\n.*?\n(<!-- wjoin: verdict -->\n.*?)?<!-- wjoin: end -->", doc, flags=re.S)
    verdict = m.group(1) if m and m.group(1) else "<!-- wjoin: verdict -->\n"
    new = doc[:m.start()] + "<!-- wjoin: begin -->\n" + text + "\n\n" + verdict + "<!-- wjoin: end -->" + doc[m.end():]
    tmp = path + ".tmp-wjoin"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
