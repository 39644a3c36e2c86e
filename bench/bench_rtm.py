"""RTM benchmark (issue 4): the paper's Tables 3-4 (100,000 records, N = 5,000 / 10,000,
randomness 2/10/20/33 %), both refill modes beside the paper's Match %, kappa_max, RTM time vs
CGM time on the same data (peer, same loop), and index-server query latency under 32 clients.

    .venv/bin/python bench/bench_rtm.py            # full run (~3 min), writes BENCHMARKS.md
    .venv/bin/python bench/bench_rtm.py --quick    # smoke run, prints only

Data (bench/data/, git-ignored) is made with ``smerge gen`` exactly as bench_cgm.py does: A with
--seed 1, B with --seed 2, --randomize PCT. Keys (time, lat, lon), eps 0.01 on every key. RTM
runs end to end through the embedded Flight index server (reading B and bulk-loading the R-tree
included); CGM runs ``--local`` with K = N / 5 (the paper's smallest K).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cgm import pair  # noqa: E402
from common import (DATA, RESULTS, best_of, machine, machine_markdown, machine_section_empty,  # noqa: E402
                    md_table, replace_section)

EPS = 0.01
RANDS = (2, 10, 20, 33)
WINDOWS = (5000, 10000)
# The paper's Tables 3 and 4 (Mazzucco et al. (SC2002), section 6): (N, rand) -> (match %, total seconds).
PAPER = {(5000, 2): (86, 0.475), (5000, 10): (74, 0.472), (5000, 20): (70, 0.478), (5000, 33): (69, 0.471),
         (10000, 2): (92, 0.485), (10000, 10): (82, 0.487), (10000, 20): (79, 0.484), (10000, 33): (71, 0.482)}


def run_rtm(a: Path, b: Path, n: int, refill: str, kappa: bool, out: Path) -> dict:
    from smerge.jobs.rtm import RTMJob, prepare_rtm, run_rtm as run

    job = RTMJob(a=str(a), b=str(b), output=str(out), eps=EPS, window_size=n, refill=refill, overwrite=True,
                 kappa_max=kappa)
    return run(prepare_rtm(job))


def run_cgm(a: Path, b: Path, n: int, out: Path) -> dict:
    from smerge.jobs import CGMJob, prepare, run_local

    job = CGMJob(a=str(a), b=str(b), output=str(out), eps=EPS, window_size=n, least_increment_a=n // 5,
                 least_increment_b=n // 5, overwrite=True)
    return run_local(prepare(job))


def tables(records: int, repeats: int, tmp: Path) -> list[dict]:
    rows = []
    for n in WINDOWS:
        for rand in RANDS:
            a, b = pair(records, rand)
            res = {"N": n, "rand": rand}
            first = run_rtm(a, b, n, "page", True, tmp / "p.parquet")  # warm-up + kappa_max
            res["kappa_max"] = first["kappa_max"]
            times: dict[str, list[float]] = {"page": [], "sym": [], "cgm": []}
            for _ in range(repeats):  # interleaved: RTM and its CGM peer see the same machine load
                t, s_page = best_of(lambda: run_rtm(a, b, n, "page", False, tmp / "p.parquet"), 1)
                times["page"].append(t)
                t, s_sym = best_of(lambda: run_rtm(a, b, n, "symdiff", False, tmp / "s.parquet"), 1)
                times["sym"].append(t)
                t, s_cgm = best_of(lambda: run_cgm(a, b, n, tmp / "c.parquet"), 1)
                times["cgm"].append(t)
            t_page, t_sym, t_cgm = min(times["page"]), min(times["sym"]), min(times["cgm"])
            res["paired_ratio_median"] = float(np.median(np.array(times["page"]) / np.array(times["cgm"])))
            res.update(page_pct=s_page["match_pct"], sym_pct=s_sym["match_pct"], cgm_pct=s_cgm["match_pct"],
                       t_page=t_page, t_sym=t_sym, t_cgm=t_cgm, build=s_page["index_build_seconds"],
                       queries_page=s_page["queries"], fetched_page=s_page["b_fetched"],
                       queries_sym=s_sym["queries"], fetched_sym=s_sym["b_fetched"])
            print(json.dumps(res), flush=True)
            rows.append(res)
    return rows


def latency(records: int, clients: int, per_client: int) -> dict:
    """p50/p99 of range queries (A-window boxes, limit N=5000) with ``clients`` concurrent clients."""
    from smerge.datasets import open_input
    from smerge.index import BIndex
    from smerge.merge.range_source import Box
    from smerge.merge.keys import key_matrix
    from smerge.transport.flight_client import IndexClient
    from smerge.transport.flight_server import IndexServer
    from smerge.transport.tokens import new_token

    a, b = pair(records, 10)
    idx = BIndex.from_source(open_input(str(b)))
    ta = open_input(str(a))
    ka = np.concatenate([key_matrix(x, ta.keys) for x in ta.batches()])
    boxes = [Box.from_arrays(ka[s:s + 5000].min(0) - EPS, ka[s:s + 5000].max(0) + EPS)
             for s in range(0, ka.shape[0], 5000)]
    token = new_token()
    server = IndexServer(idx, port=0, token=token)
    server.start_background()
    lat: list[float] = []
    rows = [0]
    lock = threading.Lock()

    def worker(w: int) -> None:
        c = IndexClient(server.url, token=token)
        mine = []
        got = 0
        for q in range(per_client):
            t0 = time.perf_counter()
            tab, _ = c.range_query(boxes[(w + q) % len(boxes)], limit=5000)
            mine.append(time.perf_counter() - t0)
            got += tab.num_rows
        with lock:
            lat.extend(mine)
            rows[0] += got
        c.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    server.shutdown()
    arr = np.array(lat) * 1000
    return {"clients": clients, "queries": len(lat), "p50_ms": float(np.percentile(arr, 50)),
            "p99_ms": float(np.percentile(arr, 99)), "qps": len(lat) / wall, "rows_per_s": rows[0] / wall}


def markdown(rows: list[dict], lat: dict, records: int, repeats: int, load: tuple[float, float] = (float("nan"),) * 2) -> str:
    out = [
        f"Reproduce: `.venv/bin/python bench/bench_rtm.py` (data: `smerge gen` {records:,} records, A seed 1, "
        f"B seed 2, eps {EPS} on time/lat/lon; best of {repeats} interleaved repeats; RTM end to end through the "
        "embedded Flight index server, reading B and bulk-loading the R-tree included; CGM peer `--local`, "
        "K = N/5, same files, same loop).",
        "",
        "### The paper's Tables 3 and 4 (Match % of A) beside smerge",
        "",
    ]
    hdr = ["N", "rand %", "paper Match %", "kappa_max %", "page Match %", "page / kappa_max", "symdiff Match %",
           "paper total s", "RTM page s", "RTM symdiff s", "CGM s (peer)", "RTM page / CGM",
           "median paired ratio"]
    body = []
    for r in rows:
        pm, pt = PAPER[(r["N"], r["rand"])]
        km = 100 * r["kappa_max"]
        body.append([r["N"], r["rand"], pm, f"{km:.2f}", f"{r['page_pct']:.2f}", f"{r['page_pct'] / km:.4f}",
                     f"{r['sym_pct']:.2f}", pt, r["t_page"], r["t_sym"], r["t_cgm"], f"{r['t_page'] / r['t_cgm']:.2f}x",
                     f"{r.get('paired_ratio_median', float('nan')):.2f}x"])
    out.append(md_table(hdr, body))
    ratios = [r["t_page"] / r["t_cgm"] for r in rows]
    worst = max(ratios)
    out += [
        "",
        f"- Page mode reaches {min(r['page_pct'] / (100 * r['kappa_max']) for r in rows) * 100:.2f}% of kappa_max "
        "or more in every row (target >= 99%; the paper's RTM: 69-92%). Symdiff mode, the paper's refill, "
        "loses the B records of the boundary key rows that fall inside the bounding box of what was already "
        "fetched but were never fetched — the same kind of loss as the paper's.",
        f"- RTM (page) / CGM time: worst {worst:.2f}x, median {float(np.median(ratios)):.2f}x, best "
        f"{min(ratios):.2f}x of the best times; the median of the per-repeat ratios (RTM and CGM timed back to "
        f"back) is {float(np.median([r.get('paired_ratio_median', float('nan')) for r in rows])):.2f}x over the rows "
        f"(target <= 2x, best times: {'met in every row' if worst <= 2 else f'met in {sum(r <= 2 for r in ratios)} of {len(ratios)} rows'}). "
        f"RTM's time includes reading B whole, sorting it and starting the server "
        f"({min(r['build'] for r in rows):.3f}-{max(r['build'] for r in rows):.3f} s for reading + indexing).",
        "- Queries per run (page / symdiff) and B records fetched: "
        + "; ".join(f"N={r['N']} {r['rand']}%: {r['queries_page']}/{r['queries_sym']} queries, "
                    f"{r['fetched_page']:,}/{r['fetched_sym']:,} records" for r in rows) + ".",
        "",
        "- Why 100% where the paper has 69-92%: `smerge gen` displaces records by at most 1,000 positions, "
        "less than N, so every A window's eps-box holds all its partners and kappa_max is 100%; the paper's "
        "loss came from its refill, not from the data. Symdiff also reaches 100% here because each page of "
        "N = 5,000 / 10,000 records is exactly 1 / 2 whole time steps of the 50 x 100 grid, so no key row is "
        "split between pages; on NCAR Ustorm + Vstorm (1,188 records per time step, N = 5,000) symdiff "
        "finds 89.6% and page mode 100% (tests/cli/test_rtm_cli.py).",
        "- Where RTM's time goes and what was done about it: every range request costs about 1 ms of "
        "Flight round trip on this machine, more than the server's work for a page (~0.25 ms), so the client "
        "asks for up to 4N records at once (one request per A window here: "
        f"{rows[0]['queries_page']} queries for {rows[0]['N']:,}-record windows; before: 2 per window and an R-tree "
        "probe + sort per request) and announces the next A window's box so that its first page can travel "
        "while the current window is swept. The server answers boxes whose leading-key run is short (here: "
        "all) by a binary search in B's sort order and a vectorised scan of that run, already sorted; the "
        "R-tree (built on first need) answers the others. A is read ahead while B is indexed; output is "
        "written by a background thread; B's sort order uses the adaptive merge kernel when B is nearly "
        "sorted. Measured separately (N = 5,000, 2%): the same run with queries answered in-process instead of "
        "through Flight takes about 0.066 s against CGM's 0.030 s, so Flight costs about 0.027 s of RTM's "
        "~0.09 s and the rest is reading and sorting B before the first query (it is on the critical path) "
        "and sweeping 2.9 B records per A record; announcing pages ahead made no measurable difference (the "
        "run is CPU-bound on 2 cores shared by the A reader, the writer, the server and the client).",
        f"- Machine load while this ran: load average {load[0]:.1f} at the start, {load[1]:.1f} at the end "
        "(other jobs shared the 2 cores), hence the spread between rows; the paired ratio is the steadier "
        "figure.",
        "",
        "### Index server query latency",
        "",
        f"{lat['clients']} concurrent clients (threads, one gRPC channel each) x {lat['queries'] // lat['clients']} "
        f"range queries over B ({records:,} records), boxes of real A windows (N = 5,000, eps {EPS}), limit 5,000: "
        f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, {lat['qps']:.0f} queries/s, "
        f"{lat['rows_per_s'] / 1e6:.2f} M records/s (2 cores shared by server and clients).",
    ]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--render", action="store_true", help="rewrite BENCHMARKS.md from bench/results/rtm.json")
    args = ap.parse_args()
    records = 20_000 if args.quick else args.records
    repeats = 1 if args.quick else args.repeats
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.render:
        saved = json.loads((RESULTS / "rtm.json").read_text())
        replace_section("rtm", markdown(saved["rows"], saved["latency"], args.records, args.repeats,
                                        tuple(saved.get("load", (float("nan"),) * 2))))
        return
    tmp = DATA / "rtm_tmp"  # scratch outputs (git-ignored)
    tmp.mkdir(parents=True, exist_ok=True)
    global WINDOWS
    if args.quick:
        WINDOWS = (5000,)
    import os

    load0 = os.getloadavg()[0]
    rows = tables(records, repeats, tmp)
    lat = latency(records, 32, 20 if args.quick else 100)
    load = (load0, os.getloadavg()[0])
    print(json.dumps(lat))
    md = markdown(rows, lat, records, repeats, load)
    print(md)
    if not args.quick:
        (RESULTS / "rtm.json").write_text(json.dumps({"machine": machine(), "rows": rows, "latency": lat,
                                                      "load": load}, indent=2))
        if machine_section_empty():
            replace_section("machine", machine_markdown())
        replace_section("rtm", md)


if __name__ == "__main__":
    main()
