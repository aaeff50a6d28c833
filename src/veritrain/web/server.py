"""`veritrain ui`: a local, read-only run browser (Starlette, GET only).

Every page is built from the run folders on each request, so new runs appear without a restart.
Requests must name this server in their Host header (a page elsewhere cannot reach it by DNS
rebinding), every response carries a strict Content-Security-Policy, and /files serves only images
and small text files from runs/ and .veritrain/data/ of this workspace.

    veritrain ui --workdir . --port 8765
"""

from __future__ import annotations

import json
import mimetypes
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from veritrain.errors import VeritrainError
from veritrain.web import STATIC_DIR, environment, page_context, views

SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp"}
TEXT_TYPES = (".csv", ".json", ".jsonl", ".md", ".txt", ".log", ".yaml", ".sha256")
MAX_TEXT_BYTES = 2 * 1024 * 1024  # larger text artifacts are for `veritrain` commands, not a browser tab
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".svg": "image/svg+xml", ".txt": "text/plain"}


class Guard:
    """ASGI middleware: refuse a Host that is not this server (400) and add the security headers."""

    def __init__(self, app: Any, hosts: set[str]):
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1").lower()
        if host not in self.hosts:
            body = b"error: unexpected Host header; open the address `veritrain ui` printed\n"
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS]})
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def allowed_hosts(host: str, port: int) -> set[str]:
    names = {"127.0.0.1", "localhost", "[::1]", f"[{host}]" if ":" in host else host}
    return {f"{name}:{port}".lower() for name in names}


def create_app(workspace: Any, host: str = "127.0.0.1", port: int = 8765) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    env = environment()

    def render(name: str, depth: int, status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(**page_context(depth, static=False), **context)
        return HTMLResponse(html, status_code=status)

    def error(depth: int, status: int, message: str) -> HTMLResponse:
        return render("error.html", depth, status=status, status_code=status, message=message)

    def link(params: dict[str, str], **changes: Any) -> str:
        merged = {k: v for k, v in {**params, **changes}.items() if v not in ("", None)}
        return "?" + urlencode(merged) if merged else "./"

    columns = [("run_id", "run"), ("exp_name", "experiment"), ("kind", "kind"), ("status", "status"), ("started_at", "started"),
               ("data_version", "data"), *((m, m) for m in views.TABLE_METRICS), ("hypothesis", "hypothesis")]

    async def index(request: Request) -> Response:
        params = dict(request.query_params)
        try:
            table = views.runs_table(workspace, params)
        except VeritrainError as err:
            return error(0, 400, str(err))
        current = {k: v for k, v in table["params"].items() if v}
        sort_links = {}
        for key, _ in columns:
            sort = f"-{key}" if table["params"]["sort"] == key else key  # a second click reverses
            sort_links[key] = link(current, sort=sort, page=None)
        prev_link = link(current, page=table["page"] - 1 if table["page"] > 2 else None) if table["page"] > 1 else None
        next_link = link(current, page=table["page"] + 1) if table["page"] < table["pages"] else None
        return render("index.html", 0, table=table, columns=columns, sort_links=sort_links, prev_link=prev_link, next_link=next_link)

    async def api_runs(request: Request) -> Response:
        try:
            table = views.runs_table(workspace, dict(request.query_params))
        except VeritrainError as err:
            return JSONResponse({"error": str(err)}, status_code=400)
        return JSONResponse({k: table[k] for k in ("rows", "total", "page", "pages", "page_size", "params")})

    async def run_page(request: Request) -> Response:
        try:
            run = views.run_page(workspace, request.path_params["run_id"])
        except VeritrainError as err:
            return error(1, 404, str(err))
        return render("run.html", 1, run=run, archive=None, curves_data=run["curves"])

    async def compare(request: Request) -> Response:
        ids = [r for item in request.query_params.getlist("runs") for r in item.split(",")] + request.query_params.getlist("run")
        try:
            cmp = views.compare_page(workspace, [r.strip() for r in ids])
        except VeritrainError as err:
            return error(0, 400 if "give 2 to 6" in str(err) else 404, str(err))
        return render("compare.html", 0, cmp=cmp, curves_data=cmp["curves"])

    async def data_page(request: Request) -> Response:
        try:
            d = views.data_page(workspace, request.path_params["version"])
        except VeritrainError as err:
            return error(1, 404, str(err))
        return render("data.html", 1, d=d)

    async def experiments(request: Request) -> Response:
        return render("experiments.html", 0, exp=views.experiments_page(workspace))

    async def files(request: Request) -> Response:
        path = views.safe_source(workspace.root, request.path_params["path"])
        if path is None:
            return PlainTextResponse("not found\n", status_code=404)
        suffix = path.suffix.lower()
        if suffix in IMAGE_TYPES:
            return FileResponse(path, media_type=IMAGE_TYPES[suffix])
        if suffix in TEXT_TYPES and path.stat().st_size <= MAX_TEXT_BYTES:
            return FileResponse(path, media_type="text/plain; charset=utf-8")
        return PlainTextResponse("not served: only images and small text files\n", status_code=404)

    async def static(request: Request) -> Response:
        rel = request.path_params["path"]
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts) or "\\" in rel:
            return PlainTextResponse("not found\n", status_code=404)
        path = STATIC_DIR / rel
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return PlainTextResponse("not found\n", status_code=404)
        if not real.is_relative_to(STATIC_DIR) or not real.is_file():
            return PlainTextResponse("not found\n", status_code=404)
        media = STATIC_TYPES.get(real.suffix.lower()) or mimetypes.guess_type(real.name)[0] or "application/octet-stream"
        return FileResponse(real, media_type=media)

    async def verify(request: Request) -> Response:
        from veritrain.verify import verify_run

        try:
            run_dir = views.run_dir_of(workspace, request.path_params["run_id"])
        except VeritrainError as err:
            return JSONResponse({"error": str(err)}, status_code=404)
        result = verify_run(run_dir, workspace.state_dir, rehash_data=False)
        return JSONResponse(json.loads(json.dumps({"run_id": run_dir.name, **result}, default=str)))

    routes = [
        Route("/", index), Route("/index.html", index),
        Route("/runs/{run_id}", run_page),
        Route("/compare", compare),
        Route("/data/{version}", data_page),
        Route("/experiments", experiments),
        Route("/files/{path:path}", files),
        Route("/static/{path:path}", static),
        Route("/api/runs", api_runs),
        Route("/api/runs/{run_id}/verify", verify),
    ]
    app = Starlette(routes=routes)
    return Guard(app, allowed_hosts(host, port))


def serve(workspace: Any, host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(create_app(workspace, host, port), host=host, port=port, log_level="warning", server_header=False)
