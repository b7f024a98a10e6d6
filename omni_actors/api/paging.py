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
