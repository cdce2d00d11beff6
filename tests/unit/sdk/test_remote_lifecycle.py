"""The cluster session's lifecycle against a fake scheduler (httpx.MockTransport): jobs
released once read, uploads when their arrays die, the lease opened, renewed and ended by
``disconnect``, Ctrl-C cancelling the job, a stopped cluster reported fast, and the
progress bar's switches (docs/cluster.md, "Lifecycle")."""

from __future__ import annotations

import gc
import os
import re
import signal
import socket
import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest
from test_remote_session import TOKEN, URL, FakeScheduler

import triplane as tp
from triplane.sdk import lifecycle
from triplane.sdk.lifecycle import Uploads
from triplane.sdk.remote import RemoteError, RemoteSession
from triplane.sdk.session import current_session, set_default_session, use_session


class LeasingScheduler(FakeScheduler):
    """The fake plus sessions and releases; ``deleted`` lists each DELETE's path."""

    def __init__(self, ttl_s: float = 30.0) -> None:
        super().__init__()
        self.ttl_s = ttl_s
        self.sessions: dict[str, int] = {}  # id -> renewals
        self.deleted: list[str] = []
        self.tagged: list[tuple[str, str | None]] = []  # (route, X-Triplane-Session)
        self.interrupt_wait = False
        self.interrupt_submit = False
        self.opened = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        if method in ("POST",) and path in ("/v1/tensors", "/v1/jobs"):
            self.tagged.append((path, request.headers.get("X-Triplane-Session")))
        if method == "POST" and path == "/v1/sessions":
            sid = f"s-{self.opened}"
            self.opened += 1
            self.sessions[sid] = 0
            return httpx.Response(201, json={"id": sid, "ttl_s": self.ttl_s})
        m = re.fullmatch(r"/v1/sessions/(s-\d+)/renew", path)
        if m and method == "POST":
            if m.group(1) not in self.sessions:
                return httpx.Response(404, json={"error": {"kind": "not_found", "message": "expired"}})
            self.sessions[m.group(1)] += 1
            return httpx.Response(200, json={"id": m.group(1), "ttl_s": self.ttl_s})
        if method == "DELETE":
            self.deleted.append(path)
            return httpx.Response(200, json={"id": path.rsplit("/", 1)[1], "state": "cancelled"})
        if self.interrupt_wait and path.endswith("/wait"):
            raise KeyboardInterrupt  # as if Ctrl-C arrived inside httpx's read
        if self.interrupt_submit and method == "POST" and path == "/v1/jobs":
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the submit waits for its answer
        return super().__call__(request)


@pytest.fixture
def fake() -> LeasingScheduler:
    return LeasingScheduler()


@pytest.fixture
def remote(fake: LeasingScheduler) -> Any:
    s = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), reconnect_s=1.0, poll_s=0.01)
    s.keeper.batch_s = 0.0
    yield s
    s.close()


def _eventually(cond: Any, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.01)


def test_a_job_is_released_once_its_results_are_read(remote: RemoteSession, fake: LeasingScheduler) -> None:
    x = tp.Tensor.from_array(np.arange(6, dtype=np.float32))
    with use_session(remote):
        got = (x * 2).numpy()
    np.testing.assert_array_equal(got, np.arange(6) * 2)
    job = remote.last_job
    _eventually(lambda: f"/v1/jobs/{job}" in fake.deleted)
    assert all(sid == "s-0" for _, sid in fake.tagged) and len(fake.tagged) == 2  # upload + job


def test_an_upload_is_released_when_its_tensor_dies(remote: RemoteSession, fake: LeasingScheduler) -> None:
    t = tp.Tensor.from_array(np.ones((4, 4), np.float32))
    with use_session(remote):
        (t + 1).numpy()
        (t + 2).numpy()  # the same value: not uploaded again
    uploads = list(fake.tensors)
    assert len(uploads) == 1
    remote.keeper.flush()
    assert not any(p.startswith("/v1/tensors/") for p in fake.deleted)  # still alive
    del t
    gc.collect()
    _eventually(lambda: f"/v1/tensors/{uploads[0]}" in fake.deleted)


