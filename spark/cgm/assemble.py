"""The driver's last step of a partitioned CGM run: the final outputs from the part files.

Arrow parts (CSV, netCDF, ... outputs) are written through the output writers
(``assemble_outputs``); Parquet parts written by the executors are moved into place: a dataset
folder is the parts renamed, a single file the parts joined byte-for-byte
(``finish_parquet``, ``smerge.spark.parquet``). Either way the outputs appear only when all
of them are complete.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa

from smerge.datasets.output_commit import claim_file, identity, replace_dir, retract
from smerge.datasets.output_space import space_errors
from smerge.datasets.output_staging import mark_dataset
from smerge.datasets.writers import DATASET_FORMAT
from smerge.errors import OutputError
from smerge.jobs.inputs import PreparedMerge
from smerge.jobs.outputs import committed, open_outputs
from smerge.spark.cgm.tasks import MergePlan, part_path, read_ipc_bytes
from smerge.spark.parquet import ParquetConcatError, ParquetJoin
from smerge.spark.parts import PartWriter, read_part


def _conform(batch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.names != schema.names:
        batch = pa.RecordBatch.from_arrays([batch.column(n) for n in schema.names], schema=schema)
    return batch


def assemble_outputs(prep: PreparedMerge, plan: MergePlan, results: list[dict], seam: dict) -> None:
    """Write the final outputs atomically from the part files and the kept seam pairs."""
    out, un_a, un_b = open_outputs(prep)

    def copy_parts(writer, kind: str, seam_table) -> None:
        """Every task's part of ``kind`` in partition order, then the seam's table (if any)."""
        for r in results:
            for b in read_part(part_path(plan.staging, kind, r["p"])):
                writer.write(_conform(b, writer.schema))
        if seam_table is not None:
            for b in seam_table.to_batches():
                writer.write(_conform(b, writer.schema))

    with committed((out, un_a, un_b)):
        copy_parts(out, "pairs", seam["pairs"])
        if un_a is not None:
            copy_parts(un_a, "ua", seam["dropped_a"])
        if un_b is not None:
            copy_parts(un_b, "ub", None)
            kept_b = seam["kept_b"]
            for r in results:
                t = read_ipc_bytes(r["cand_b"])
                if t is None:
                    continue
                rows = t.column("b_row").to_numpy()
                t = t.filter(pa.array(~np.isin(rows, kept_b)))
                for b in t.to_batches():
                    un_b.write(_conform(b, un_b.schema))


class PartJoiner:
    """Joins a single-file Parquet output's parts while the merge job runs: a driver thread
    appends each part (``ParquetJoin``) as soon as it and every part before it are complete, so
    only the last parts and the footer are left for after the job. ``finish`` checks every
    appended part is still the file the task left (a retried task attempt replaces its part:
    from the first replaced one on, the parts are appended again) and adds the rest."""

    POLL_SECONDS = 0.02

    def __init__(self, plan: MergePlan, kinds: tuple[str, ...]):
        self.plan = plan
        self.joins = {k: ParquetJoin(os.path.join(plan.staging, f"{k}.joined.parquet"), take_first=True) for k in kinds}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smerge-part-join", daemon=True)
        self._thread.start()

    def _path(self, kind: str, p: int) -> str:
        return part_path(self.plan.staging, kind, p, "parquet")

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for kind, join in self.joins.items():
                    while len(join) < self.plan.parts and os.path.exists(self._path(kind, len(join))):
                        join.add(self._path(kind, len(join)))
                self._stop.wait(self.POLL_SECONDS)
        except BaseException as e:  # noqa: BLE001 - reported by finish
            self.error = e

    def stop(self) -> None:
        """Stop appending (idempotent); a failed run's staging folder is removed with the file."""
        self._stop.set()
        self._thread.join()

    def finish(self, kind: str, schema: pa.Schema) -> str:
        """The joined file of ``kind`` with every part and the driver's part (index P)."""
        self.stop()
        if self.error is not None:
            raise self.error
        join = self.joins[kind]
        changed = next((i for i, (path, *_, ident) in enumerate(join.parts) if _replaced(path, ident, i == 0)), None)
        if changed is not None:
            join.truncate(changed)
        for p in range(len(join), self.plan.parts + 1):
            if os.path.exists(self._path(kind, p)):
                join.add(self._path(kind, p))
        join.finish(schema)
        return join.out_path

    def close(self) -> None:
        self.stop()
        for join in self.joins.values():
            join.close()


