"""The dashboard end to end (issue 17): headless Chromium against a live cluster of two
executors. Every page loads with no console error (screenshots at 1280 and 390 px, light
and dark); a job submitted meanwhile appears and finishes without a reload; its timeline
exports as a Chrome trace; cancel from the page stops a running job; a read token sees no
cancel button and the API refuses it anyway; the token is in no URL and not in the page; an
executor SIGKILLed mid-job turns red and the job's drifts list the node it left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from dash_helpers import Page, chains, client, wait_state

from triplane.launcher import LocalCluster
from triplane.scheduler.api.static import CSP

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
