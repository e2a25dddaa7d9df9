"""The batched shm rate row of ``bench real``: every message arrives, the row only with "rate"."""

from __future__ import annotations

from stacklib.bench.shm_rates import batched_rows, batched_stream


def test_batched_stream_delivers_every_message() -> None:
    # batched_stream raises if a message is lost; 1000 is not a multiple of the batch of 64.
    assert batched_stream(1000, 40) > 0


def test_the_row_comes_with_the_rate_measurement_only() -> None:
    assert batched_rows(["uam"], 1, 100, 40) == []
    (row,) = batched_rows(["rate"], 1, 500, 40)
    assert "send_many/recv_many" in str(row["measurement"]) and row["unit"] == "msgs/s"
    assert isinstance(row["value"], float) and row["value"] > 0
