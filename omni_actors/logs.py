"""Structured logging setup: one event name per line, keys not prose.

`omni-run --log-format console|json --log-level LEVEL` set OMNI_LOG_JSON /
OMNI_LOG_LEVEL before anything logs (`apply_cli_flags`), so the worker processes,
fresh interpreters that inherit the environment, log the same way. Third-party
engines (vLLM's start-up dump and per-request lines, transformers' advice) are
quiet unless the level is debug.
"""

from __future__ import annotations

import logging
import os
import re
import sys

import structlog

from omni_actors.settings import LOG_LEVELS, settings

_configured = False


LEVELS = LOG_LEVELS
FORMATS = ("console", "json")
QUIET_ENV = {"VLLM_LOGGING_LEVEL": "WARNING", "TRANSFORMERS_VERBOSITY": "error"}
"""Third-party log levels set (unless already set) when ours is not debug."""
_notices: list[re.Pattern[str]] = []
"""Third-party records known to be benign where they are logged (drop_notices): not shown unless debug."""
QUIET_LOGGERS = ("faster_whisper",)
"""Third-party loggers held at warning when ours is not debug (faster-whisper says each request's
audio duration at info)."""


def apply_cli_flags(level: str | None, fmt: str | None) -> None:
    """Make --log-level / --log-format the environment's, for this process and its workers."""
    if level is not None:
        os.environ["OMNI_LOG_LEVEL"] = level
    if fmt is not None:
        os.environ["OMNI_LOG_JSON"] = "1" if fmt == "json" else "0"


def json_logs() -> bool:
    return os.environ.get("OMNI_LOG_JSON", "1" if settings().log_json else "0") == "1"


def level_name() -> str:
    return os.environ.get("OMNI_LOG_LEVEL", settings().log_level).lower()


def drop_notices(logger: str, *patterns: str) -> None:
    """Hold `logger` (a library's) at warning (or our level, if higher), and drop its records matching
    `patterns`, unless our level is debug: a library's notice about a choice this runtime made on
    purpose (vLLM's eager mode on CPU, its fixed seed) is not a warning to the operator. Where the
    library's records go through our handler (the root's), that is."""
    if level_name() == "debug":
        return
    floor = max(logging.WARNING, getattr(logging, level_name().upper(), logging.INFO))
    lib = logging.getLogger(logger)
    if lib.level == logging.NOTSET or lib.level < floor:
        lib.setLevel(floor)
    _notices.extend(re.compile(p) for p in patterns)


class _Notices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not _notices:
            return True
        text = record.getMessage()
        return not any(p.search(text) for p in _notices)


def configure(component: str = "main") -> None:
    global _configured
    if _configured:
        return
    _configured = True
    level_text = level_name()
    level = getattr(logging, level_text.upper(), logging.INFO)
    if level_text != "debug":
        for key, value in QUIET_ENV.items():
            os.environ.setdefault(key, value)
        for name in QUIET_LOGGERS:
            drop_notices(name)
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_Notices())
    renderer = (
        structlog.processors.JSONRenderer()
        if json_logs()
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    if json_logs():
        # No library's tqdm bar (transformers' "Writing model shards" in make-tiny, a GGUF conversion in
        # prepare) writes plain text among the JSON lines; tqdm reads this when it is first imported,
        # which is after this. (Our own progress reaches JSON logs as events: progress.py.)
        os.environ.setdefault("TQDM_DISABLE", "1")
        # Python warnings (a library's FutureWarning at import, vLLM's among them) as records: JSON too.
        logging.captureWarnings(True)
        # Other libraries' records (aiohttp's access lines, ...) as JSON lines too.
        logging.getLogger().handlers[0].setFormatter(structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[structlog.stdlib.add_logger_name, structlog.processors.add_log_level,
                               structlog.processors.TimeStamper(fmt="iso", utc=True)],
        ))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),  # (one write a line: see worker_stderr.write_lines)
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(component=component)


def get(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
