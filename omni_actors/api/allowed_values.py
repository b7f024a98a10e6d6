"""The values a request field takes, read from its msgspec type: what a 400 for a value it does not
take lists ("Invalid enum value 'robot' (field `messages[0].role`); expected one of 'assistant', ...").

msgspec says which value it refused and where (`$.messages[0].role`), not what it would take; the
request's type says it: a Literal's values, an Enum's, or, for a tagged union's tag field (a content
part's `type`), the tags of its members.
"""

from __future__ import annotations

import re
from typing import Any

from msgspec import inspect as mi

_SEGMENT = re.compile(r"\[\d+\]|[^.\[\]]+")
MAX_LISTED = 24
"""Past this many values, none are listed (the message would bury the mistake)."""


def allowed_values(typ: Any, path: str) -> list[str] | None:
    """The values the field at `path` (as errors.validation_detail writes it) of `typ` takes; None
    when it is not a closed set (or the path cannot be followed)."""
    try:
        info = mi.type_info(typ)
    except (TypeError, ValueError):
        return None
    values = _walk(info, _SEGMENT.findall(path))
    return values if values and len(values) <= MAX_LISTED else None


def _walk(t: mi.Type, segments: list[str]) -> list[str] | None:
    if isinstance(t, mi.UnionType):
        if segments and all(isinstance(m, mi.StructType) and m.tag_field == segments[0]
                            for m in t.types if not isinstance(m, mi.NoneType)) and len(segments) == 1:
            return sorted(str(m.tag) for m in t.types if isinstance(m, mi.StructType))
        found = [v for m in t.types if not isinstance(m, mi.NoneType) for v in (_walk(m, segments) or [])]
        return sorted(set(found)) or None
    if not segments:
        if isinstance(t, mi.LiteralType):
            return sorted(str(v) for v in t.values)
        if isinstance(t, mi.EnumType):
            return sorted(str(m.value) for m in t.cls)
        return None
    head, rest = segments[0], segments[1:]
    if isinstance(t, mi.StructType):
        if head == t.tag_field and not rest:
            return [str(t.tag)]
        field = next((f for f in t.fields if f.encode_name == head), None)
        return None if field is None else _walk(field.type, rest)
    if isinstance(t, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)) and head.startswith("["):
        return _walk(t.item_type, rest)
    return None


def expected_text(typ: Any, path: str | None) -> str:
    """"; expected one of 'a', 'b'" for the field at `path` of `typ`, or "" when it is not a closed set."""
    values = allowed_values(typ, path) if path else None
    return f"; expected one of {', '.join(repr(v) for v in values)}" if values else ""
