"""GET / and /playground/{file}: the browser playground, static files shipped in the package.

Plain HTML, CSS and JavaScript from `omni_actors/playground/` (no build step, no CDN);
the page reads `/v1/models` and `/v1/status` and talks to the same public API any
client uses. Only the files listed in ASSETS are served, read once at start.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

ASSETS = {
    "index.html": "text/html",
    "style.css": "text/css",
    "app.js": "text/javascript",
    "pipeline.js": "text/javascript",
    "talk.js": "text/javascript",
    "panels.js": "text/javascript",
    "chat.js": "text/javascript",
    "speak.js": "text/javascript",
    "voices.js": "text/javascript",
    "record.js": "text/javascript",
    "images.js": "text/javascript",
    "videos.js": "text/javascript",
    "transcribe.js": "text/javascript",
    "sse.js": "text/javascript",
    "work.js": "text/javascript",
    "audio.js": "text/javascript",
    "capture-worklet.js": "text/javascript",
}
PAGE_KEY = web.AppKey("playground_files", dict)
CACHE_CONTROL = "no-cache"
CSP = (
    "default-src 'self'; connect-src 'self' ws: wss:; media-src 'self' blob: data:; "
    "img-src 'self' blob: data:; script-src 'self'; style-src 'self'"
)
"""Everything from this server, nothing from anywhere else."""


def _load() -> dict[str, bytes]:
    root = resources.files("omni_actors") / "playground"
    return {name: (root / name).read_bytes() for name in ASSETS}


def _file_response(files: dict[str, bytes], name: str) -> web.Response:
    return web.Response(
        body=files[name], content_type=ASSETS[name],
        headers={"Cache-Control": CACHE_CONTROL, "Content-Security-Policy": CSP,
                 "X-Content-Type-Options": "nosniff"},
    )


async def index(request: web.Request) -> web.Response:
    return _file_response(request.app[PAGE_KEY], "index.html")


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return _file_response(request.app[PAGE_KEY], name)


def add_routes(app: web.Application) -> None:
    app[PAGE_KEY] = _load()
    app.router.add_get("/", index)
    app.router.add_get("/playground/{name}", asset)
