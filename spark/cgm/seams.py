"""Seams of a partitioned CGM run: the driver keeps at most one pair per shared B record.

Partitions see B records within eps1 of a boundary on both sides (``smerge.spark.cgm.tasks``);
their pairs with such a record come back to the driver (*seam pairs*), which keeps the owner's
pair, else the lowest partition's, and corrects the report windows' kappas for the dropped ones.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from smerge.errors import InputError
from smerge.jobs import PreparedMerge
from smerge.spark.actions import raise_task_error
from smerge.spark.cgm.tasks import read_ipc_bytes


def raise_partition_errors(results: list[dict]) -> None:
    """Report a task's error as one line; NaN keys: the first row of A, else of B (as --local reads A first)."""
    errs = [r["error"] for r in results if "error" in r]
    if not errs:
        return
    nan = [e for e in errs if e[0] == "KeyNaNError"]
    if nan:  # (name, msg, column, row, side)
        raise InputError(min(nan, key=lambda e: (e[4] != "a", e[3] if e[3] is not None else 0))[1])
    raise_task_error(errs[0])


def resolve_seams(prep: PreparedMerge, results: list[dict]) -> dict:
    """Keep at most one seam pair per shared B record: its owner's, else the lowest partition's."""
    tables, owned, part, ords = [], [], [], []
    for r in results:
        t = read_ipc_bytes(r["seam"])
        if t is None:
            continue
        tables.append(t)
        owned.append(np.frombuffer(r["seam_owned"], dtype=np.bool_))
        part.append(np.full(t.num_rows, r["p"], dtype=np.int64))
        ords.append(np.frombuffer(r["seam_ord"], dtype=np.int64))
    if not tables:
        return {"total": 0, "kept": 0, "pairs": None, "dropped_a": None, "kept_b": np.empty(0, np.int64),
                "dropped_at": {}}
    table = pa.concat_tables(tables)
    owned_a, part_a = np.concatenate(owned), np.concatenate(part)
    b_rows = table.column("b_row").to_numpy()
    idx = np.arange(table.num_rows)
    order = np.lexsort((idx, part_a, ~owned_a, b_rows))
    first = np.ones(order.size, dtype=bool)
    first[1:] = b_rows[order][1:] != b_rows[order][:-1]
    keep = np.zeros(table.num_rows, dtype=bool)
    keep[order[first]] = True
    kept = table.filter(pa.array(keep))  # partition order, then engine order
    dropped = table.filter(pa.array(~keep))
    n_a = len(prep.src_a.schema)
    dropped_a = pa.Table.from_arrays([dropped.column(i) for i in range(n_a)] + [dropped.column("a_row")],
                                     schema=prep.src_a.schema.append(pa.field("a_row", pa.int64())))
    part_all, ord_all = np.concatenate(part), np.concatenate(ords)
    dropped_at: dict[int, np.ndarray] = {}
    for p in np.unique(part_all[~keep]):
        dropped_at[int(p)] = ord_all[~keep & (part_all == p)]
    return {"total": table.num_rows, "kept": kept.num_rows, "pairs": kept, "dropped_a": dropped_a,
            "kept_b": kept.column("b_row").to_numpy(), "dropped_at": dropped_at}


def report_kappas(results: list[dict], dropped_at: dict[int, np.ndarray]) -> list[float]:
    """The report windows' kappas of all partitions (in key-range order) after seam resolution.

    Each partition's engine counted its pairs per report window, in the order it emitted them;
    a dropped seam pair (known by its position among the partition's pairs) is taken off the
    matched count of the window that emitted it: its A record stays retired there, unmatched.
    """
    kappas: list[float] = []
    for r in results:
        counts = np.asarray(r["windows"], dtype=np.int64).reshape(-1, 2)
        matched = counts[:, 0].copy()
        ords = dropped_at.get(r["p"])
        if ords is not None and ords.size:
            ends = np.cumsum(counts[:, 0])
            np.subtract.at(matched, np.searchsorted(ends, ords, side="right"), 1)
        kappas += [m / n for m, n in zip(matched.tolist(), counts[:, 1].tolist())]
    return kappas


__all__ = ["raise_partition_errors", "resolve_seams", "report_kappas"]
