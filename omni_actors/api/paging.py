"""The list routes' shared query parameters: `limit` (a page's size) and `order` (by creation time)."""

from __future__ import annotations

from collections.abc import Mapping

from omni_actors.api.errors import bad_request


def page_limit(query: Mapping[str, str], default: int, most: int) -> int:
    """`limit` from 1 to `most` (`default` when absent); a 400 naming it otherwise."""
    try:
        limit = int(query.get("limit", default))
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise bad_request(f"limit must be an integer from 1 to {most}", "limit")
    return limit


def newest_first(query: Mapping[str, str]) -> bool:
    """`order`: "desc" (the default, newest first) or "asc"; a 400 naming it otherwise."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("order must be `asc` or `desc`", "order")
    return order == "desc"


def in_memory_page(items: list[dict], query: Mapping[str, str], newest: bool, default: int, most: int,
                   of_what: str) -> tuple[list[dict], str | None, str | None, bool]:
    """A page of `items` (dicts with an "id", oldest first) as a list route answers it: ordered (newest first
    if `newest`), after `after` (a 400 naming it when no item of `of_what` has that id), at most `limit`;
    (page, first_id, last_id, has_more)."""
    limit = page_limit(query, default, most)
    ordered = items[::-1] if newest else items
    if after := query.get("after"):
        ids = [i["id"] for i in ordered]
        if after not in ids:
            raise bad_request(f"after {after!r} is not {of_what}", "after")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return page, page[0]["id"] if page else None, page[-1]["id"] if page else None, len(ordered) > limit
