"""Deploy files read as YAML: keys given twice refused, errors naming line and column, `base_config` chains merged.

    load_raw(path) -> dict        the file, merged over its base_config (and its base's ...)
    deep_merge(base, over)        dicts key by key, `stages` lists by stage_id, else `over` wins
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from omni_actors.errors import ConfigError


def deep_merge(base: Any, over: Any) -> Any:
    """Merge `over` into `base`: dicts key by key, `stages` lists by stage_id, else replace."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, val in over.items():
            if key == "stages" and isinstance(val, list) and isinstance(out.get(key), list):
                out[key] = _merge_stages(out[key], val)
            else:
                out[key] = deep_merge(out[key], val) if key in out else copy.deepcopy(val)
        return out
    return copy.deepcopy(over)


def _merge_stages(base: list[Any], over: list[Any]) -> list[Any]:
    if not all(isinstance(s, dict) for s in (*base, *over)):
        return [*base, *copy.deepcopy(over)]  # not mergeable by id; validation names the bad entry
    by_id = {s.get("stage_id"): s for s in base}
    order = [s.get("stage_id") for s in base]
    for st in over:
        sid = st.get("stage_id")
        if sid in by_id:
            by_id[sid] = deep_merge(by_id[sid], st)
        else:
            by_id[sid] = st
            order.append(sid)
    return [by_id[sid] for sid in order]


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML would keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key.value!r} is given twice in one mapping", key.start_mark
                    )
                seen.add(key.value)
        return super().construct_mapping(node, deep)


def _yaml_error(path: Path, err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    if not isinstance(err, yaml.MarkedYAMLError) or mark is None:
        return f"{path}: not valid YAML: {err}".replace("\n", " ")
    msg = f"{path}: line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {err.problem}"
    if err.context and err.context_mark is not None:
        msg += f" ({err.context} at line {err.context_mark.line + 1})"
    return msg


def _read_yaml(path: Path, where: str) -> dict[str, Any]:
    if path.is_dir():
        raise ConfigError(f"{where}: {path} is a directory; expected a YAML file")
    if not path.is_file():
        raise ConfigError(f"{where}: file not found: {path}")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_YamlLoader) or {}
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the file as UTF-8 text: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_error(path, err)) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    return raw


def load_raw(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    raw = _read_yaml(path, f"{seen[-1]}: base_config" if seen else "deploy")
    base = raw.get("base_config")
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"{path}: base_config: expected a file path, got {type(base).__name__}")
    if base:
        base_path = (path.parent / str(base)).resolve()
        if base_path in seen or base_path == path.resolve():
            raise ConfigError(f"{path}: base_config: circular reference to {base_path}")
        raw = deep_merge(load_raw(base_path, (*seen, path.resolve())), raw)
    return raw
