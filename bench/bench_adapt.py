"""Adaptive K (``smerge cgm --delta D --adapt``, ENGINES.md section 10) beside a sweep of fixed K.

Data: the records of ``smerge gen --records R --randomize P --displacement 20000 --seed 1``
(A) and ``--seed 2`` (B), P = 10, 20, 33, generated in memory by ``datasets.gen.generate``;
keys (time, lat, lon), eps 0.01, window N = 5,000. For every P the same run times CGM with
fixed K = 250 .. 5,000 and with ``--adapt`` (starting at the default K = 1,000) for each
D in {0.01, 0.05, 0.1}, interleaved, best of the repeats; merge time is the engine's
``merge_seconds`` (no file I/O). A fixed K *meets* D when its moving drop rate over m = 10
report windows never exceeds D (the statistics' ``delta_ok``). Target: ``--adapt`` meets every D
that some fixed K meets, in at most 1.2x the merge time of the fastest fixed K that meets it.
The sweep's fastest is the minimum over many timings (selection favours it on a noisy machine),
so that K is then timed again head to head with ``--adapt`` (interleaved, ``HEAD_TO_HEAD``
repeats each); the verdict uses the head-to-head ratio, and both ratios are reported.

The process caps its address space (RLIMIT_AS, ``AS_LIMIT``). ``python bench/bench_adapt.py``
(``--quick``: 200,000 records, one repeat, nothing written).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

AS_LIMIT = 4 << 30
RANDS = (10, 20, 33)
DELTAS = (0.01, 0.05, 0.1)
FIXED_K = (250, 500, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000)
N, EPS, DISPLACEMENT, START_K, M = 5000, 0.01, 20_000, 1000, 10
TARGET = 1.2
HEAD_TO_HEAD = 7  # a shared, loaded machine: more interleaved repeats make best-of steadier


def merge(ta, tb, k: int, delta: float | None, adapt: bool) -> dict:
    from smerge.merge import CGMParams, MergeKeys, MergeStats, cgm_merge
    from smerge.merge.stats import drop_rate_moving

    keys = ("time", "lat", "lon")
    p = CGMParams(keys=MergeKeys(keys, keys), eps=(EPS,) * 3, window_size=N, least_increment_a=k,
                  least_increment_b=k, delta=delta, delta_windows=M, adapt=adapt)
    s = MergeStats("cgm")
    for _ in cgm_merge(ta.to_batches(max_chunksize=131072), tb.to_batches(max_chunksize=131072), p,
                       schema_a=ta.schema, schema_b=tb.schema, stats=s):
        pass
    d = s.as_dict()
    ks = [k[0] for k in s.k_windows]
    moving = drop_rate_moving(s.kappas, M)
    return {"peak_window": int(moving.argmax()) + M - 1 if moving.size else None,
            "peak_window_counts": list(s.report_counts[int(moving.argmax()) + M - 1]) if moving.size else None,
            "merge_seconds": s.merge_seconds, "drop_max": d["drop_rate_moving_max"], "passes": s.passes,
            "match_pct": d["match_pct"], "k_min": min(ks), "k_max": max(ks),
            "k_median": sorted(ks)[len(ks) // 2], "windows": len(ks)}


def run(records: int, repeats: int) -> list[dict]:
    import pyarrow as pa

    from smerge.datasets.gen import GenParams, generate

    rows = []
    for rand in RANDS:
        ta = pa.Table.from_batches(list(generate(GenParams(records, rand, DISPLACEMENT, seed=1))))
        tb = pa.Table.from_batches(list(generate(GenParams(records, rand, DISPLACEMENT, seed=2))))
        best: dict[tuple, dict] = {}
        for _ in range(repeats):  # interleaved: every configuration once per repeat
            for cfg in [("fixed", k, None) for k in FIXED_K] + [("adapt", START_K, d) for d in DELTAS]:
                r = merge(ta, tb, cfg[1], cfg[2], cfg[0] == "adapt")
                if cfg not in best or r["merge_seconds"] < best[cfg]["merge_seconds"]:
                    best[cfg] = r
            print(f"rand {rand}: repeat done", file=sys.stderr, flush=True)
        for (kind, k, d), r in best.items():
            rows.append({"rand": rand, "kind": kind, "k": k, "delta": d, **r})
        del ta, tb
    return rows


def head_to_head(records: int, repeats: int, ver: list[dict]) -> None:
    """Time each case's fastest fixed K and --adapt again, interleaved, best of ``repeats`` each."""
    import pyarrow as pa

    from smerge.datasets.gen import GenParams, generate

    for rand in RANDS:
        cases = [v for v in ver if v["rand"] == rand and v["fastest_k"]]
        if not cases:
            continue
        ta = pa.Table.from_batches(list(generate(GenParams(records, rand, DISPLACEMENT, seed=1))))
        tb = pa.Table.from_batches(list(generate(GenParams(records, rand, DISPLACEMENT, seed=2))))
        for v in cases:
            f_best = a_best = float("inf")
            for _ in range(repeats):
                f_best = min(f_best, merge(ta, tb, v["fastest_k"], None, False)["merge_seconds"])
                r = merge(ta, tb, START_K, v["delta"], True)
                a_best = min(a_best, r["merge_seconds"])
                assert abs(r["drop_max"] - v["adapt"]["drop_max"]) < 1e-12  # deterministic
            v["h2h_fixed_seconds"], v["h2h_adapt_seconds"] = f_best, a_best
            v["h2h_ratio"] = a_best / f_best
            v["target_met"] = v["adapt"]["drop_max"] <= v["delta"] + 1e-12 and v["h2h_ratio"] <= TARGET
        print(f"rand {rand}: head to head done", file=sys.stderr, flush=True)
        del ta, tb


