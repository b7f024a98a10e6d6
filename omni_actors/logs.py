"""Structured logging setup: one event name per line, keys not prose."""

from __future__ import annotations

import logging
import sys

import structlog

from omni_actors.settings import SETTINGS

_configured = False


def configure(component: str = "main") -> None:
    global _configured
    if _configured:
        return
    _configured = True
    level = getattr(logging, SETTINGS.log_level.upper(), logging.INFO)
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
    renderer = (
        structlog.processors.JSONRenderer()
        if SETTINGS.log_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(component=component)


def get(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