def _replaced(path: str, ident: tuple, moved: bool) -> bool:
    """Whether a task attempt wrote ``path`` again after it was appended (a moved first part
    leaves no file; a copied part is still the file it was)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return not moved
    return moved or (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != ident


def start_join(prep: PreparedMerge, plan: MergePlan) -> PartJoiner | None:
    """A ``PartJoiner`` for every single-file Parquet output of ``prep`` (None: none to join)."""
    kinds = [] if prep.output_format == DATASET_FORMAT else ["pairs"]
    if prep.unmatched_paths:
        kinds += ["ua", "ub"]
    return PartJoiner(plan, tuple(kinds)) if kinds and plan.part_format == "parquet" else None


def finish_parquet(prep: PreparedMerge, plan: MergePlan, results: list[dict], seam: dict,
                   joiner: PartJoiner | None) -> None:
    """Executors wrote the final Parquet parts; add the driver's parts (kept seam pairs, seam
    records that became unmatched) and move everything into place.

    A dataset output is the folder of parts itself (renamed into place). A single file is the
    parts joined byte-for-byte (``smerge.spark.parquet``: row groups copied, one footer
    written), into a temporary file renamed over the target; ``joiner`` (``start_join``, started
    before the merge job; None when no output is a single file) has appended the parts finished
    during the job. The outputs are moved
    into place only when every one of them is complete.
    """
    P = plan.parts

    def extra(kind: str, schema: pa.Schema, tables: list) -> None:
        tables = [t for t in tables if t is not None and t.num_rows]
        if not tables:
            return
        w = PartWriter(part_path(plan.staging, kind, P, "parquet"), schema, "parquet")
        try:
            for t in tables:
                for b in t.to_batches():
                    w.write(b)
            w.close()
        except BaseException:
            w.abort()
            raise

    extra("pairs", plan.out_schema, [seam["pairs"]])
    targets = [("pairs", prep.output, plan.out_schema)]
    if prep.unmatched_paths:
        extra("ua", plan.una_schema, [seam["dropped_a"]])
        kept_b, cands = seam["kept_b"], []
        for r in results:
            t = read_ipc_bytes(r["cand_b"])
            if t is not None:
                cands.append(t.filter(pa.array(~np.isin(t.column("b_row").to_numpy(), kept_b))))
        extra("ub", plan.unb_schema, cands)
        targets += [("ua", prep.unmatched_paths[0], plan.una_schema), ("ub", prep.unmatched_paths[1], plan.unb_schema)]
    ready: list[tuple[str, str, bool]] = []  # (finished path, target, is a directory)
    try:
        with space_errors(prep.output, where=plan.staging):
            _finish_targets(plan, prep, targets, joiner, ready)
    except ParquetConcatError as e:
        raise OutputError(f"cannot join the Parquet parts of {prep.output!r} ({e})") from None
    finally:
        if joiner is not None:
            joiner.close()
    # Put every output in place; without --overwrite each name is claimed atomically, and when
    # one is lost (another run, a file created meanwhile) those claimed before it are removed.
    overwrite, claimed = prep.job.overwrite, []
    try:
        for src, target, is_dir in ready:
            with space_errors(target, where=src):
                if is_dir:
                    replace_dir(src, target, overwrite=overwrite)  # checks the replace rule again
                else:
                    claim_file(src, target, overwrite=overwrite)
            if not overwrite:
                claimed.append((target, identity(target)))
    except BaseException:
        for target, ident in claimed:
            retract(target, ident)
        raise


def _finish_targets(plan: MergePlan, prep: PreparedMerge, targets: list, joiner, ready: list) -> None:
    """The finished file or folder of each output (in the staging folder), appended to ``ready``."""
    for kind, target, schema in targets:
        if kind == "pairs" and prep.output_format == DATASET_FORMAT:
            folder = os.path.join(plan.staging, kind)
            for name in os.listdir(folder):  # leftovers of failed task attempts
                if not name.endswith(".parquet"):
                    os.unlink(os.path.join(folder, name))
            mark_dataset(folder)  # this folder becomes the dataset: smerge's marker in it
            ready.append((folder, target, True))
            continue
        ready.append((joiner.finish(kind, schema), target, False))


__all__ = ["assemble_outputs", "finish_parquet", "start_join", "PartJoiner"]
