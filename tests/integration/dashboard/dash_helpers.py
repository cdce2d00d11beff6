"""What the dashboard tests share: a signed-in page that records console errors and the
requests it makes, and jobs submitted over the REST API."""

from __future__ import annotations

import time
from typing import Any

import httpx
import numpy as np


class Page:
    """A browser tab on the dashboard, signed in with ``token``; ``errors`` collects console
    errors and page errors, ``urls`` every URL it requested."""

    def __init__(self, browser: Any, url: str, token: str, *, width: int = 1280, height: int = 900,
                 scheme: str = "light") -> None:
        self.ctx = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme)
        self.page = self.ctx.new_page()
        self.errors: list[str] = []
        self.urls: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.urls.append(r.url))
        self.page.goto(url + "/")
        self.page.fill("#token-input", token)
        self.page.press("#token-input", "Enter")
        self.page.wait_for_selector("#conn[data-state=live]", timeout=15000)

    def go(self, hash_: str) -> None:
        self.page.evaluate("h => { location.hash = h; }", hash_)

    def close(self) -> None:
        self.ctx.close()


def client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0)


def upload(h: httpx.Client, a: np.ndarray) -> str:
    r = h.post("/v1/tensors", content=a.tobytes(), headers={
        "X-Triplane-Shape": ",".join(map(str, a.shape)), "X-Triplane-Dtype": str(a.dtype)})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def chains(h: httpx.Client, chains: int = 8, depth: int = 12, width: int = 384,
           name: str | None = None) -> str:
    """Submit ``chains`` independent chains of ``depth`` matmul+tanh steps (a job of a few
    hundred tasks that runs for seconds on two executors); its id."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    ux, uw = upload(h, x), upload(h, x.T.copy())
    t = {"shape": [width, width], "dtype": "float32"}
    nodes: dict[str, dict] = {"x": {"op": "input", **t, "attrs": {"tensor": ux, **t}},
                              "w": {"op": "input", **t, "attrs": {"tensor": uw, **t}}}
    outs = []
    for c in range(chains):
        prev = "x"
        for d in range(depth):
            nodes[f"m{c}_{d}"] = {"op": "matmul", "inputs": [prev, "w"], **t}
            nodes[f"h{c}_{d}"] = {"op": "tanh", "inputs": [f"m{c}_{d}"], **t}
            prev = f"h{c}_{d}"
        outs.append(prev)
    body: dict[str, Any] = {"graph": {"version": 1, "nodes": nodes, "outputs": outs}}
    if name:
        body["name"] = name
    r = h.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def persisted_job(h: httpx.Client) -> str:
    """Submit a job of 64x64 float32 elementwise ops whose tiles persist to the cluster's
    file target; its id."""
    t = {"shape": [64, 64], "dtype": "float32"}
    nodes = {"x": {"op": "full", **t, "attrs": {"value": 0.5, **t}},
             "y": {"op": "exp", "inputs": ["x"], **t}, "z": {"op": "tanh", "inputs": ["y"], **t},
             "w": {"op": "add", "inputs": ["y", "z"], **t}}
    graph = {"version": 1, "nodes": nodes, "outputs": ["w"]}
    r = h.post("/v1/jobs", json={"graph": graph, "persist": "file"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def wait_state(h: httpx.Client, job: str, states: tuple[str, ...], timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        body = h.get(f"/v1/jobs/{job}").json()
        if body["state"] in states or time.monotonic() > deadline:
            return body
        time.sleep(0.1)
