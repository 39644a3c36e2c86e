"""The index server over Arrow Flight: tokens, validation errors that leave the server up,
concurrent clients, a client killed mid-stream, restart from a persisted index, SIGTERM, TLS."""

from __future__ import annotations

import json
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
from smerge.index import BIndex, build_index
from smerge.merge.range_source import Box
from smerge.transport.flight_client import IndexClient
from smerge.transport.flight_server import IndexServer

pytestmark = pytest.mark.slow
TOKEN = "test-token-0123456789"
SMERGE = [sys.executable, "-m", "smerge"]


def grid_table(n=20000, seed=0) -> pa.Table:
    rng = np.random.default_rng(seed)
    k = rng.integers(0, 50, (n, 3)).astype(float)
    return pa.table({"t": k[:, 0], "y": k[:, 1], "x": k[:, 2], "v": np.arange(n, dtype=np.float32)})


@pytest.fixture(scope="module")
def served():
    t = grid_table()
    idx = BIndex.build(t, ["t", "y", "x"], name="grid")
    server = IndexServer(idx, port=0, token=TOKEN)
    server.start_background()
    yield server, idx, t
    server.shutdown()


def test_token_required(served):
    server, _, _ = served
    for tok in (None, "wrong-token-xxxxxxxx"):
        with pytest.raises(UsageError, match="rejected the token"):
            IndexClient(server.url, token=tok).info()
    with IndexClient(server.url, token=TOKEN) as c:
        assert c.info()["count"] == 20000 and c.health()


@pytest.mark.parametrize("body, msg", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"op": "drop_table"}', "unknown op"),
    (b'{"op": "range", "box": {"lo": [0, 0, 0], "hi": [1, 1, 1]}, "limit": -5}', "limit is -5"),
    (b'{"op": "range", "box": {"lo": [0, 0, 0], "hi": [1, 1, 1]}, "limit": 10, "evil": 1}', "unknown request field"),
    (b'{"op": "range", "box": {"lo": [0], "hi": [1]}, "limit": 10}', "3 bounds per side"),
    (b'{"op": "range", "box": {"lo": [0, "a", 0], "hi": [1, 1, 1]}, "limit": 10}', "must be a number"),
    (b'{"op": "range", "box": {"lo": [0, 0, 0], "hi": [1, 1, 1]}, "limit": 99999999999}', "limit is"),
    (b'{"op": "symdiff", "box": {"lo": [0, 0, 0], "hi": [1, 1, 1]}, "limit": 10}', "needs 'box2'"),
    (b'{"op": "range", "box": {"lo": [0, 0, 0], "hi": [1, 1, 1]}, "limit": 10, "token": "5.deadbeef"}', "does not belong"),
    (b'{"op": "stream", "dataset": "nope"}', "unknown dataset"),
    (b'{"op": "stream", "columns": ["zz"]}', "unknown column"),
    (b'{"op": "range", "box": {"lo": [' + b"0," * 40000 + b'0], "hi": [1]}, "limit": 1}', "limit is 65536"),
])
def test_bad_requests_answered_and_server_stays_up(served, body, msg):
    server, _, _ = served
    c = IndexClient(server.url, token=TOKEN)
    with pytest.raises(UsageError, match=msg.replace("limit is 65536", "bytes; the limit is")):
        c._get_table(body)
    raw = flight.FlightClient(c.location)
    opts = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    with pytest.raises(flight.FlightServerError, match="unknown action"):
        list(raw.do_action(flight.Action("format_disk", b""), opts))
    assert c.health() and c.info()["count"] == 20000


def _server_text(e: BaseException) -> str:
    """What the server sent (pyarrow's client appends its own debug context after it)."""
    return str(e).split(". gRPC client debug context:")[0]


