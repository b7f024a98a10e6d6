"""OpenAI routes this server registers only to say it does not serve them: a 404 naming the route and
what to use instead (`unsupported_endpoint`), not "unknown route", nor the 405 of a route whose
path they match (`/v1/responses/{id}`)."""

from __future__ import annotations

from aiohttp import web

from omni_actors.api.errors import ApiError

NOT_SERVED = {
    "/v1/responses/input_tokens": "counting input tokens apart from a response is not served by this server; "
                                  "a response's `usage.input_tokens` counts its input",
    "/v1/responses/compact": "compacting a conversation is not served by this server; `truncation: \"auto\"` "
                             "drops its oldest items when it outgrows the model's context",
    "/v1/images/variations": "image variations (DALL-E 2's) are not served by this server; edit the image with "
                             "a prompt on /v1/images/edits",
}
"""POST path -> why it is not served and what serves the need."""


async def not_served(request: web.Request) -> web.Response:
    raise ApiError(404, f"POST {request.path}: {NOT_SERVED[request.path]}", None, "unsupported_endpoint")


def add_routes(app: web.Application) -> None:
    for path in NOT_SERVED:
        app.router.add_post(path, not_served)
