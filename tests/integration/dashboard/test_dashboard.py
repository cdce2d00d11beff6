"""The dashboard end to end (issue 17): headless Chromium against a live cluster of two
executors. Every page loads with no console error (screenshots at 1280 and 390 px, light
and dark); a job submitted meanwhile appears and finishes without a reload; its timeline
exports as a Chrome trace; cancel from the page stops a running job; a read token sees no
cancel button and the API refuses it anyway; the token is in no URL and not in the page; an
executor SIGKILLed mid-job turns red and the job's drifts list the node it left."""

from __future__ import annotations

import inspect
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from dash_helpers import Page, chains, client, persisted_job, wait_state

import triplane as tp
from triplane.launcher import LocalCluster
from triplane.proto.errors import KernelError
from triplane.scheduler.api.static import CSP
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session

PAGES = ("overview", "network", "storage", "ops")


def test_the_files_are_served_with_a_strict_csp(cluster: LocalCluster) -> None:
    for path, kind in (("/", "text/html"), ("/dashboard/app.js", "text/javascript"),
                       ("/dashboard/style.css", "text/css")):
        r = httpx.get(cluster.url + path, timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), path
        assert r.headers["content-security-policy"] == CSP and "'unsafe-inline'" not in CSP
        assert r.headers["x-content-type-options"] == "nosniff"
    for bad in ("/dashboard/../api/static.py", "/dashboard/%2e%2e/__init__.py", "/dashboard/nope.js",
                "/dashboard/"):
        assert httpx.get(cluster.url + bad, timeout=10).status_code == 404, bad


def test_every_page_loads_without_console_errors(cluster: LocalCluster, browser: Any, shots: Path) -> None:
    h = client(cluster.url, cluster.token)
    job = chains(h, chains=2, depth=3, name="shown")
    assert wait_state(h, job, ("done",))["state"] == "done"
    for width, scheme in ((1280, "light"), (390, "dark"), (1280, "dark"), (390, "light")):
        tab = Page(browser, cluster.url, cluster.token, width=width, scheme=scheme)
        try:
            for name in (*PAGES, f"job/{job}"):
                tab.go(f"#/{name}")
                tab.page.wait_for_selector("h1")
                tab.page.wait_for_function(
                    "() => !document.querySelector('main').textContent.includes('loading…')", timeout=15000)
                if name.startswith("job/"):
                    tab.page.wait_for_selector(".dag svg g.node")
                shot = shots / f"{name.split('/')[0]}-{width}-{scheme}.png"
                tab.page.screenshot(path=str(shot), full_page=True)
                assert not tab.page.query_selector("main .error"), (name, tab.page.inner_text("main")[:500])
            assert tab.errors == [], tab.errors
            html = tab.page.content()
            assert cluster.token not in html
            assert not [u for u in tab.urls if cluster.token in u]
            assert all(u.startswith(cluster.url) for u in tab.urls), "a request left the scheduler's origin"
            wide = tab.page.evaluate("document.documentElement.scrollWidth")
            assert wide <= width + 1, f"the page is {wide} px wide at {width} px"
        finally:
            tab.close()
    logs = [p.read_text(errors="replace") for p in cluster.run.logs.glob("*.log")]
    assert logs and not [text for text in logs if cluster.token in text], "the token is in a log"
    print(f"\nscreenshots in {shots}")


