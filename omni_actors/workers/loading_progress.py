"""Weight loading inside a worker as our progress events: transformers' own loading bars, routed.

transformers 5 counts what it loads with tqdm bars ("Loading weights": a step a checkpoint
tensor); in a worker those would be drawn on the terminal the workers share, between our log
lines, or not at all. While a worker builds its engine, `loading_progress(stage=..., replica=...)`
sets transformers' public tqdm hook (`transformers.utils.logging.set_tqdm_hook`) so that every
bar with a known length becomes a `progress.Progress` named `worker.loading` (`what`: the
bar's description, plus the given keys): at most a line a tenth of its total, in the process's
log format, e.g.

    worker.loading  done=2400 total=12011 what="Loading weights" stage=thinker replica=0

transformers is not imported for this (1-2 s a worker that needs none of it): the hook is set
when the engine's loading imports `transformers.utils.logging` (an import hook on that one
module while the block runs), or at once if it already has. diffusers' own bars (a pipeline's
components) have no hook and stay off (diffusion_loading.py); the transformers models inside a
pipeline (its text encoders) report through this one.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Iterator
from typing import Any

from omni_actors import progress

EVENT = "worker.loading"
MODULE = "transformers.utils.logging"


class _Bar:
    """What transformers' loading code uses of a tqdm bar, reported as a Progress."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], keys: dict[str, Any]) -> None:
        self.iterable = args[0] if args else kwargs.get("iterable")
        total = kwargs.get("total")
        if total is None and self.iterable is not None and hasattr(self.iterable, "__len__"):
            total = len(self.iterable)
        what = str(kwargs.get("desc") or "loading").rstrip(". :")
        self.total, self.n = total, 0
        self.progress = progress.start(EVENT, int(total), what=what, **keys) if total else None

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update(1)

    def update(self, n: float = 1) -> None:
        self.n += n
        if self.progress is not None:
            self.progress.advance(int(n))

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.progress = None

    def __getattr__(self, name: str) -> Any:  # set_postfix, set_description, refresh, ...: nothing to show
        return lambda *args, **kwargs: None


class _SetOnImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` right after MODULE is first imported."""

    def __init__(self, then: Any) -> None:
        self.then = then

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                then(module)

        spec.loader = Loader()
        return spec


@contextlib.contextmanager
def loading_progress(**keys: Any) -> Iterator[None]:
    """transformers' bars started inside the block are `worker.loading` progress with `keys`."""
    set_hooks: list[Any] = []

    def install(module: Any) -> None:
        if hasattr(module, "set_tqdm_hook"):  # (transformers 5.x; before it, no hook: nothing reported)
            previous = module.set_tqdm_hook(lambda factory, args, kwargs: _Bar(args, kwargs, keys))
            set_hooks.append((module, previous))

    finder = None
    if MODULE in sys.modules:
        install(sys.modules[MODULE])
    else:
        finder = _SetOnImport(install)
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)
        for module, previous in set_hooks:
            module.set_tqdm_hook(previous)
