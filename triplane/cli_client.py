"""The ``triplane`` command's client of the scheduler's REST API (docs/runtime.md, docs/cli.md).

A small synchronous httpx client over the admin routes: jobs, tasks, nodes, drain, tokens,
events (a page, or the live server-sent event stream). It finds the cluster as
``tp.connect()`` does: ``--url``/``--token``, else ``TRIPLANE_URL``/``TRIPLANE_TOKEN``,
else the run directory of ``triplane up`` (its ``cluster.json`` and ``token``).

Every failure is a :class:`CliError` whose message says what was wrong and what to do: no
cluster found, nothing answering at the URL, a refused token (401), a role that may not
(403), an unknown job or node (404, with the scheduler's message), any other error status
with its kind. The commands print it on one line, without a traceback, and exit 1.

List routes answer a page ``{"items": [...], "next": cursor | null}``; a scheduler that
answers a bare list (before pages) is read as one page with no next.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx

__all__ = ["AdminClient", "CliError", "NotServed", "Page", "connect_admin"]

TERMINAL = frozenset({"done", "failed", "cancelled"})


class CliError(Exception):
    """A failure the command reports as one line (no traceback) and exits with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class NotServed(CliError):
    """The scheduler does not serve the route at all (404/405 from the router, not from a
    handler): a scheduler older than this command."""


class Page(NamedTuple):
    """One page of a listing: ``{"items": [...], "next": cursor | None}``."""

    items: list[dict[str, Any]]
    next: str | None


def connect_admin(home: Path | None = None, url: str | None = None, token: str | None = None,
                  timeout_s: float = 30.0) -> AdminClient:
    """The client of the cluster to use: arguments, environment, then the run directory.
    Raises CliError naming every place looked at when none gives a URL."""
    from triplane.launcher import RunDir
    from triplane.launcher.cluster import live_cluster

    url = url or os.environ.get("TRIPLANE_URL") or None
    token = token or os.environ.get("TRIPLANE_TOKEN") or None
    if url is None:
        run = RunDir(home)
        info = live_cluster(run)
        if info is None:
            raise CliError(f"no cluster is running from {run.path} (start one with `triplane up`, "
                           "or set TRIPLANE_URL and TRIPLANE_TOKEN, or pass --url and --token)")
        url = str(info["url"])
        token = token or run.read_token()
    return AdminClient(url, token, timeout_s=timeout_s)


