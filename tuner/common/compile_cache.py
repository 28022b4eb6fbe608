"""JAX's persistent compilation cache for the command-line tools, and a count of the
programs a run compiles.

:func:`enable` points JAX's own cache (``jax_compilation_cache_dir``) at
``KVTUNE_JAX_CACHE`` (default ``~/.cache/kvtune/jax-cache``; ``0`` or empty: off) and
stores every executable, however quick to compile (the simulators compile many small
programs). It must run before the first compile; where a cache folder is already set
(the test suite sets one from its start) it changes nothing.

:class:`CompileCount` counts, while it is open, the programs JAX had to build: read
from the persistent cache (``hits``) or compiled by XLA (``compiled``), from JAX's
monitoring events. A program found in JAX's in-memory cache is not counted (it costs
nothing).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["CompileCount", "DEFAULT_DIR", "enable"]

DEFAULT_DIR = Path.home() / ".cache" / "kvtune" / "jax-cache"

_HIT = "/jax/compilation_cache/cache_hits"
_COMPILE = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch


def enable() -> str | None:
    """Turn JAX's persistent compilation cache on (see the module doc); the folder in
    use, or None when it is off."""
    import jax

    current = jax.config.jax_compilation_cache_dir
    if current:  # already set (JAX_COMPILATION_CACHE_DIR, or an earlier call)
        return current
    where = os.environ.get("KVTUNE_JAX_CACHE", str(DEFAULT_DIR))
    if where in ("", "0"):
        return None
    try:
        Path(where).mkdir(parents=True, exist_ok=True)
    except OSError:  # an unwritable cache folder: run without it
        return None
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return where


class CompileCount:
    """``with CompileCount() as c: ...`` then ``c.programs`` (built), of which ``c.hits``
    were read from the persistent cache and ``c.compiled`` compiled by XLA, and
    ``c.compile_s`` (seconds spent building them)."""

    _lock = threading.Lock()

    def __init__(self):
        self.programs = 0  # every program built (the event fires for cache hits too)
        self.hits = 0
        self.compile_s = 0.0  # seconds building them (compiling, or reading the cache)

    @property
    def compiled(self) -> int:
        return self.programs - self.hits

    def _event(self, name: str, **kw) -> None:
        if name == _HIT:
            with self._lock:
                self.hits += 1

    def _duration(self, name: str, secs: float, **kw) -> None:
        if name == _COMPILE:
            with self._lock:
                self.programs += 1
                self.compile_s += float(secs)

    def __enter__(self) -> CompileCount:
        from jax import monitoring

        monitoring.register_event_listener(self._event)
        monitoring.register_event_duration_secs_listener(self._duration)
        return self

    def __exit__(self, *exc) -> None:
        from jax import monitoring

        monitoring.unregister_event_listener(self._event)
        monitoring.unregister_event_duration_listener(self._duration)

    def summary(self) -> str:
        return (f"{self.programs} programs built in {self.compile_s:.1f} s: "
                f"{self.compiled} compiled by XLA, {self.hits} read from the persistent cache")