def verdicts(rows: list[dict]) -> list[dict]:
    out = []
    for rand in RANDS:
        fixed = [r for r in rows if r["rand"] == rand and r["kind"] == "fixed"]
        for d in DELTAS:
            ad = next(r for r in rows if r["rand"] == rand and r["kind"] == "adapt" and r["delta"] == d)
            meets = [r for r in fixed if r["drop_max"] <= d + 1e-12]
            fastest = min(meets, key=lambda r: r["merge_seconds"]) if meets else None
            ratio = ad["merge_seconds"] / fastest["merge_seconds"] if fastest else None
            ok = (fastest is None) or (ad["drop_max"] <= d + 1e-12 and ratio <= TARGET)
            out.append({"rand": rand, "delta": d, "fixed_meeting": [r["k"] for r in meets],
                        "fastest_k": fastest["k"] if fastest else None,
                        "fastest_seconds": fastest["merge_seconds"] if fastest else None,
                        "fastest_drop_max": fastest["drop_max"] if fastest else None,
                        "adapt": ad, "ratio": ratio, "target_met": ok})
    return out


def markdown(records: int, repeats: int, rows: list[dict], ver: list[dict], wall: float,
             load: tuple[float, float] | None = None) -> str:
    from common import machine, machine_markdown, md_table

    def x(v, key, fmt="{:.3f}"):
        return fmt.format(v[key]) if v.get(key) is not None else "-"

    t1 = md_table(
        ["Rand %", "D", "fixed K meeting D", "fastest of them: K", "drop max", "--adapt drop max",
         "--adapt K min / median / max", "sweep: fixed s", "sweep: --adapt s", "sweep ratio",
         "head to head: fixed s", "--adapt s", "ratio", "target"],
        [[v["rand"], v["delta"], ", ".join(f"{k:,}" for k in v["fixed_meeting"]) or "none",
          f"{v['fastest_k']:,}" if v["fastest_k"] else "-", x(v, "fastest_drop_max", "{:.4f}"),
          f"{v['adapt']['drop_max']:.4f}",
          f"{v['adapt']['k_min']:,} / {v['adapt']['k_median']:,} / {v['adapt']['k_max']:,}",
          x(v, "fastest_seconds"), f"{v['adapt']['merge_seconds']:.3f}", x(v, "ratio", "{:.2f}"),
          x(v, "h2h_fixed_seconds"), x(v, "h2h_adapt_seconds"), x(v, "h2h_ratio", "{:.2f}"),
          "met" if v["target_met"] else "MISSED"] for v in ver])
    t2 = md_table(["Rand %"] + [f"K={k:,}" for k in FIXED_K],
                  [[rand] + [f"{r['merge_seconds']:.3f} s / {r['drop_max']:.3f}"
                             for k in FIXED_K for r in rows
                             if r["rand"] == rand and r["kind"] == "fixed" and r["k"] == k] for rand in RANDS])
    met = sum(v["target_met"] for v in ver)
    notes = []
    for v in ver:
        ad = v["adapt"]
        if v["fastest_k"] and ad["drop_max"] > v["delta"] + 1e-12:
            last = ad["peak_window"] == ad["windows"] - 1
            m_, r_ = ad["peak_window_counts"]
            notes.append(f"- {v['rand']}%, D = {v['delta']}: `--adapt` missed D; its moving drop rate peaks at report "
                         f"window {ad['peak_window']:,} of {ad['windows']:,}"
                         + (f", the run's last ({m_:,} of {r_:,} A records matched)"
                            if last else f" ({m_:,} of {r_:,} A records matched)") + ".")
    return (
        f"Reproduce: `.venv/bin/python bench/bench_adapt.py` (raw numbers in `bench/results/adapt.json`; "
        f"{wall:.0f} s). Data: `smerge gen --records {records:,} --randomize 10/20/33 --displacement "
        f"{DISPLACEMENT:,}` records (A seed 1, B seed 2, generated in memory by `datasets.gen.generate`), keys "
        f"(time, lat, lon), eps {EPS}, N = {N:,}, m = {M} report windows; `--adapt` starts at K = {START_K:,}. "
        f"Merge time = the engine's `merge_seconds` over in-memory batches, best of {repeats} interleaved "
        f"repeats (head to head: best of {HEAD_TO_HEAD} each, interleaved); drop max = the largest moving drop rate 1 - Delta_(m,n) of the run. A fixed K meets D when its "
        f"drop max <= D (report windows as in docs/cgm.md: each retires at least N A records, the short group the run's end "
        f"leaves joins the window before it, for fixed K and --adapt alike); the target: `--adapt` meets every D some fixed K meets, within {TARGET}x the merge time "
        f"of the fastest fixed K that meets it. Address space capped at {AS_LIMIT >> 30} GiB (RLIMIT_AS).\n\n"
        f"**Target met in {met} of {len(ver)} cases.**\n\n" + t1 + ("\n\n" + "\n".join(notes) if notes else "") +
        "\n\nThe sweep (merge seconds / drop max per fixed K):\n\n" + t2 +
        "\n\nBelow its cliff, K hardly changes the merge time on this data: a pass matches most of a "
        "window (m > K), so K only decides how many unmatched records a behind window evicts, and the "
        "pass count stays the same; above the cliff, evictions leave partners without their match and "
        "drops cascade. The fastest fixed K that meets D is therefore a near tie among the safe K's, "
        "picked by timing noise; `--adapt` spends its time the same way plus one kernel return per report "
        "window.\n\n" + (f"Load average (1 min) of the shared 2-core machine: {load[0]:.1f} before the run, "
                           f"{load[1]:.1f} after" + ("; merge times under such load are several times the quiet "
                           "machine's, the ratios (same load for both sides, interleaved) are what to read"
                           if max(load) >= 2 else " (a quiet machine)") + ".\n\n"
                           if load else "") + "Machine:\n\n" + machine_markdown(machine()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    if args.quick:
        args.records, args.repeats, args.no_write = 200_000, 1, True
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    rows = run(args.records, args.repeats)
    ver = verdicts(rows)
    head_to_head(args.records, 1 if args.quick else HEAD_TO_HEAD, ver)
    load = (load0, os.getloadavg()[0])
    text = markdown(args.records, args.repeats, rows, ver, time.perf_counter() - t0, load)
    print(text)
    if not args.no_write:
        from common import RESULTS, replace_section

        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "adapt.json").write_text(json.dumps({"records": args.records, "repeats": args.repeats, "load_1min": list(load),
                                                        "rows": rows, "verdicts": ver}, indent=1))
        replace_section("adapt", text, heading="Adaptive K: --adapt beside a sweep of fixed K")


if __name__ == "__main__":
    main()
