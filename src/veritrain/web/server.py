"""`veritrain ui`: a local, read-only run browser (Starlette; GET only but for the Verify button's POST).

Every page is built from the run folders on each request, so new runs appear without a restart.
Requests must name this server in their Host header (a page elsewhere cannot reach it by DNS
rebinding), every response carries a strict Content-Security-Policy, and /files serves only images
and small text files from runs/ and .veritrain/data/ of this workspace. The Verify button POSTs
/api/runs/<id>/verify (with the header `X-Veritrain: verify`, from this server's origin only): it runs
`veritrain verify`'s check in a worker thread, keeps the verdict as the CLI does, and
GET /api/runs/<id>/verdict shows its progress and the kept verdict.

    veritrain ui --workdir . --port 8765
"""

from __future__ import annotations

import json
import mimetypes
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional
from urllib.parse import urlencode

from veritrain.core.errors import RunFailed, VeritrainError
from veritrain.web import STATIC_DIR, environment, page_context, views

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from veritrain.records.workspace import Workspace

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

    def __init__(self, app: ASGIApp, hosts: set[str]):
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1").lower()
        if host not in self.hosts:
            body = b"error: unexpected Host header; open the address `veritrain ui` printed\n"
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS]})
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


VERIFY_HEADER = "x-veritrain"  # the Verify button's POST carries `X-Veritrain: verify`: a page of another origin cannot
VERIFY_HEADER_VALUE = "verify"  # send it without a CORS preflight, which this server never answers


