"""Weight loading inside a worker as our progress events: transformers' own loading bars, routed.

transformers 5 counts what it loads with tqdm bars ("Loading weights": a step a checkpoint
tensor); in a worker those would be drawn on the terminal the workers share, between our log
lines, or not at all. While a worker builds its engine, `loading_progress(stage=..., replica=...)`
sets transformers' public tqdm hook (`transformers.utils.logging.set_tqdm_hook`) so that every
bar with a known length becomes a `progress.Progress` named `worker.loading` (`what`: the
bar's description, plus the given keys): at most a line a tenth of its total, in the process's
log format, e.g.

    worker.loading  done=2400 total=12011 what="Loading weights" stage=thinker replica=0

diffusers' bars ("Loading pipeline components", "Loading checkpoint shards") are made by
calling `diffusers.utils.logging.tqdm`, looked up on that module at each call: inside the block
that name is our factory (the same events, whether or not diffusers' bars are switched off),
and the module's own object again after it. So a diffusion worker reports its components one
by one, and its text encoders' weights through transformers' hook.

Neither library is imported for this (1-2 s a worker that needs neither): each hook is set
when the engine's loading imports that library's logging module (an import hook on those two
modules while the block runs), or at once if it already has.
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
DIFFUSERS_MODULE = "diffusers.utils.logging"


class _Bar:
    """What transformers' loading code uses of a tqdm bar, reported as a Progress."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], keys: dict[str, Any]) -> None:
        self.iterable = args[0] if args else kwargs.get("iterable")
        total = kwargs.get("total")
        if total is None and self.iterable is not None and hasattr(self.iterable, "__len__"):
            total = len(self.iterable)
        what = str(kwargs.get("desc") or "loading").rstrip(". :")
        if kwargs.get("disable"):
            total = None  # (diffusers' bars off on ranks but the first)
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


class _Factory:
    """What diffusers calls as `logging.tqdm(...)`: a _Bar with the block's keys."""

    def __init__(self, keys: dict[str, Any]) -> None:
        self.keys = keys

    def __call__(self, *args: Any, **kwargs: Any) -> _Bar:
        return _Bar(args, kwargs, self.keys)

    def set_lock(self, *args: Any) -> None:
        pass

    def get_lock(self) -> None:
        return None


class _SetOnImport(importlib.abc.MetaPathFinder):
    """Runs `then[name](module)` right after a module named in `then` is first imported."""

    def __init__(self, then: dict[str, Any]) -> None:
        self.then = then

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.then:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then[name]

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
    """transformers' and diffusers' bars started inside the block are `worker.loading` progress
    with `keys`."""
    undo: list[Any] = []

    def transformers_hook(module: Any) -> None:
        if hasattr(module, "set_tqdm_hook"):  # (transformers 5.x; before it, no hook: nothing reported)
            previous = module.set_tqdm_hook(lambda factory, args, kwargs: _Bar(args, kwargs, keys))
            undo.append(lambda: module.set_tqdm_hook(previous))

    def diffusers_hook(module: Any) -> None:
        if hasattr(module, "tqdm"):
            previous = module.tqdm
            module.tqdm = _Factory(keys)
            undo.append(lambda: setattr(module, "tqdm", previous))

    hooks = {MODULE: transformers_hook, DIFFUSERS_MODULE: diffusers_hook}
    later = {}
    for name, hook in hooks.items():
        if name in sys.modules:
            hook(sys.modules[name])
        else:
            later[name] = hook
    finder = _SetOnImport(later) if later else None
    if finder is not None:
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)
        for step in reversed(undo):
            step()