def test_an_edited_array_uploaded_again_releases_its_old_upload() -> None:
    released: list[str] = []
    uploads = Uploads(released.append)
    arr = np.ones(3, np.float32)  # writable: keyed by its bytes too
    uploads.put(arr, "u-1")
    arr[0] = 5.0
    assert uploads.get(arr) is None  # stale: sent again
    uploads.put(arr, "u-2")
    assert released == ["u-1"]
    del arr
    gc.collect()
    assert released == ["u-1", "u-2"]


def test_disconnect_ends_the_lease_and_goes_back_to_embedded(fake: LeasingScheduler) -> None:
    s = tp.connect(URL, TOKEN, transport=httpx.MockTransport(fake), reconnect_s=1.0, poll_s=0.01)
    try:
        (tp.Tensor.from_array(np.ones(2, np.float32)) + 1).numpy()
        sid = s.session_id
        assert sid is not None
        tp.disconnect()
        assert f"/v1/sessions/{sid}" in fake.deleted
        assert not isinstance(current_session(), RemoteSession)
        tp.disconnect()  # idempotent, and a no-op when not connected
    finally:
        set_default_session(None)
        s.close()


def test_the_heartbeat_renews_the_lease(fake: LeasingScheduler) -> None:
    fake.ttl_s = 0.3  # renewed every 0.1 s
    with RemoteSession(URL, TOKEN, httpx.MockTransport(fake), poll_s=0.01) as s, use_session(s):
        (tp.Tensor.from_array(np.ones(2, np.float32)) + 1).numpy()
        _eventually(lambda: fake.sessions.get("s-0", 0) >= 2)


def test_an_expired_lease_forgets_uploads_and_opens_a_new_one(fake: LeasingScheduler) -> None:
    fake.ttl_s = 0.3
    with RemoteSession(URL, TOKEN, httpx.MockTransport(fake), poll_s=0.01) as s, use_session(s):
        t = tp.Tensor.from_array(np.ones(2, np.float32))
        (t + 1).numpy()
        fake.sessions.clear()  # the scheduler forgot it (the client slept past its TTL)
        _eventually(lambda: s.session_id is None)
        (t + 1).numpy()
        assert len(fake.tensors) == 2  # uploaded again, under the new lease
        assert fake.tagged[-1][1] == "s-1"


def test_ctrl_c_cancels_the_job_and_raises_a_plain_keyboard_interrupt(
        remote: RemoteSession, fake: LeasingScheduler) -> None:
    fake.interrupt_wait = True
    fake.running_polls = 1  # still running when the submit's wait_s ends
    with use_session(remote), pytest.raises(KeyboardInterrupt) as info:
        (tp.Tensor.from_array(np.ones(2, np.float32)) + 1).numpy()
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no httpx chain
    assert f"/v1/jobs/{remote.last_job}" in fake.deleted


def test_ctrl_c_during_a_submit_is_held_until_its_answer_names_the_job_to_cancel(
        remote: RemoteSession, fake: LeasingScheduler) -> None:
    """On the main thread a Ctrl-C during the submit is held (no helper thread): the answer
    comes, its job is cancelled, then a plain KeyboardInterrupt; SIGINT is restored."""
    fake.interrupt_submit = True
    with use_session(remote), pytest.raises(KeyboardInterrupt) as info:
        (tp.Tensor.from_array(np.ones(2, np.float32)) + 1).numpy()
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert [p for p in fake.deleted if p.startswith("/v1/jobs/")] == [f"/v1/jobs/{j}" for j in fake.jobs]
    assert remote._submitter is None  # no helper thread was needed
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_while_one_is_held_raises_at_once() -> None:
    from triplane.sdk.lifecycle import deferred_interrupt

    with pytest.raises(KeyboardInterrupt), deferred_interrupt() as held:
        assert held is not None
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert held.pressed
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1.0)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(deferred_interrupt().__enter__()))
    t.start()
    t.join()
    assert result == [None]  # off the main thread nothing is held