class AdminClient:
    """Requests to one scheduler with a bearer token; see the module docstring for errors."""

    def __init__(self, url: str, token: str | None, *, timeout_s: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the one request path ------------------------------------------------------------

    def request(self, method: str, path: str, *, params: Any = None, body: Any = None,
                what: str | None = None, timeout_s: float | None = None) -> Any:
        """The JSON answer of ``method path``; CliError for any failure (``what`` names the
        thing a 404 is about, e.g. "job 'j12'")."""
        kw: dict[str, Any] = {"params": params}
        if body is not None:
            kw["content"] = json.dumps(body).encode()
            kw["headers"] = {"Content-Type": "application/json"}
        if timeout_s is not None:
            kw["timeout"] = timeout_s
        try:
            r = self.http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise self._unreachable(e) from None
        return self._answer(r, what)

    def _unreachable(self, e: httpx.TransportError) -> CliError:
        if isinstance(e, httpx.TimeoutException):
            return CliError(f"the scheduler at {self.url} did not answer in time ({type(e).__name__})")
        return CliError(f"no scheduler answers at {self.url} ({e or type(e).__name__}): is the cluster "
                        "running? (`triplane up` starts one; `triplane status` shows it)")

    def _answer(self, r: httpx.Response, what: str | None) -> Any:
        if r.status_code < 400:
            if not r.content:
                return {}
            try:
                return r.json()
            except ValueError:
                raise CliError(f"{r.request.method} {r.request.url.path} answered {r.status_code} "
                               f"with a body that is not JSON: {r.text[:200]!r}") from None
        err = _error_of(r)
        kind, message = err.get("kind"), str(err.get("message") or "(no message)")
        if r.status_code == 401:
            raise CliError(f"the scheduler at {self.url} refused the token (401 {kind or 'unauthorized'}: "
                           f"{message}); pass --token or set TRIPLANE_TOKEN (each `triplane up` writes a "
                           "new admin token to the run directory's token file)")
        if r.status_code == 403:
            raise CliError(f"the token's role may not do this (403 forbidden: {message})")
        where = f"{r.request.method} {r.request.url.path}"
        if r.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
            raise NotServed(f"the scheduler at {self.url} does not serve {where} (a scheduler older than "
                            "this triplane command?)")
        if r.status_code == 404 and what is not None and not err.get("message"):
            raise CliError(f"unknown {what} (404)")
        raise CliError(f"{message} ({r.status_code}{' ' + kind if kind else ''}, {where})")

    def tensor(self, job: str, name: str) -> tuple[tuple[int, ...], str, bytes]:
        """A fetched tensor of a done job (``GET /v1/jobs/{job}/tensors/{name}``): its shape,
        dtype name and little-endian bytes."""
        path = f"/v1/jobs/{job}/tensors/{name}"
        try:
            r = self.http.get(path)
        except httpx.TransportError as e:
            raise self._unreachable(e) from None
        if r.status_code >= 400:
            self._answer(r, f"tensor {name!r} of job {job!r}")
        try:
            shape = tuple(int(s) for s in r.headers.get("X-Triplane-Shape", "").split(",") if s.strip())
        except ValueError:
            raise CliError(f"{path} came with a bad X-Triplane-Shape header") from None
        return shape, r.headers.get("X-Triplane-Dtype", ""), r.content

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, body=body if body is not None else {}, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)

    # --- pages ---------------------------------------------------------------------------

    def page(self, path: str, params: dict[str, Any] | list[tuple[str, Any]] | None = None,
             **kw: Any) -> Page:
        body = self.get(path, params=_no_nones(params), **kw)
        if isinstance(body, list):  # a route that answers a bare list: one page
            return Page(list(body), None)
        if not isinstance(body, dict) or not isinstance(body.get("items"), list):
            raise CliError(f"GET {path} did not answer a page ({{'items': [...], 'next': ...}}): "
                           f"{str(body)[:200]}")
        return Page(list(body["items"]), body.get("next"))

    def pages(self, path: str, params: list[tuple[str, Any]], most: int | None = None,
              **kw: Any) -> Iterator[dict[str, Any]]:
        """Every item of a listing, following ``next`` (at most ``most`` items)."""
        cursor: str | None = None
        seen = 0
        while True:
            page = self.page(path, [*params, ("cursor", cursor)], **kw)
            for item in page.items:
                if most is not None and seen >= most:
                    return
                seen += 1
                yield item
            cursor = page.next
            if not cursor or not page.items:
                return

    # --- the event stream ----------------------------------------------------------------

    def stream_events(self, params: list[tuple[str, Any]], last_id: int | None = None
                      ) -> Iterator[dict[str, Any]]:
        """The live events (``GET /v1/events`` with ``Accept: text/event-stream``), one dict
        each, until the server closes the stream. ``last_id`` resumes after that event."""
        headers = {"Accept": "text/event-stream"}
        if last_id is not None:
            headers["Last-Event-ID"] = str(last_id)
        try:
            with self.http.stream("GET", "/v1/events", params=_no_nones(params), headers=headers,
                                  timeout=httpx.Timeout(10.0, read=None)) as r:
                if r.status_code >= 400:
                    r.read()
                    self._answer(r, None)
                yield from _sse_events(r.iter_lines())
        except httpx.TransportError as e:
            if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError)):
                return  # the server ended the stream (the caller may resume with the last id)
            raise self._unreachable(e) from None


def _sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Events of a text/event-stream: ``data:`` lines (joined) up to a blank line make one
    event; its ``id:`` is the event id (added as "id" when the data lacks one)."""
    data: list[str] = []
    event_id: str | None = None
    for line in lines:
        if line == "":
            if data:
                try:
                    event = json.loads("\n".join(data))
                except ValueError:
                    event = {"data": "\n".join(data)}
                if isinstance(event, dict):
                    if event_id is not None and "id" not in event:
                        event["id"] = int(event_id) if event_id.isdigit() else event_id
                    yield event
            data, event_id = [], None
        elif line.startswith(":"):
            continue  # a comment: the server's keep-alive
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                data.append(value)
            elif field == "id":
                event_id = value


def _error_of(r: httpx.Response) -> dict[str, Any]:
    try:
        body = r.json()
    except ValueError:
        return {"message": r.text[:300] or r.reason_phrase}
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return err
    if isinstance(body, dict) and "detail" in body:
        return {"message": str(body["detail"])}
    return {"message": str(body)[:300]}


def _no_nones(params: Any) -> Any:
    if isinstance(params, dict):
        return {k: v for k, v in params.items() if v is not None}
    if isinstance(params, list):
        return [(k, v) for k, v in params if v is not None]
    return params
