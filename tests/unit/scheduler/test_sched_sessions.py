"""Client session leases and releases (scheduler/sessions.py, ``DELETE /v1/tensors/{id}``,
``/v1/sessions``): the pure lease table with a stepped clock, and the routes over a
Scheduler that is not started (no sockets, as in test_sched_auth.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from test_sched_auth import Cluster, job_body

from triplane.engines.memory.host import HostMemoryEngine
from triplane.scheduler.errors import Forbidden, NotFound
from triplane.scheduler.residency import Residency
from triplane.scheduler.sessions import Sessions, release_held


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_lease_expires_unless_renewed_and_gives_back_what_it_held() -> None:
    clock = Clock()
    s = Sessions(ttl_s=30.0, clock=clock)
    a, b = s.open("alice"), s.open("bob")
    s.tag_upload(a, "u-1")
    s.tag_job(a, "j1")
    s.tag_upload(b, "u-2")
    clock.now += 20
    s.renew(b.id, "bob")
    clock.now += 15  # a: 35 s unrenewed; b: 15 s since renewal
    (held,) = s.expired()
    assert (held.session, held.uploads, held.jobs) == (a.id, ("u-1",), ("j1",))
    assert a.id not in s and b.id in s
    with pytest.raises(NotFound):
        s.renew(a.id, "alice")


def test_a_lease_is_its_owners_and_released_values_are_untagged() -> None:
    s = Sessions(clock=Clock())
    a = s.open("alice")
    with pytest.raises(Forbidden):
        s.get(a.id, "bob")
    assert s.get(a.id, "admin", admin=True) is a
    s.tag_upload(a, "u-1")
    s.tag_job(a, "j1")
    s.untag_upload("u-1")
    s.untag_job("j1")
    held = s.close(a.id)
    assert held.uploads == () and held.jobs == ()


def test_release_held_goes_on_after_a_failure() -> None:
    s = Sessions(clock=Clock())
    a = s.open("alice")
    for u in ("u-1", "u-2"):
        s.tag_upload(a, u)
    s.tag_job(a, "j1")
    done: list[str] = []

    async def upload(u: str) -> None:
        if u == "u-1":
            raise OSError("disk")
        done.append(u)

    async def job(j: str) -> None:
        done.append(j)

    asyncio.run(release_held(s.close(a.id), upload, job))
    assert done == ["j1", "u-2"]


def test_residency_drop_names_the_holders_of_an_upload() -> None:
    r = Residency()
    r.learn("n1", ["u-a@0:2", "u-b"])
    r.learn("n2", ["u-a@0:2", "u-a@2:4"])
    assert r.drop("u-a") == {"n1": ["u-a@0:2"], "n2": ["u-a@0:2", "u-a@2:4"]}
    assert r.holders("u-a@0:2") == () and len(r) == 1


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


def _session(c: Cluster, who: str = "submit") -> str:
    r = c.client.post("/v1/sessions", headers=c.headers(who))
    assert r.status_code == 201, r.text
    assert r.json()["ttl_s"] == c.scheduler.sessions.ttl_s
    return r.json()["id"]


def _upload(c: Cluster, who: str = "submit", session: str | None = None) -> str:
    headers = {**c.headers(who), "X-Triplane-Shape": "2,2", "X-Triplane-Dtype": "float32"}
    if session:
        headers["X-Triplane-Session"] = session
    r = c.client.post("/v1/tensors", content=np.ones((2, 2), np.float32).tobytes(), headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_delete_tensor_deletes_its_files(cluster: Cluster, tmp_path: Path) -> None:
    u = _upload(cluster)
    files = sorted(p.name for p in (tmp_path / "tensors").iterdir())
    assert files == [f"{u}.json", f"{u}.npy"]
    r = cluster.client.delete(f"/v1/tensors/{u}", headers=cluster.headers("submit"))
    assert r.status_code == 200 and r.json() == {"id": u, "released": True}
    assert list((tmp_path / "tensors").iterdir()) == []
    again = cluster.client.delete(f"/v1/tensors/{u}", headers=cluster.headers("submit"))
    assert again.status_code == 404 and again.json()["error"]["kind"] == "not_found"


def test_an_upload_is_released_by_its_uploader_or_admin_only(cluster: Cluster) -> None:
    u = _upload(cluster, "submit")  # alice's
    for who, status in (("bob", 403), ("read", 403), ("submit", 200)):
        r = cluster.client.delete(f"/v1/tensors/{u}", headers=cluster.headers(who))
        assert r.status_code == status, (who, r.text)
    v = _upload(cluster, "submit")
    assert cluster.client.delete(f"/v1/tensors/{v}", headers=cluster.headers("admin")).status_code == 200
    assert cluster.scheduler.store.get(v) is None


def test_the_owner_survives_a_restart(cluster: Cluster, tmp_path: Path) -> None:
    from triplane.scheduler.store import TensorStore

    u = _upload(cluster, "submit")
    assert TensorStore(tmp_path / "tensors").get(u).owner == "alice"


def test_ending_a_session_releases_its_uploads_and_jobs(cluster: Cluster, tmp_path: Path) -> None:
    c, alice = cluster.client, cluster.headers("submit")
    sid = _session(cluster)
    kept = _upload(cluster)  # not in the session: stays
    u = _upload(cluster, session=sid)
    r = c.post("/v1/jobs", json=job_body(u), headers={**alice, "X-Triplane-Session": sid})
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    assert c.post(f"/v1/sessions/{sid}/renew", headers=cluster.headers("bob")).status_code == 403
    assert c.delete(f"/v1/sessions/{sid}", headers=cluster.headers("bob")).status_code == 403
    r = c.delete(f"/v1/sessions/{sid}", headers=alice)
    assert r.status_code == 200 and r.json() == {"id": sid, "uploads": 1, "jobs": 1}
    assert cluster.scheduler.store.get(u) is None and not (tmp_path / "tensors" / f"{u}.npy").exists()
    assert cluster.scheduler.store.get(kept) is not None
    assert c.get(f"/v1/jobs/{job}", headers=alice).json()["state"] == "cancelled"
    assert c.post(f"/v1/sessions/{sid}/renew", headers=alice).status_code == 404
    # an ended session cannot tag anything any more
    h = {**alice, "X-Triplane-Session": sid, "X-Triplane-Shape": "2,2", "X-Triplane-Dtype": "float32"}
    assert c.post("/v1/tensors", content=bytes(16), headers=h).status_code == 404


def test_an_expired_lease_frees_its_uploads(cluster: Cluster, tmp_path: Path) -> None:
    clock = Clock()
    cluster.scheduler.sessions.clock = clock
    sid = _session(cluster)
    u = _upload(cluster, session=sid)
    clock.now += cluster.scheduler.sessions.ttl_s + 1
    (held,) = cluster.scheduler.sessions.expired()
    asyncio.run(release_held(held, cluster.scheduler.release_upload, cluster.scheduler.jobs.cancel))
    assert not (tmp_path / "tensors" / f"{u}.npy").exists()


def test_memory_full_names_the_holders() -> None:
    mem = HostMemoryEngine(capacity=3 << 20)
    mem.put("j1.t0", np.zeros(1 << 18, np.float32))  # 1 MiB of job j1
    mem.put("j1.t1", np.zeros(1 << 17, np.float32))
    mem.put("u-ab@0:2", np.zeros(1 << 17, np.float32))  # an upload's tile
    with pytest.raises(Exception, match=r"memory full") as info:
        mem.reserve(2 << 20)
    assert "held by: job j1 (1.5 MiB), upload u-ab (0.5 MiB)" in str(info.value)


def test_releasing_an_upload_deletes_its_cache_entries_where_known(cluster: Cluster) -> None:
    from types import SimpleNamespace

    sched = cluster.scheduler
    u = _upload(cluster)
    other = _upload(cluster)
    sched.cluster.residency.learn("n1", [f"{u}@0:1,0:2", other])
    sched.cluster.residency.learn("n2", [f"{u}@1:2,0:2"])
    sched.shell.nodes["n1"] = SimpleNamespace(address="10.0.0.1", data_port=7001)
    sched.shell.nodes["n2"] = SimpleNamespace(address="10.0.0.2", data_port=7002)
    deleted: list[tuple[str, int, list[str]]] = []

    class DataClient:
        async def delete(self, address: str, port: int, tiles: list[str]) -> None:
            deleted.append((address, port, tiles))

    sched.results.data_client = sched.results.releaser.client = DataClient()  # type: ignore[assignment]
    r = cluster.client.delete(f"/v1/tensors/{u}", headers=cluster.headers("submit"))
    assert r.status_code == 200, r.text
    asyncio.run(sched.results.releaser.flush())  # (sent within RELEASE_BATCH_S by its loop)
    assert sorted(deleted) == [("10.0.0.1", 7001, [f"{u}@0:1,0:2"]), ("10.0.0.2", 7002, [f"{u}@1:2,0:2"])]
    assert sched.cluster.residency.holders(other) == ("n1",)  # the other upload stays known