class VerifyJobs:
    """The Verify button's jobs: `veritrain verify`'s check of a run (`verify_and_keep`, the CLI's defaults) in
    one worker thread, off the event loop and one run at a time, with each job's latest progress. Asking for a
    run that is being verified joins its job."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="veritrain-verify")
        self.lock = threading.Lock()
        self.jobs: dict[str, dict[str, Any]] = {}  # run id → its latest job (kept when done: the page reads its result)

    def start(self, run_dir: Path) -> tuple[dict[str, Any], bool]:
        """(the run's job, True when this call started it; False when it joined one queued or running)."""
        from veritrain.records.record import now_iso

        with self.lock:
            job = self.jobs.get(run_dir.name)
            if job is not None and job["state"] in ("queued", "running"):
                return dict(job), False
            job = {"state": "queued", "stage": None, "done": 0, "total": 0, "started_at": now_iso(), "result": None, "error": None}
            self.jobs[run_dir.name] = job
            shown = dict(job)
        self.executor.submit(self._run, run_dir, job)
        return shown, True

    def state(self, run_id: str) -> Optional[dict[str, Any]]:
        with self.lock:
            job = self.jobs.get(run_id)
            return dict(job) if job is not None else None

    def _run(self, run_dir: Path, job: dict[str, Any]) -> None:
        from veritrain.trust.verify import verify_and_keep

        def progress(stage: str, done: int, total: int) -> None:
            with self.lock:
                job.update(stage=stage, done=done, total=total)

        with self.lock:
            job["state"] = "running"
        try:
            result = verify_and_keep(run_dir, self.state_dir, progress=progress)
        except Exception as err:  # a crash of the check (not a finding: those are in the result); the page says it
            with self.lock:
                job.update(state="failed", error=f"{type(err).__name__}: {err}"[:500])
            return
        with self.lock:
            job.update(state="done", result=json.loads(json.dumps({"run_id": run_dir.name, **result}, default=str)))


def cross_site_refusal(headers: Mapping[str, str], origin: str) -> Optional[str]:
    """Why a state-changing request may come from another site's page (one line), or None: it must carry the
    Verify header, and an Origin or Sec-Fetch-Site it sends must say this server's origin."""
    if headers.get(VERIFY_HEADER) != VERIFY_HEADER_VALUE:
        return f"refused: a verify request carries the header `X-Veritrain: {VERIFY_HEADER_VALUE}` (the run page's Verify button sends it)"
    sent = headers.get("origin")
    if sent is not None and sent.lower() != origin.lower():
        return f"refused: a verify request from {sent[:80]}, not from {origin}"
    if headers.get("sec-fetch-site") not in (None, "same-origin", "none"):
        return "refused: a verify request from another site"
    return None


def allowed_hosts(host: str, port: int) -> set[str]:
    names = {"127.0.0.1", "localhost", "[::1]", f"[{host}]" if ":" in host else host}
    return {f"{name}:{port}".lower() for name in names}


async def static(request: Request) -> Response:
    """A file of the packaged static folder (scripts, styles, the chart library), never a path that leaves it."""
    from starlette.responses import FileResponse, PlainTextResponse

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


def api_routes(workspace: Workspace, jobs: VerifyJobs) -> list[Any]:
    """The JSON answers: the runs table's rows, the live table's and a run page's polls, a run's raw values, and
    the Verify button's POST and its verdict."""
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def api_runs(request: Request) -> Response:
        try:
            table = views.runs_table(workspace, dict(request.query_params))
        except VeritrainError as err:
            return JSONResponse({"error": str(err)}, status_code=400)
        return JSONResponse({k: table[k] for k in ("rows", "total", "page", "pages", "page_size", "params", "param_keys", "metrics", "groups")})

    def api_runs_live(request: Request) -> Response:  # in Starlette's thread pool: it stats files
        ids = [r for r in (request.query_params.get("running") or "").split(",") if r][:views.PAGE_SIZE]
        return JSONResponse(views.table_live(workspace, ids))

    def api_run(request: Request) -> Response:  # the raw values the run page shows rounded
        try:
            run = views.run_page(workspace, request.path_params["run_id"], with_check=False)
        except VeritrainError as err:
            return JSONResponse({"error": str(err)}, status_code=404)
        shown = {k: run[k] for k in ("run_id", "status", "kind", "exp_name", "started_at", "ended_at", "seal", "config_hash", "metrics",
                                     "training", "curves", "verdict", "duration")}
        return JSONResponse(json.loads(json.dumps(shown, default=str)))

    def api_run_live(request: Request) -> Response:  # in Starlette's thread pool: it stats and reads the new log lines
        query = request.query_params
        try:
            offsets = [int(query.get(k) or 0) for k in ("metrics", "steps")]
            answer = views.run_live(workspace, request.path_params["run_id"], max(0, offsets[0]), max(0, offsets[1]), query.get("stamp") or "")
        except ValueError:
            return JSONResponse({"error": "metrics and steps are byte offsets"}, status_code=400)
        except VeritrainError as err:
            return JSONResponse({"error": str(err)}, status_code=400)
        return JSONResponse(answer)

    async def verify(request: Request) -> Response:  # POST only: a GET is 405 and starts nothing
        refusal = cross_site_refusal(request.headers, f"{request.url.scheme}://{request.headers.get('host', '')}")
        if refusal is not None:
            return JSONResponse({"error": refusal}, status_code=403)
        try:
            run_dir = views.run_dir_of(workspace, request.path_params["run_id"])
        except VeritrainError as err:
            return JSONResponse({"error": str(err)}, status_code=404)
        job, started = jobs.start(run_dir)
        return JSONResponse({"run_id": run_dir.name, "started": started, "job": job}, status_code=202)

    def verdict(request: Request) -> Response:  # read-only; in Starlette's thread pool: it stats the files the verdict covered
        from veritrain.records import verdicts

        try:
            run_dir = views.run_dir_of(workspace, request.path_params["run_id"])
        except VeritrainError as err:
            return JSONResponse({"error": str(err)}, status_code=404)
        kept = verdicts.latest(run_dir, workspace.state_dir)
        shown = {k: v for k, v in kept.items() if k != "fingerprint"} if kept is not None else None
        return JSONResponse(json.loads(json.dumps({"run_id": run_dir.name, "verdict": shown, "job": jobs.state(run_dir.name)}, default=str)))

    return [
        Route("/api/runs", api_runs),
        Route("/api/live", api_runs_live),
        Route("/api/runs/{run_id}", api_run),
        Route("/api/runs/{run_id}/live", api_run_live),
        Route("/api/runs/{run_id}/verify", verify, methods=["POST"]),
        Route("/api/runs/{run_id}/verdict", verdict),
    ]


def create_app(workspace: Workspace, host: str = "127.0.0.1", port: int = 8765) -> Guard:
    from starlette.applications import Starlette
    from starlette.responses import FileResponse, HTMLResponse, PlainTextResponse
    from starlette.routing import Route

    env = environment()
    jobs = VerifyJobs(workspace.state_dir)

    def render(name: str, depth: int, status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(**page_context(depth, static=False), **context)
        return HTMLResponse(html, status_code=status)

    def error(depth: int, status: int, message: str) -> HTMLResponse:
        return render("error.html", depth, status=status, status_code=status, message=message)

    def link(params: dict[str, str], **changes: Any) -> str:
        merged = {k: v for k, v in {**params, **changes}.items() if v not in ("", None)}
        return "?" + urlencode(merged) if merged else "./"

    async def index(request: Request) -> Response:
        params = dict(request.query_params)
        try:
            table = views.runs_table(workspace, params, fresh=params.get("fresh") == "1")
        except VeritrainError as err:
            return error(0, 400, str(err))
        current = {k: v for k, v in table["params"].items() if v}
        columns = views.table_columns(table)
        sort_links = {}
        for column in columns:
            key = column["key"]
            sort = f"-{key}" if table["params"]["sort"] == key else key  # a second click reverses
            sort_links[key] = link(current, sort=sort, page=None)
        group_links = {g: link(current, group=g if table["params"]["group"] != g else None, page=None) for g in views.GROUPS}
        prev_link = link(current, page=table["page"] - 1 if table["page"] > 2 else None) if table["page"] > 1 else None
        next_link = link(current, page=table["page"] + 1) if table["page"] < table["pages"] else None
        return render("index.html", 0, table=table, columns=columns, sort_links=sort_links, prev_link=prev_link, next_link=next_link,
                      group_links=group_links, filter_link=lambda **f: link({k: v for k, v in current.items() if k in ("cols",)}, **f))

    def run_page(request: Request) -> Response:  # in Starlette's thread pool: it reads the kept verdict's files
        run_id = request.path_params["run_id"]
        try:
            run = views.run_page(workspace, run_id)
        except RunFailed as err:  # the record cannot be read: the run does not verify, and the page says why
            try:
                return render("run_damaged.html", 1, run=views.damaged_page(workspace, run_id, str(err)))
            except VeritrainError as gone:
                return error(1, 404, str(gone))
        except VeritrainError as err:
            return error(1, 404, str(err))
        live = {"run_id": run["run_id"], "status": run["status"], "seal": run["seal"], "stamp": run["stamp"], **run["curves"]["offsets"]}
        return render("run.html", 1, run=run, archive=None, curves_data=run["curves"], live_data=live)

    def sweep_page(request: Request) -> Response:
        try:
            sweep = views.sweep_page(workspace, request.path_params["sweep_id"])
        except VeritrainError as err:
            return error(1, 404, str(err))
        return render("sweep.html", 1, s=sweep, sweep_data=sweep["plot"])

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

    routes = [
        Route("/", index), Route("/index.html", index),
        Route("/runs/{run_id}", run_page),
        Route("/sweeps/{sweep_id}", sweep_page),
        Route("/compare", compare),
        Route("/data/{version}", data_page),
        Route("/experiments", experiments),
        Route("/files/{path:path}", files),
        Route("/static/{path:path}", static),
        *api_routes(workspace, jobs),
    ]
    app = Starlette(routes=routes)
    return Guard(app, allowed_hosts(host, port))


SHUTDOWN_GRACE = 3  # seconds open requests get to finish when `veritrain ui` is asked to stop


def serve(workspace: Workspace, host: str, port: int) -> None:
    import uvicorn

    # SIGTERM stops it: requests still open after SHUTDOWN_GRACE seconds are cut
    uvicorn.run(create_app(workspace, host, port), host=host, port=port, log_level="warning", server_header=False,
                timeout_graceful_shutdown=SHUTDOWN_GRACE)
