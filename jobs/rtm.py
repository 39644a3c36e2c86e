"""RTM jobs: open A, reach B's index server (embedded or running), merge, write atomically.

``RTMJob`` describes one RTM merge as given on the command line. ``prepare_rtm`` opens A
(metadata only), opens B or asks the running server for B's schema and keys, validates every
parameter and output path; nothing is written before that succeeds. ``run_rtm`` then:

- embedded (``b`` given): reads B, bulk-loads the R-tree in memory and starts an index server
  on 127.0.0.1, a free port and a random token, for the duration of the run;
- ``server`` given: uses that server (token from ``token_file``).

The merge itself always goes through the Flight client. B's unmatched records are the B
records never paired with any A record (B is not consumed by RTM); with ``unmatched`` they
are streamed back from the server at the end and written to ``PREFIX.b.parquet``.

``run_rtm`` is the in-process run (``--local``); ``smerge.spark.rtm.run_rtm_spark`` runs the same
prepared merge on Spark (each partition of A queries the server) with the same outputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterator, Mapping

import numpy as np
import pyarrow as pa

from smerge.datasets import InputSource, open_input
from smerge.datasets.writers import check_output_schema
from smerge.errors import UsageError, param
from smerge.jobs.inputs import (PreparedMerge, ProgressFactory, check_kappa_memory, check_keys_cover, masked_stats,
                                 open_inputs)
from smerge.jobs.outputs import abort_outputs, check_outputs, commit_outputs, default_output, open_outputs, write_stats
from smerge.merge.keys import check_key_compat, key_eps, key_matrix, nan_rows
from smerge.merge.arrays import int64_array
from smerge.merge.output import pair_schema
from smerge.merge.params import DEFAULT_DELTA_WINDOWS, DEFAULT_WINDOW_SIZE, MergeKeys, resolve_eps
from smerge.merge.rtm_params import RTMParams
from smerge.merge.stats import MergeStats

if TYPE_CHECKING:
    from smerge.datasets.archive.sampling import Sampling


@dataclass(frozen=True)
class RTMJob:
    """One RTM merge as given on the command line."""

    a: str
    b: str | None = None
    server: str | None = None
    token_file: str | None = None
    tls_root_cert: str | None = None
    output: str | None = None
    format: str | None = None
    keys_a: tuple[str, ...] | None = None
    keys_b: tuple[str, ...] | None = None
    vars_a: tuple[str, ...] | None = None
    vars_b: tuple[str, ...] | None = None
    eps: float | Mapping[str, float] | tuple[float, ...] = 0.0
    window_size: int = DEFAULT_WINDOW_SIZE
    refill: str = "page"
    with_ids: bool = False
    nan_keys: str = "error"
    delta: float | None = None
    delta_windows: int = DEFAULT_DELTA_WINDOWS
    unmatched: str | None = None
    stats: str | None = None
    kappa_max: bool = False
    overwrite: bool = False
    batch_rows: int = 131072
    command: str = ""
    # The run's sampled archive reads (``smerge.datasets.archive.sampling.Sampling``), set by the
    # pipeline (``execute``); None outside a run: archives read with the environment's fraction, else 1.
    sampling: Sampling | None = field(default=None, compare=False, repr=False)


def _server_source(job: RTMJob):
    """(client, B's InputSource shim) for a running server."""
    from smerge.transport.flight_client import IndexClient
    from smerge.transport.tokens import read_token_file

    token = read_token_file(job.token_file) if job.token_file else None
    certs = None
    if job.tls_root_cert:
        try:
            with open(job.tls_root_cert, "rb") as f:
                certs = f.read()
        except OSError as e:
            raise UsageError(f"{param.tls_root_cert} {job.tls_root_cert}: cannot be read ({e.strerror})") from None
    client = IndexClient(job.server, token=token, tls_root_certs=certs)
    info = client.info()
    schema = client.schema()
    keys = tuple(info["keys"])
    if job.keys_b and tuple(job.keys_b) != keys:
        raise UsageError(f"{param.keys_b} {','.join(job.keys_b)} differs from the server's index keys "
                         f"{','.join(keys)}; rebuild the index with those keys or drop {param.keys_b}")
    if job.vars_b:
        missing = [v for v in job.vars_b if v not in schema.names]
        if missing:
            raise UsageError(f"{param.vars_b} {', '.join(missing)}: not served; B's columns are {', '.join(schema.names)}")
        schema = pa.schema([schema.field(c) for c in keys] + [schema.field(v) for v in job.vars_b if v not in keys])
    src = InputSource(path=job.server, format="flight", schema=schema, keys=keys, num_rows=int(info["count"]),
                      outer_size=int(info["count"]), inner_size=1,
                      open_batches=lambda start=0, stop=None: client.stream(list(schema.names)))
    return client, src


def _keys_in_server_order(job: RTMJob, src_a: InputSource, src_b: InputSource) -> InputSource:
    """A's keys matched **by name** to the server's index keys (docs/data.md, "Keys are matched by name").

    The server answers in its own key order, so A's keys must follow it. A's default keys (no
    ``--keys``) are put in the server's order; keys the user listed in another order, or names
    the server does not have, are an error (never paired by position)."""
    server = tuple(src_b.keys)
    names_a = tuple(src_a.keys)
    if job.keys_b:
        return src_a  # --keys-b names B's keys explicitly; _server_source checked them
    if names_a == server:
        return src_a
    if sorted(names_a) != sorted(server):
        raise UsageError(f"A's keys {','.join(names_a)} are not the server's index keys {','.join(server)}; "
                         f"keys are matched by name: pass {param.keys_b} to pair A's keys with the server's")
    if job.keys_a:
        raise UsageError(f"{param.keys} {','.join(names_a)} lists the server's index keys in another order; the server "
                         f"sorts by {','.join(server)}: pass {param.keys} {','.join(server)}")
    return open_input(job.a, keys=server, variables=job.vars_a, batch_rows=job.batch_rows, sample=job.sampling)


def prepare_rtm(job: RTMJob) -> PreparedMerge:
    """Open A (metadata only), reach B, validate every parameter and output path."""
    if (job.b is None) == (job.server is None):
        raise UsageError(f"give B (an input to index for this run) or {param.server} URL" +
                         (", not both" if job.b is not None else ": one of them is needed"))
    if job.server is None and job.token_file:
        raise UsageError(f"{param.token_file} is for {param.server}; the embedded server makes its own token")
    client = None
    if job.server is not None:
        src_a = open_input(job.a, keys=job.keys_a, variables=job.vars_a, batch_rows=job.batch_rows,
                           sample=job.sampling)
        if not src_a.keys:
            raise UsageError(f"{job.a}: no merge keys; pass {param.keys} K1,K2 (tabular inputs have no default keys)")
        client, src_b = _server_source(job)
        src_a = _keys_in_server_order(job, src_a, src_b)
        check_keys_cover(src_a, "A")
    else:
        src_a, src_b = open_inputs(job)
    if job.kappa_max:
        check_kappa_memory(src_a, src_b)
    keys = MergeKeys(tuple(src_a.keys), tuple(src_b.keys))
    check_key_compat(src_a.schema, keys.a, src_b.schema, keys.b, source_a=job.a, source_b=job.b or job.server)
    eps = resolve_eps(key_eps(dict(job.eps) if isinstance(job.eps, Mapping) else job.eps, keys.a, src_a.schema),
                      keys.a)
    params = RTMParams(keys=keys, eps=eps, window_size=job.window_size, refill=job.refill, with_ids=job.with_ids,
                       nan_keys=job.nan_keys, delta=job.delta, delta_windows=job.delta_windows)
    output = job.output or default_output(job.a, job.b or (client.info()["name"] if client else "b"))
    fmt, unmatched = check_outputs(job, output, src_a)
    write_ids = params.with_ids
    if fmt in ("netcdf", "zarr") and not write_ids:
        params = replace(params, with_ids=True)  # the grid writer places pairs by a_row
    out_schema = pair_schema(src_a.schema, src_b.schema, with_ids=params.with_ids)
    check_output_schema(output, fmt, out_schema)  # before the run: CSV holds no nested column
    return PreparedMerge(job=job, src_a=src_a, src_b=src_b, params=params, output=output, output_format=fmt,
                         out_schema=out_schema, write_ids=write_ids, unmatched_paths=unmatched,
                         extra={"client": client})


def unmatched_b(client, names, paired: np.ndarray, *, with_ids: bool) -> Iterator[pa.RecordBatch]:
    """B's records never paired (``paired[row]`` False), streamed back from the server in stored
    order; with ``b_row`` when ids are asked for."""
    pos = 0
    for batch in client.stream(list(names)):
        rows = np.arange(pos, pos + batch.num_rows, dtype=np.int64)
        pos += batch.num_rows
        keep = ~paired[rows]
        if keep.any():
            sel = batch.filter(pa.array(keep))
            if with_ids:
                sel = sel.append_column("b_row", int64_array(rows[keep]))
            yield sel


def b_keys(client, keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """All of B's valid keys and row ids, streamed from the server (for kappa_max)."""
    ks, rs, pos = [], [], 0
    for batch in client.stream(list(keys)):
        k = key_matrix(batch, keys)
        r = np.arange(pos, pos + batch.num_rows, dtype=np.int64)
        pos += batch.num_rows
        ok = ~nan_rows(k)
        ks.append(k[ok])
        rs.append(r[ok])
    if not ks:
        return np.empty((0, len(keys))), np.empty(0, np.int64)
    return np.concatenate(ks), np.concatenate(rs)


def run_rtm(prep: PreparedMerge, *, progress: ProgressFactory | None = None, prefetch_depth: int = 4) -> dict:
    """Run the RTM merge (embedded server or the given one); return the statistics dict."""
    from smerge.merge.rtm import rtm_merge
    from smerge.transport import BackgroundWriter, Prefetcher

    t0 = time.perf_counter()
    job = prep.job
    client = prep.extra.get("client")
    server = None
    build_seconds = 0.0
    stats = MergeStats("rtm")
    bar = progress(prep.src_a.num_rows, "A records") if progress else None
    # A is read ahead in a thread from the start: reading A overlaps building B's index
    pa_it = Prefetcher(prep.src_a.batches(), prefetch_depth, "smerge-read-a",
                       on_item=(lambda b: bar.update(b.num_rows)) if bar else None)
    try:
        if client is None:
            from smerge.index import BIndex
            from smerge.transport.flight_client import IndexClient
            from smerge.transport.flight_server import IndexServer
            from smerge.transport.tokens import new_token

            tb = time.perf_counter()
            idx = BIndex.from_source(prep.src_b, nan_keys=prep.params.nan_keys)
            build_seconds = time.perf_counter() - tb
            token = new_token()
            server = IndexServer(idx, host="127.0.0.1", port=0, token=token)
            server.start_background()
            client = IndexClient(server.url, token=token)
        params = prep.params
        info = client.info()
        b_records = int(info["count"])
        out, un_a, un_b = open_outputs(prep)
    except BaseException:
        pa_it.close()
        if bar:
            bar.close()
        if server is not None:
            client.close()
            server.shutdown()
        raise
    write_seconds = 0.0
    drop_ids = params.with_ids and not prep.write_ids and prep.output_format not in ("netcdf", "zarr")
    b_paired = np.zeros(b_records, dtype=np.bool_)
    # Output batches are encoded and written in a background thread, in order (as cgm does).
    writer = BackgroundWriter(lambda item: item[0].write(item[1]), prefetch_depth, "smerge-write")

    def sink(side: str, batch: pa.RecordBatch) -> None:
        if un_a is not None:
            writer.put((un_a, batch))

    try:
        kappa_b = (lambda: b_keys(client, params.keys.b)) if job.kappa_max else None
        for batch in rtm_merge(pa_it, client, params, schema_a=prep.src_a.schema, schema_b=prep.src_b.schema,
                               b_records=b_records, stats=stats, unmatched=sink if prep.unmatched_paths else None,
                               source_a=job.a, b_paired=b_paired, kappa_max_b=kappa_b):
            writer.put((out, batch.drop_columns(["a_row", "b_row"]) if drop_ids else batch))
        if un_b is not None:
            for sel in unmatched_b(client, prep.src_b.schema.names, b_paired, with_ids=params.with_ids):
                writer.put((un_b, sel))
        writer.close()
        write_seconds += commit_outputs((out, un_a, un_b))
    except BaseException:
        writer.cancel()
        abort_outputs((out, un_a, un_b))
        raise
    finally:
        pa_it.close()
        if bar:
            bar.close()
        client.close()  # single-use (prepare_rtm opens it for this run)
        if server is not None:
            server.shutdown()
    write_seconds += writer.busy_seconds
    stats.fetch_seconds = pa_it.busy_seconds + stats.extra.get("fetch_b_seconds", 0.0)
    stats.write_seconds = write_seconds
    stats.total_seconds = time.perf_counter() - t0
    stats.extra.update({
        "fetch_a_seconds": pa_it.busy_seconds, "index_build_seconds": build_seconds,
        "client_retries": client.retried, "execution": "local",
    })
    stats.b_nan_keys = int(info.get("nan_keys") or 0)  # left out of B's index (--nan-keys unmatched)
    return rtm_result(prep, stats, embedded=server is not None)


def rtm_result(prep: PreparedMerge, stats: MergeStats, *, embedded: bool, read_here: bool = True) -> dict:
    """The statistics dict of an RTM run (in-process or on Spark, docs/cli.md): ``stats`` with the
    fields both report (server, paths, what B's unmatched means, masked values), written to
    ``--stats`` when asked. ``read_here``: the inputs were streamed in this process."""
    job = prep.job
    stats.extra.update({
        "server": "embedded" if embedded else job.server,
        "a": job.a, "b": job.b or job.server, "output": prep.output,
        "b_unmatched_definition": "B records never paired with any A record (RTM does not consume B)",
        **masked_stats(prep, read_here=read_here),
    })
    result = stats.as_dict()
    result["params"] = dict(result["params"], with_ids=prep.write_ids, output_format=prep.output_format)
    if job.stats:
        write_stats(job.stats, result, overwrite=job.overwrite)
    return result


__all__ = ["RTMJob", "prepare_rtm", "run_rtm", "rtm_result"]