def test_a_submitted_job_appears_and_finishes_live(cluster: LocalCluster, browser: Any) -> None:
    h = client(cluster.url, cluster.token)
    tab = Page(browser, cluster.url, cluster.token)
    try:
        tab.page.evaluate("window.__stay = 1")  # gone if the page reloads
        job = chains(h, chains=8, depth=12, width=512, name="live-one")
        link = tab.page.wait_for_selector(f"a[href='#/job/{job}']", timeout=15000)
        link.click()
        tab.page.wait_for_selector("#job-state .s-done", timeout=60000)
        assert tab.page.evaluate("window.__stay") == 1
        assert tab.page.evaluate("window.__tp.events") > 0
        total = h.get(f"/v1/jobs/{job}").json()["progress"]["total"]
        tab.page.wait_for_function(
            f"() => document.querySelector('#job-progress').textContent.includes('{total}/{total}')")
        timeline = h.get(f"/v1/jobs/{job}/timeline", params={"buckets": 50}).json()
        assert sum(sum(n["tasks"]) for n in timeline["nodes"]) == timeline["rows"] == total
        with tab.page.expect_download() as dl:
            tab.page.click("text=export Chrome trace")
        trace = json.loads(Path(dl.value.path()).read_text())
        assert len([e for e in trace["traceEvents"] if e["ph"] == "X"]) == total
        info = ".toolbar .muted"  # the timeline's line: "<n> task(s) in this window of <span>"
        shows_all = f"() => document.querySelector('{info}').textContent.startsWith('{total} task')"
        tab.page.wait_for_function(shows_all)
        before = tab.page.inner_text(info)
        tab.page.focus(".gantt canvas")  # keyboard zoom: = (or +) halves the window
        tab.page.keyboard.press("=")
        changed = f"b => document.querySelector('{info}').textContent !== b"
        tab.page.wait_for_function(changed, arg=before)
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_cancel_from_the_page_and_a_read_token_sees_no_button(cluster: LocalCluster, browser: Any) -> None:
    h = client(cluster.url, cluster.token)
    r = h.post("/v1/tokens", json={"name": "viewer", "role": "read"})
    assert r.status_code == 201, r.text
    viewer = r.json()["token"]
    job = chains(h, chains=8, depth=80, width=1024)  # runs for many seconds: cancelled long before its end
    assert wait_state(h, job, ("running",), 30)["state"] == "running"
    reader = Page(browser, cluster.url, viewer)
    try:
        reader.go(f"#/job/{job}")
        reader.page.wait_for_selector("#job-state .s-running")
        assert reader.page.query_selector("#cancel") is None
        refused = client(cluster.url, viewer).post(f"/v1/jobs/{job}/cancel")
        assert refused.status_code == 403 and refused.json()["error"]["kind"] == "forbidden"
    finally:
        reader.close()
    tab = Page(browser, cluster.url, cluster.token)
    try:
        tab.go(f"#/job/{job}")
        tab.page.click("#cancel", timeout=15000)
        tab.page.wait_for_selector("#job-state .s-cancelled", timeout=15000)
        body = wait_state(h, job, ("cancelled",), 15)
        assert body["state"] == "cancelled" and body["progress"]["done"] < body["progress"]["total"]
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_the_overview_shows_each_nodes_lease_and_storage_its_persisted_bytes(
        cluster: LocalCluster, browser: Any) -> None:
    h = client(cluster.url, cluster.token)
    nodes = h.get("/v1/nodes").json()["items"]
    assert len(nodes) == 2
    for n in nodes:  # executors renew their 5 s lease every third of it
        lease = n["lease"]
        assert n["health"] == "up" and lease["ttl_s"] >= 5, n
        assert 0 <= lease["age_s"] <= lease["ttl_s"] * 2 / 3
        assert lease["left_s"] == pytest.approx(lease["ttl_s"] - lease["age_s"])
    job = persisted_job(h)
    assert wait_state(h, job, ("done",))["state"] == "done"
    tasks = h.get(f"/v1/jobs/{job}/tasks").json()["items"]
    want = len(tasks) * 64 * 64 * 4  # each task writes its one 64x64 float32 tile (fused: one task)
    deadline = time.monotonic() + 10
    while True:  # executors publish their counters every second
        engines = h.get("/v1/storage").json()["engines"]
        persisted = sum(e["persisted"]["bytes"] for e in engines)
        if persisted >= want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert persisted == want and all(e["spill"] is not None for e in engines), engines
    tab = Page(browser, cluster.url, cluster.token)
    try:
        for n in nodes:
            tab.page.wait_for_selector(f"tr[data-node='{n['node']}'] .lease")
            text = tab.page.inner_text(f"tr[data-node='{n['node']}'] .lease")
            assert re.fullmatch(r"\d+\.\d s ago", text), text
        tab.go("#/storage")
        tab.page.wait_for_selector("[data-persisted]")
        shown = tab.page.eval_on_selector_all("[data-persisted]", "els => els.map(e => +e.dataset.persisted)")
        assert sum(shown) == want and len(shown) == len(engines)
        spilled = tab.page.eval_on_selector_all("[data-spilled]", "els => els.map(e => +e.dataset.spilled)")
        engines.sort(key=lambda e: (e["node"], e["engine"]))  # as the page lists them
        assert spilled == [e["spill"]["bytes"] for e in engines]
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_a_failed_tasks_source_line_is_in_the_api_and_on_the_job_page(
        cluster: LocalCluster, browser: Any) -> None:
    with RemoteSession(cluster.url, cluster.token) as remote, use_session(remote):
        x = tp.Tensor.from_array(np.array([1.0, 2.0]))
        idx = tp.Tensor.from_array(np.array([0, 7]))
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        bad = tp.gather(x, idx, axis=0)  # index 7 is out of range: the kernel raises on an executor
        with pytest.raises(KernelError):
            bad.numpy()
        job = remote.last_job
    loc = f"{__file__}:{line}"
    h = client(cluster.url, cluster.token)
    error = h.get(f"/v1/jobs/{job}").json()["error"]
    assert error["op"] == "gather" and error["loc"] == loc, error
    deadline = time.monotonic() + 10
    while True:  # the journal writes the failed task's row a moment after the job's end
        failed = [t for t in h.get(f"/v1/jobs/{job}/tasks").json()["items"] if t["error"]]
        if failed or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert failed and failed[0]["error"]["loc"] == loc and failed[0]["error"]["node"] == error["node"], failed
    tab = Page(browser, cluster.url, cluster.token)
    try:
        tab.go(f"#/job/{job}")
        assert tab.page.wait_for_selector("div.error .loc code").inner_text() == loc
        tab.page.wait_for_selector(f"td .error:has-text('{Path(__file__).name}:{line}')")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_a_sigkilled_executor_turns_red_and_its_tasks_drift(cluster: LocalCluster, browser: Any) -> None:
    """Last in the module: it leaves the cluster one executor short."""
    h = client(cluster.url, cluster.token)
    tab = Page(browser, cluster.url, cluster.token)
    try:
        tab.page.wait_for_selector("tr[data-node='executor-0']:not(.down)")
        job = chains(h, chains=8, depth=30, width=1024)
        wait_state(h, job, ("running",), 30)
        cluster.kill_executor(0)
        tab.page.wait_for_selector("tr[data-node='executor-0'].down .s-down", timeout=60000)
        assert wait_state(h, job, ("done", "failed"), 90)["state"] == "done"
        tab.go(f"#/job/{job}")
        cell = tab.page.wait_for_selector("#drifts td:has-text('executor-0')", timeout=15000)
        assert cell is not None
        assert tab.errors == [], tab.errors
    finally:
        tab.close()
