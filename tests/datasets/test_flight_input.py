"""``grpc://HOST:PORT/NAME`` as an input of any command (transport/flight_input.py): a real index server
serves B's plain stream; `smerge cgm A grpc://.../NAME --local` equals `smerge cgm A B --local`."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.datasets import open_input
from smerge.index import BIndex
from smerge.transport.flight_server import IndexServer
from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

TOKEN = "flight-input-test-token"


@pytest.fixture
def serve():
    servers = []

    def start(src, name, token=TOKEN):
        server = IndexServer(BIndex.from_source(src, name=name), port=0, token=token)
        server.start_background()
        servers.append(server)
        return server.url.replace("grpc+tcp://", "grpc://") + f"/{name}"

    yield start
    for s in servers:
        s.shutdown()


@pytest.fixture
def token_env(tmp_path, monkeypatch):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    monkeypatch.setenv("SMERGE_TOKEN_FILE", str(f))
    monkeypatch.delenv("SMERGE_TOKEN", raising=False)
    return str(f)


@pytest.mark.slow
def test_cgm_with_a_server_stream_equals_cgm_with_the_file(ncar_dir, tmp_path, capsys, serve, token_env):
    u, v = os.path.join(ncar_dir, "Ustorm.cdf"), os.path.join(ncar_dir, "Vstorm.cdf")
    url = serve(open_input(v), "Vstorm")
    rc, out, err = run_cli(capsys, "cgm", "--local", u, url, "-o", tmp_path / "s.parquet", "--with-ids")
    assert rc == 0, err
    rc, out, err = run_cli(capsys, "cgm", "--local", u, v, "-o", tmp_path / "f.parquet", "--with-ids")
    assert rc == 0, err
    s = pq.read_table(tmp_path / "s.parquet")
    f = pq.read_table(tmp_path / "f.parquet")
    assert s.num_rows == 76032 and s.equals(f)


def test_keys_from_the_server_columns_and_row_ranges(tmp_path, serve, token_env):
    t = pa.table({"t": np.repeat(np.arange(50.0), 10), "x": np.tile(np.arange(10.0), 50),
                  "v": np.arange(500, dtype=np.float32), "w": np.arange(500) * 2})
    pq.write_table(t, tmp_path / "b.parquet")
    url = serve(open_input(str(tmp_path / "b.parquet"), keys=["t", "x"]), "b")
    src = open_input(url, batch_rows=64)
    assert src.format == "flight" and src.keys == ("t", "x") and src.num_rows == 500
    assert src.schema == t.schema
    got = pa.Table.from_batches(list(src.batches()))
    assert got.equals(t) and max(b.num_rows for b in src.batches()) <= 64
    part = pa.Table.from_batches(list(src.batches(130, 377)))
    assert part.equals(t.slice(130, 247))
    only = open_input(url, keys=["t", "x"], variables=["w"])
    assert only.schema.names == ["t", "x", "w"]
    assert pa.Table.from_batches(list(only.batches())).equals(t.select(["t", "x", "w"]))
    # NAME may be left out when the server serves one dataset
    bare = open_input(url.rsplit("/", 1)[0])
    assert bare.num_rows == 500 and bare.keys == ("t", "x")


def test_bad_token_unknown_name_and_no_server_are_one_line_errors(tmp_path, serve, token_env, monkeypatch, capsys):
    a = tmp_path / "a.parquet"
    pq.write_table(pa.table({"k": [1.0, 2.0]}), a)
    url = serve(open_input(str(a), keys=["k"]), "b")
    base = url.rsplit("/", 1)[0]
    cases = [(url + "x", "unknown dataset"), ("grpc://127.0.0.1/b", "grpc://HOST:PORT")]
    for target, msg in cases:
        rc, out, err = run_cli(capsys, "cgm", "--local", a, target, "--keys", "k", "-o", tmp_path / "o.parquet")
        assert rc == 2 and msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.setenv("SMERGE_TOKEN", "wrong-token-123")
    monkeypatch.delenv("SMERGE_TOKEN_FILE")
    rc, out, err = run_cli(capsys, "cgm", "--local", a, url, "--keys", "k", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "rejected the token" in err and len(err.strip().splitlines()) == 1, err
    assert "set SMERGE_TOKEN_FILE to the file holding the server's token" in err and "--token-file" not in err
    assert "\x1d" not in err and "()" not in err  # the server's own words arrive rendered (no empty option)
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rc, out, err = run_cli(capsys, "cgm", "--local", a, f"grpc://127.0.0.1:{port}/b", "--keys", "k",
                           "-o", tmp_path / "o.parquet")
    assert rc == 2 and "unavailable" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o.parquet").exists()
    assert base.startswith("grpc://127.0.0.1:")


def test_the_readers_find_the_server_reader_through_its_entry_point(tmp_path):
    # smerge.datasets imports no transport code: a file is opened without it, and a grpc:// URL
    # is claimed by the reader the `smerge.backends` entry point names (smerge.transport.flight_input)
    import subprocess
    import sys

    pq.write_table(pa.table({"k": [1.0, 2.0]}), tmp_path / "a.parquet")
    code = ("import sys\nfrom smerge.datasets import guess_backend, open_input\n"
            f"src = open_input({str(tmp_path / 'a.parquet')!r}, keys=['k'])\n"
            "print(src.format, any(m.startswith('smerge.transport') for m in sys.modules))\n"
            "b = guess_backend('grpc://127.0.0.1:1/b')\n"
            "print(b.name, type(b).__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.split("\n")[:2] == ["parquet False", "flight smerge.transport.flight_input"]
