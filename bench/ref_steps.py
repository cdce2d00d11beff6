"""One training-like step on a local cluster, two ways (docs/runtime.md, "Refs"):

    python bench/ref_steps.py [--steps 100] [--rounds 3] [--shape 128,64]

* **upload**: upload the parameter, submit the compiled step, long-poll it, fetch the
  result, release the job and the upload (5 requests a step);
* **ref + wait**: a compiled step binding the previous step's output by ref, with
  ``wait_s`` and ``inline`` (the result comes back in the answer), then release the
  previous job (2 requests a step).

The step adds a constant to the parameter (one task: what is measured is the round trip,
not the kernel). Rounds alternate the two ways; prints ms/step per round. Prints only.
"""

from __future__ import annotations

import argparse
import base64
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from triplane.launcher import ClusterConfig, LocalCluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", default="128,64")
    a = ap.parse_args()
    shape = [int(d) for d in a.shape.split(",")]
    cluster = LocalCluster(Path(tempfile.mkdtemp()), ClusterConfig(executors=2, memory="256MiB"))
    cluster.start()
    try:
        with httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.token}"},
                          timeout=60.0) as h:
            run(h, shape, a.steps, a.rounds)
    finally:
        cluster.stop(grace_s=2.0)


def run(h: httpx.Client, shape: list[int], steps: int, rounds: int) -> None:
    def upload(arr: np.ndarray) -> str:
        r = h.post("/v1/tensors", content=arr.tobytes(),
                   headers={"X-Triplane-Shape": ",".join(map(str, arr.shape)), "X-Triplane-Dtype": "float32"})
        return str(r.raise_for_status().json()["id"])

    def inp(t: str) -> dict[str, Any]:
        return {"op": "input", "shape": shape, "dtype": "float32",
                "attrs": {"tensor": t, "shape": shape, "dtype": "float32"}}

    uc, up = upload(np.full(shape, 0.5, np.float32)), upload(np.ones(shape, np.float32))
    add = {"op": "add", "inputs": ["p", "c"], "shape": shape, "dtype": "float32"}
    graph = {"version": 1, "outputs": ["z"], "nodes": {"p": inp(up), "c": inp(uc), "z": add}}
    first = h.post("/v1/jobs", json={"graph": graph, "fetch": ["z"], "wait_s": 30}).raise_for_status().json()
    plan, at = first["plan"], first["args"].index(up)
    prev = first["id"]

    def bound(param: str) -> list[str]:
        args = [uc] * len(first["args"])
        args[at] = param
        return args

    def by_upload(val: np.ndarray) -> np.ndarray:
        u = upload(val)
        job = h.post("/v1/jobs", json={"plan": plan, "args": bound(u), "fetch": ["z"]}).json()["id"]
        h.get(f"/v1/jobs/{job}/wait", params={"timeout": 30})
        data = h.get(f"/v1/jobs/{job}/tensors/z").content
        h.delete(f"/v1/jobs/{job}")
        h.delete(f"/v1/tensors/{u}")
        return np.frombuffer(data, np.float32).reshape(shape)

    def by_ref() -> bytes:
        nonlocal prev
        body = h.post("/v1/jobs", json={"plan": plan, "args": bound(f"{prev}:z"), "fetch": ["z"],
                                        "wait_s": 30, "inline": ["z"]}).json()
        h.delete(f"/v1/jobs/{prev}")
        prev = body["id"]
        return base64.b64decode(body["values"]["z"]["data"])

    val = np.ones(shape, np.float32)
    for r in range(rounds):
        t = time.perf_counter()
        for _ in range(steps):
            val = by_upload(val)
        upload_ms = (time.perf_counter() - t) / steps * 1e3
        t = time.perf_counter()
        for _ in range(steps):
            by_ref()
        ref_ms = (time.perf_counter() - t) / steps * 1e3
        print(f"round {r}: upload {upload_ms:.1f} ms/step, ref + wait {ref_ms:.1f} ms/step")


if __name__ == "__main__":
    main()
