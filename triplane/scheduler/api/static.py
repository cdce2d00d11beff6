"""The dashboard's files, served at ``/`` (``index.html``) and ``/dashboard/<file>``
(docs/dashboard.md). They are data, not code: plain ES modules, CSS and an SVG shipped as
package data of ``triplane.dashboard`` (``pyproject.toml``), found by path so that the
scheduler imports nothing of the layer above it.

They need no credential: they hold no data and no secret (the page asks for a token and
reads the REST API with it). Every answer carries a strict Content-Security-Policy: scripts,
styles and connections from this origin only, no inline script or style, no frames, no
plugins; so the page can make no request beyond this scheduler. A name outside the folder,
hidden or of an unknown type is a 404.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response

__all__ = ["CSP", "DASHBOARD_DIR", "install_static"]

DASHBOARD_DIR = Path(__file__).resolve().parents[2] / "dashboard" / "static"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}


def _file(name: str, root: Path) -> Response:
    path = (root / name).resolve()
    ok = (path.is_relative_to(root) and path.suffix in TYPES and path.is_file()
          and not any(part.startswith(".") for part in path.relative_to(root).parts))
    if not ok:
        return Response("not found", status_code=404, media_type="text/plain", headers=HEADERS)
    return FileResponse(path, media_type=TYPES[path.suffix], headers=HEADERS)


def install_static(app: FastAPI, root: Path = DASHBOARD_DIR) -> None:
    """``GET /`` and ``GET /dashboard/{name}`` (not in /openapi.json: they are no API)."""
    root = root.resolve()

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return _file("index.html", root)

    @app.get("/dashboard/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:  # one folder: a name holds no '/'
        return _file(name, root)