def test_raw_client_gets_one_line_errors_without_python_tracebacks(served, caplog):
    import logging

    server, _, _ = served
    raw = flight.FlightClient(server.url)
    opts = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    calls = [
        lambda: raw.do_get(flight.Ticket(b"{not json"), opts).read_all(),
        lambda: raw.do_get(flight.Ticket(b'{"op": "range", "box": {"lo": [0, 0, 0], "hi": [1, 1, 1]}, "limit": -5}'),
                           opts).read_all(),
        lambda: list(raw.do_action(flight.Action("format_disk", b""), opts)),
        lambda: list(raw.do_action(flight.Action("info", b"{oops"), opts)),
        lambda: raw.get_flight_info(flight.FlightDescriptor.for_path("nope"), opts),
        lambda: raw.get_flight_info(flight.FlightDescriptor.for_command(b"SELECT 1"), opts),
    ]
    for call in calls:
        with pytest.raises(flight.FlightServerError) as err:
            call()
        text = _server_text(err.value)
        assert err.value.extra_info == b"INVALID_ARGUMENT"
        assert "Traceback" not in str(err.value) and "Python exception" not in str(err.value)
        assert "\n" not in text and ".py" not in text, text
    # An unexpected failure inside the server: one line to the client, the traceback in the log.
    broken = BIndex.build(grid_table(100), ["t", "y", "x"], name="broken")

    def boom(*a, **k):
        raise RuntimeError("disk on fire\nsecond line")

    broken.take = boom
    s2 = IndexServer(broken, port=0)
    s2.start_background()
    try:
        with caplog.at_level(logging.DEBUG, logger="smerge.serve"):
            with pytest.raises(flight.FlightInternalError) as err:
                flight.FlightClient(s2.url).do_get(flight.Ticket(
                    b'{"op": "range", "box": {"lo": [0, 0, 0], "hi": [99, 99, 99]}, "limit": 5}')).read_all()
        text = _server_text(err.value)
        assert "internal server error (RuntimeError: disk on fire)" in text and "second line" not in text
        assert "Traceback" not in str(err.value)
        assert any(r.exc_info and "disk on fire" in str(r.exc_info[1]) for r in caplog.records)
        with pytest.raises(InputError, match="server error: internal server error"):
            IndexClient(s2.url).range_query(Box((0.0,) * 3, (99.0,) * 3), limit=5)
        assert IndexClient(s2.url).health()  # still serving
    finally:
        s2.shutdown()


def expected_rows(k, b):
    sel = np.nonzero(((k >= np.asarray(b.lo)) & (k <= np.asarray(b.hi))).all(axis=1))[0]
    return sorted(sel.tolist(), key=lambda r: (tuple(k[r]), r))


def test_32_concurrent_clients_200_queries_each(served):
    server, idx, t = served
    k = idx.key_matrix
    rng = np.random.default_rng(1)
    boxes = []
    for _ in range(50):
        lo = rng.integers(0, 45, 3).astype(float)
        boxes.append(Box.from_arrays(lo, lo + rng.integers(0, 6, 3)))
    truth = [expected_rows(k, b) for b in boxes]
    errors, latencies = [], []
    lock = threading.Lock()

    def worker(w):
        try:
            c = IndexClient(server.url, token=TOKEN)
            for q in range(200):
                i = (w * 7 + q) % len(boxes)
                t0 = time.perf_counter()
                tab, nxt = c.range_query(boxes[i], limit=50)
                dt = time.perf_counter() - t0
                got = tab.column("__smerge_row").to_pylist()
                if got != truth[i][:50] or (nxt is None) != (len(truth[i]) <= 50):
                    raise AssertionError(f"worker {w} query {q}: wrong page")
                with lock:
                    latencies.append(dt)
            c.close()
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            with lock:
                errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(32)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors[:3]
    assert len(latencies) == 32 * 200


