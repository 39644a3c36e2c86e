"""CSV row ranges start parsing at the row's byte offset (found by counting line ends)."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.datasets import csv as csv_backend
from smerge.datasets import open_input


def write(path, rows, *, ending, empty_every, trailing_newline):
    lines = ["t,x,s"]
    for i, (t, x) in enumerate(rows):
        lines.append(f"{t},{x},s{i % 3}")
        if empty_every and i % empty_every == 0:
            lines.append("")
    # "mixed": line ends cycle through \n, \r\n and a bare \r (pyarrow accepts all three)
    ends = [ending] * len(lines) if ending != "mixed" else [("\n", "\r\n", "\r")[i % 3] for i in range(len(lines))]
    text = "".join(ln + e for ln, e in zip(lines, ends))
    if not trailing_newline:
        text = text[: -len(ends[-1])]
    path.write_bytes(text.encode())
    return str(path)


@settings(max_examples=120, deadline=None)
@given(n=st.integers(1, 60), ending=st.sampled_from(["\n", "\r\n", "mixed"]), empty_every=st.sampled_from([0, 1, 4]),
       trailing=st.booleans(), block=st.sampled_from([3, 7, 64, 1 << 20]),
       start=st.integers(0, 70), span=st.one_of(st.none(), st.integers(0, 70)), data=st.data())
def test_row_range_equals_slice_of_whole_read(tmp_path_factory, n, ending, empty_every, trailing, block, start, span,
                                              data):
    rows = data.draw(st.lists(st.tuples(st.integers(0, 10**6), st.floats(-1e3, 1e3, allow_nan=False)),
                              min_size=n, max_size=n))
    path = write(tmp_path_factory.mktemp("csv") / "x.csv", rows, ending=ending, empty_every=empty_every,
                 trailing_newline=trailing)
    old = csv_backend.LINE_BLOCK
    csv_backend.LINE_BLOCK = block
    try:
        src = open_input(path, keys=("t",), batch_rows=5)
        whole = pa.Table.from_batches(list(src.batches()), schema=src.schema)
        stop = None if span is None else start + span
        part = pa.Table.from_batches(list(src.batches(start, stop)), schema=src.schema)
    finally:
        csv_backend.LINE_BLOCK = old
    assert whole.num_rows == n
    assert part.equals(whole.slice(start, (n if stop is None else min(stop, n)) - min(start, n)))


def test_row_offsets_count_rows_not_lines(tmp_path):
    path = tmp_path / "x.csv"
    path.write_bytes(b"t,x\r\n1,2\r\n\r\n3,4\n\n\n7,8\n9,10")
    assert csv_backend.row_offset(str(path), 0) == len(b"t,x\r\n")
    assert csv_backend.row_offset(str(path), 2) == len(b"t,x\r\n1,2\r\n\r\n3,4\n")  # empty lines follow
    assert csv_backend.row_offset(str(path), 3) == len(b"t,x\r\n1,2\r\n\r\n3,4\n\n\n7,8\n")
    assert csv_backend.row_offset(str(path), 4) == -1
    src = open_input(str(path), keys=("t",))
    assert pa.Table.from_batches(list(src.batches(2, 4))).column("t").to_pylist() == [7, 9]
    path.write_bytes(b"t,x\r1,2\r3,4\r")  # bare CR line ends: parsed from the start
    assert csv_backend.row_offset(str(path), 1) == 0
    src = open_input(str(path), keys=("t",))
    assert pa.Table.from_batches(list(src.batches(1))).column("t").to_pylist() == [3]
    path.write_bytes(b"t,x\n1,2\r3,4\n5,6\n")  # one bare CR among \n line ends
    assert csv_backend.row_offset(str(path), 1) == 0
    src = open_input(str(path), keys=("t",))
    assert pa.Table.from_batches(list(src.batches(1))).column("t").to_pylist() == [3, 5]