def test_a_stopped_cluster_fails_fast_with_the_clear_message() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    s = RemoteSession(f"http://127.0.0.1:{port}", TOKEN)
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=r"cannot reach the scheduler .* Is the cluster up"):
        s.nodes()
    assert time.monotonic() - t0 < 6.0  # bounded retry (3 s), not a 30 s hang
    s.close()


def test_an_old_scheduler_without_leases_still_works() -> None:
    fake = FakeScheduler()  # answers 404 to POST /v1/sessions
    with RemoteSession(URL, TOKEN, httpx.MockTransport(fake), poll_s=0.01) as s, use_session(s):
        got = (tp.Tensor.from_array(np.ones(2, np.float32)) + 1).numpy()
        assert s.session_id is None
    np.testing.assert_array_equal(got, [2, 2])


def test_progress_is_off_when_asked_or_not_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

        def write(self, s: str) -> int:
            return len(s)

        def flush(self) -> None:
            pass

    monkeypatch.setattr("sys.stderr", Tty())
    assert lifecycle.progress_enabled()
    tp.set_progress(False)
    try:
        assert not lifecycle.progress_enabled()
    finally:
        tp.set_progress(True)
    monkeypatch.setattr("sys.stderr", open(__file__))  # noqa: SIM115 - a file is no TTY
    assert not lifecycle.progress_enabled()


def test_the_bar_shows_tasks_after_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "progress_enabled", lambda: True)
    bar = lifecycle.ProgressBar("j1")
    bar.update({"done": 1, "total": 4})
    assert bar._bar is None  # not within the first second
    bar.start -= lifecycle.DELAY_S
    bar.update({"done": 2, "total": 4})
    try:
        task = bar._bar.tasks[0]
        assert (task.completed, task.total) == (2, 4)
    finally:
        bar.close()


def test_closing_with_a_lease_ends_it_in_one_request(fake: LeasingScheduler) -> None:
    s = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), poll_s=0.01)
    s.keeper.batch_s = 60.0  # the thread never gets to send: close must do it
    with use_session(s):
        (tp.Tensor.from_array(np.ones(2, np.float32)) + 1).numpy()
    s.close()
    assert fake.deleted == ["/v1/sessions/s-0"]  # the queued job release went with the lease


def test_closing_against_a_dead_scheduler_does_not_retry_each_value() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    s = RemoteSession(URL, TOKEN, httpx.MockTransport(down), reconnect_s=0.5, lease=False)
    for i in range(50):
        s.keeper._queue.append(("tensors", f"u-{i}"))
    t0 = time.monotonic()
    s.close()
    assert time.monotonic() - t0 < 3.0  # one bounded retry, not 50


def test_the_keeper_leaves_releases_to_a_submit_for_carry_s_then_sends_them() -> None:
    """Job and upload releases wait up to ``carry_s`` for a submit to take them (``take``);
    past that they go from the keeper's thread; ``flush`` sends all; with ``carry_s`` 0
    they go at once."""
    from triplane.sdk.lifecycle import Keeper

    sent: list[tuple[str, str]] = []
    keeper = Keeper(lambda kind, ident: sent.append((kind, ident)), lambda: None, batch_s=0.0)
    keeper.carry_s = 0.5
    try:
        keeper.queue("jobs", "j1")
        keeper.queue("tensors", "u-1")
        keeper.queue("jobs", "j2")
        time.sleep(0.2)
        assert sent == []  # they wait for a submit
        assert keeper.take(2) == [("jobs", "j1"), ("tensors", "u-1")]  # a submit carries them
        keeper.put_back([("tensors", "u-1")])  # ... that failed: u-1 waits again
        deadline = time.monotonic() + 5.0
        while len(sent) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sent == [("jobs", "j2"), ("tensors", "u-1")]  # waited long enough: sent
        assert keeper.take(10) == []
        keeper.carry_s = 60.0
        keeper.queue("jobs", "j3")
        keeper.flush()
        assert sent[-1] == ("jobs", "j3")  # an explicit flush sends everything
        keeper.carry_s = 0.0
        keeper.queue("tensors", "u-2")
        deadline = time.monotonic() + 5.0
        while ("tensors", "u-2") not in sent and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sent[-1] == ("tensors", "u-2")
    finally:
        keeper.close()