def test_client_killed_mid_stream_does_not_disturb_others(tmp_path):
    big = pa.table({"k": np.arange(2_000_000, dtype=np.float64), "v": np.zeros(2_000_000)})
    server = IndexServer(BIndex.build(big, ["k"], name="big"), port=0, token=TOKEN)
    server.start_background()
    try:
        code = (
            "import sys, pyarrow.flight as f\n"
            f"c = f.FlightClient('{server.url}')\n"
            f"o = f.FlightCallOptions(headers=[(b'authorization', b'Bearer {TOKEN}')])\n"
            "r = c.do_get(f.Ticket(b'{\"op\": \"stream\"}'), o)\n"
            "r.read_chunk(); print('reading', flush=True)\n"
            "import time; time.sleep(60)\n"
        )
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "reading"
        c = IndexClient(server.url, token=TOKEN)
        it = c.stream()
        first = next(it)
        p.kill()
        p.wait(timeout=10)
        rest = sum(b.num_rows for b in it)
        assert first.num_rows + rest == 2_000_000
        tab, _ = c.range_query(Box((10.0,), (19.0,)), limit=100)
        assert tab.column("k").to_pylist() == [float(x) for x in range(10, 20)]
    finally:
        server.shutdown()


def test_restart_from_persisted_index_answers_identically_and_resumes(tmp_path):
    t = grid_table(5000, seed=2)
    pq.write_table(t, tmp_path / "b.parquet")
    build_index(open_input(str(tmp_path / "b.parquet"), keys=["t", "y", "x"]), str(tmp_path / "idx")).close()
    b = Box.from_arrays([0, 0, 0], [30, 49, 49])
    s1 = IndexServer(BIndex.load(str(tmp_path / "idx")), port=0, token=TOKEN)
    s1.start_background()
    port = s1.port
    c = IndexClient(s1.url, token=TOKEN, retries=6)
    first, token = c.range_query(b, limit=1000)
    whole1 = [c.range_query(b, limit=100000)[0]]
    s1.shutdown()
    s2 = IndexServer(BIndex.load(str(tmp_path / "idx")), port=port, token=TOKEN)
    s2.start_background()
    try:
        second, _ = c.range_query(b, limit=1000, token=token)  # same client, resumed after restart
        whole2 = c.range_query(b, limit=100000)[0]
        assert whole1[0].equals(whole2)
        rows = first.column("__smerge_row").to_pylist() + second.column("__smerge_row").to_pylist()
        assert rows == whole2.column("__smerge_row").to_pylist()[:2000]
    finally:
        s2.shutdown()


def test_unreachable_server_and_non_loopback_without_token():
    with pytest.raises(InputError, match="unavailable"):
        IndexClient("grpc://127.0.0.1:1", retries=1).info()
    with pytest.raises(UsageError, match="requires a token"):
        IndexServer(BIndex.build(pa.table({"k": [1.0]}), ["k"]), host="0.0.0.0", port=0)
    with pytest.raises(UsageError, match="grpc://HOST:PORT"):
        IndexClient("http://x")


def test_cli_serve_index_stream_and_sigterm(tmp_path):
    t = grid_table(3000, seed=4)
    pq.write_table(t, tmp_path / "b.parquet")
    (tmp_path / "tok").write_text(TOKEN + "\n")
    r = subprocess.run(SMERGE + ["index", "build", str(tmp_path / "b.parquet"), "-o", str(tmp_path / "idx"),
                                 "--keys", "t,y,x", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["count"] == 3000
    p = subprocess.Popen(SMERGE + ["serve", "--index", str(tmp_path / "idx"), "--port", "0", "--token-file",
                                   str(tmp_path / "tok")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = p.stdout.readline().strip()
        assert url.startswith("grpc+tcp://127.0.0.1:") and url.endswith("/b")
        c = IndexClient(url, token=TOKEN)
        got = pa.Table.from_batches(list(c.stream()))
        assert got.equals(t)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        assert "stopped after" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()


def test_tls(tmp_path):
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    server = IndexServer(BIndex.build(pa.table({"k": [1.0, 2.0, 3.0]}), ["k"]), port=0, token=TOKEN,
                         tls_cert=cert.read_bytes(), tls_key=key.read_bytes())
    server.start_background()
    try:
        assert server.url.startswith("grpc+tls://")
        c = IndexClient(server.url, token=TOKEN, tls_root_certs=cert.read_bytes())
        tab, _ = c.range_query(Box((2.0,), (3.0,)), limit=10)
        assert tab.column("k").to_pylist() == [2.0, 3.0]
        with pytest.raises(InputError):
            IndexClient(server.url, token=TOKEN, retries=0).info()  # untrusted certificate
    finally:
        server.shutdown()
