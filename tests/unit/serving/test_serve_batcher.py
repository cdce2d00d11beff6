"""The dynamic batcher: what joins a batch, how long it waits, buckets and padding, the
split back to requests, and its bounds."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from triplane.scheduler.errors import Unavailable
from triplane.serving.batcher import Batcher, bucket, buckets


def _req(rows: int, width: int = 3, fill: float = 0.0) -> list[np.ndarray]:
    return [np.full((rows, width), fill, np.float32)]


def test_buckets_are_powers_of_two_up_to_the_max() -> None:
    assert buckets(1) == [1]
    assert buckets(8) == [1, 2, 4, 8]
    assert buckets(12) == [1, 2, 4, 8, 12]
    assert [bucket(n, 12) for n in (1, 3, 5, 9, 12)] == [1, 4, 8, 12, 12]


def test_requests_waiting_together_form_one_padded_batch_and_split_back() -> None:
    b = Batcher(max_batch=8, max_wait_s=0.05)
    futures = [b.submit(_req(n, fill=float(i)), n) for i, n in enumerate((1, 2, 2))]
    batch = b.next_batch(1.0)
    assert batch is not None and len(batch.requests) == 3
    assert batch.rows == 5 and batch.size == 8  # padded to the bucket
    x = batch.arrays[0]
    assert x.shape == (8, 3)
    np.testing.assert_array_equal(x[:5, 0], [0, 1, 1, 2, 2])
    np.testing.assert_array_equal(x[5:], np.zeros((3, 3)))  # copies of the first row
    batch.split([x * 10], "v1")
    assert {f.result(1).version for f in futures} == {"v1"}
    outs = [f.result(1).outputs[0] for f in futures]
    assert [o.shape[0] for o in outs] == [1, 2, 2]
    np.testing.assert_array_equal(outs[2], np.full((2, 3), 20.0))


def test_a_full_batch_goes_at_once_and_the_rest_waits_its_turn() -> None:
    b = Batcher(max_batch=4, max_wait_s=10.0)  # a long wait that a full batch does not serve
    for _ in range(6):
        b.submit(_req(1), 1)
    t0 = time.monotonic()
    first = b.next_batch(1.0)
    assert first is not None and first.rows == 4 and time.monotonic() - t0 < 1.0
    assert len(b) == 2


def test_a_lone_request_waits_at_most_max_wait() -> None:
    b = Batcher(max_batch=64, max_wait_s=0.05)
    b.submit(_req(1), 1)
    t0 = time.monotonic()
    batch = b.next_batch(1.0)
    waited = time.monotonic() - t0
    assert batch is not None and batch.rows == 1 and batch.size == 1
    assert 0.04 <= waited < 0.5, waited


def test_a_request_arriving_while_the_batch_waits_joins_it() -> None:
    b = Batcher(max_batch=2, max_wait_s=2.0)
    b.submit(_req(1), 1)
    threading.Timer(0.05, lambda: b.submit(_req(1), 1)).start()
    t0 = time.monotonic()
    batch = b.next_batch(1.0)
    assert batch is not None and batch.rows == 2 and time.monotonic() - t0 < 1.0


def test_requests_of_other_row_shapes_do_not_join() -> None:
    b = Batcher(max_batch=8, max_wait_s=0.0)
    b.submit(_req(1, width=3), 1)
    b.submit(_req(1, width=4), 1)
    b.submit(_req(2, width=3), 2)
    first = b.next_batch(1.0)
    assert first is not None and [r.arrays[0].shape for r in first.requests] == [(1, 3), (2, 3)]
    second = b.next_batch(1.0)
    assert second is not None and second.requests[0].arrays[0].shape == (1, 4)


def test_without_batching_every_request_runs_alone_unpadded() -> None:
    b = Batcher(max_batch=1, max_wait_s=1.0)
    assert not b.batching
    b.submit(_req(3), 3)
    b.submit(_req(1), 1)
    batch = b.next_batch(1.0)
    assert batch is not None and len(batch.requests) == 1 and batch.size == 3


def test_a_failed_batch_fails_each_request_and_bounds_hold() -> None:
    b = Batcher(max_batch=4, max_wait_s=0.0, max_queue=2)
    f1, f2 = b.submit(_req(1), 1), b.submit(_req(1), 1)
    with pytest.raises(Unavailable, match="at most 2"):
        b.submit(_req(1), 1)
    batch = b.next_batch(1.0)
    assert batch is not None
    batch.fail(RuntimeError("boom"))
    for f in (f1, f2):
        with pytest.raises(RuntimeError, match="boom"):
            f.result(1)
    b.close()
    with pytest.raises(Unavailable, match="shutting down"):
        b.submit(_req(1), 1)
    assert b.next_batch(0.05) is None
    with pytest.raises(ValueError):
        Batcher(max_batch=0)
