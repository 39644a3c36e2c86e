"""Issue 10: the index server against hostile clients, damaged indexes and stalled shutdowns.

Every test runs a real server on 127.0.0.1 (in this process or as ``smerge serve``); servers
that could run away are subprocesses with a capped address space."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from smerge.datasets import open_input
from smerge.errors import InputError, UsageError
from smerge.index import BIndex, Box, build_index
from smerge.transport import flight_server
from smerge.transport.flight_client import IndexClient, split_url
from smerge.transport.flight_server import IndexServer

SHUTDOWN_GRACE = getattr(flight_server, "SHUTDOWN_GRACE", 5.0)

pytestmark = pytest.mark.slow
TOKEN = "hardening-token-0123456789"
SMERGE = [sys.executable, "-m", "smerge"]
AUTH = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())], timeout=60)
ADDRESS_SPACE = 6 << 30  # a runaway server dies instead of taking the machine


def _cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(field)


def _server_text(e: BaseException) -> str:
    return str(e).split(". gRPC client debug context:")[0]


def _serve(args, tmp_path, **kw) -> tuple[subprocess.Popen, str]:
    (tmp_path / "tok").write_text(TOKEN + "\n")
    p = subprocess.Popen(SMERGE + ["serve", *args, "--port", "0", "--token-file", str(tmp_path / "tok")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_cap_memory, **kw)
    url = p.stdout.readline().strip()
    if not url:
        p.kill()
        raise AssertionError(p.stderr.read())
    return p, url


@pytest.fixture(scope="module")
def big_parquet(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    n = 2_000_000
    t = pa.table({"k": np.arange(n, dtype=np.float64) // 4, "j": np.arange(n, dtype=np.float64) % 4,
                  "v": np.zeros(n, np.float32)})
    pq.write_table(t, d / "b.parquet")
    return d / "b.parquet"


# -- 1. oversized requests are refused before gRPC buffers them ---------------------------------------

def test_oversized_unauthenticated_tickets_do_not_grow_the_server(big_parquet, tmp_path):
    p, url = _serve([str(big_parquet), "--keys", "k,j"], tmp_path)
    try:
        c = IndexClient(url.rsplit("/", 1)[0], token=TOKEN)
        assert c.health()
        time.sleep(1.0)  # let the background R-tree build settle
        base = _status(p.pid, "VmRSS")
        hwm0 = _status(p.pid, "VmHWM")
        ticket = b"x" * (256 << 20)
        errors = []

        def attack():
            raw = flight.FlightClient(url.rsplit("/", 1)[0])
            try:
                raw.do_get(flight.Ticket(ticket), flight.FlightCallOptions(timeout=60)).read_all()
            except flight.FlightError as e:
                errors.append(e)
            finally:
                raw.close()

        threads = [threading.Thread(target=attack) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert len(errors) == 4
        peak = max(_status(p.pid, "VmHWM"), hwm0)
        growth = max(peak - max(hwm0, base), _status(p.pid, "VmRSS") - base)
        print(f"server RSS {base / 2**20:.0f} MiB, peak growth {growth / 2**20:.1f} MiB")
        assert growth < 50 << 20, f"server grew {growth / 2**20:.0f} MiB"
        assert c.health() and c.info()["count"] == 2_000_000  # still serving
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0


def test_many_unfinished_requests_on_one_connection_are_refused():
    from smerge.transport.flight_gate import PREFACE, Refused, RequestLimiter

    lim = RequestLimiter()
    lim.feed(PREFACE)
    frame = lambda kind, flags, sid, n: n.to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big")
    for sid in range(1, 400, 2):
        try:
            lim.feed(frame(1, 0, sid, 100) + b"h" * 100)
        except Refused:
            break
    else:
        raise AssertionError("unfinished requests without a limit")
    lim = RequestLimiter()
    lim.feed(PREFACE + frame(1, 4, 1, 10) + b"h" * 10)
    with pytest.raises(Refused):
        lim.feed(frame(0, 0, 1, 300_000))
    lim = RequestLimiter()
    for sid in range(1, 2001, 2):  # finished requests free their budget
        lim.feed((PREFACE if sid == 1 else b"") + frame(1, 4, sid, 10) + b"h" * 10 + frame(0, 1, sid, 100)
                 + b"d" * 100)


# -- 4. SIGTERM with a stalled client ------------------------------------------------------------------

_STALLER = (
    "import sys, time, pyarrow.flight as f\n"
    "c = f.FlightClient(sys.argv[1])\n"
    f"o = f.FlightCallOptions(headers=[(b'authorization', b'Bearer {TOKEN}')])\n"
    "r = c.do_get(f.Ticket(b'{\"op\": \"stream\"}'), o)\n"
    "r.read_chunk(); print('reading', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_with_a_stalled_client_exits_0_within_the_grace_period(big_parquet, tmp_path, signals):
    p, url = _serve([str(big_parquet), "--keys", "k,j"], tmp_path)
    staller = subprocess.Popen([sys.executable, "-c", _STALLER, url.rsplit("/", 1)[0]], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert staller.stdout.readline().strip() == "reading"
        time.sleep(0.5)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        if signals == 2:
            time.sleep(0.3)
            p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=SHUTDOWN_GRACE + 30)
        took = time.monotonic() - t0
        err = p.stderr.read()
        assert code == 0, err
        if signals == 1:
            assert took < SHUTDOWN_GRACE + 2, took
            assert "stopped after" in err and "still busy" in err
        else:
            assert took < 2, took
            assert "stopped at once" in err
        assert "Traceback" not in err
    finally:
        staller.kill()
        if p.poll() is None:
            p.kill()


def test_library_shutdown_cancels_stalled_calls():
    big = pa.table({"k": np.arange(2_000_000, dtype=np.float64)})
    server = IndexServer(BIndex.build(big, ["k"], name="big"), port=0, token=TOKEN)
    server.start_background()
    staller = subprocess.Popen([sys.executable, "-c", _STALLER, server.url], stdout=subprocess.PIPE, text=True)
    try:
        assert staller.stdout.readline().strip() == "reading"
        t0 = time.monotonic()
        assert server.shutdown(grace=1.0) == 1
        assert time.monotonic() - t0 < 3 and server.stopped_cleanly
    finally:
        staller.kill()
