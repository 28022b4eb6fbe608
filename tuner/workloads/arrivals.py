"""Arrival processes: when requests arrive, apart from what they ask for.

Every generator returns sorted arrival times in seconds with the first request at
``t = 0``, so a mean rate of ``r`` req/s means ``(n - 1) / t[-1] == r`` for a replay
and ``E[gap] == 1 / r`` for the random processes. Randomness comes only from an
explicit ``np.random.default_rng(seed)``; the same seed gives the same times.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from tuner.workloads.trace_data import Trace, concat

__all__ = ["drift", "gamma", "poisson", "replay"]


def _check_n(n, name: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
    return int(n)


def _check_positive(value, name: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number > 0, got {value!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def replay(arrival_s, rate: float | None = None) -> np.ndarray:
    """A trace's own arrival pattern, shifted to start at 0 and, given ``rate``,
    stretched in time so that the mean rate ``(n - 1) / span`` is ``rate`` req/s.

    Every gap is scaled by the same factor, so ratios between gaps are kept.
    """
    t = np.asarray(arrival_s, dtype=np.float64)
    if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)):
        raise ValueError("arrival_s must be a non-empty 1-D array of finite times")
    t = t - t.min()
    if rate is None:
        return t
    rate = _check_positive(rate, "rate")
    span = float(t.max())
    if t.size < 2 or span == 0:
        raise ValueError("cannot rescale to a rate: the arrivals span no time "
                         f"({t.size} request(s), span {span} s)")
    return t * ((t.size - 1) / span / rate)


def poisson(n: int, rate: float, seed) -> np.ndarray:
    """``n`` Poisson arrivals at ``rate`` req/s (exponential gaps, CV 1)."""
    return gamma(n, rate, 1.0, seed)


def gamma(n: int, rate: float, cv: float, seed) -> np.ndarray:
    """``n`` arrivals whose gaps are Gamma distributed with mean ``1 / rate`` s and
    coefficient of variation ``cv`` (shape ``1 / cv**2``; ``cv = 1`` is Poisson,
    ``cv > 1`` bursty, ``cv < 1`` more regular)."""
    n = _check_n(n)
    rate, cv = _check_positive(rate, "rate"), _check_positive(cv, "cv")
    shape = 1.0 / cv**2
    gaps = np.random.default_rng(seed).gamma(shape, 1.0 / (rate * shape), n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def drift(segments, seed) -> Trace:
    """Requests drawn from a sequence of length sources, one segment after another.

    ``segments`` is a list of ``(trace, n_requests)``; each segment draws its
    requests at random from its trace (without replacement when the trace is large
    enough). The result has no arrival times (give some with :func:`gamma` or
    :func:`replay`); its ``dataset`` labels each request with its trace's dataset,
    or with the trace file's name when the trace has none.
    """
    segments = list(segments)
    if not segments:
        raise ValueError("drift needs at least one (trace, n_requests) segment")
    rng = np.random.default_rng(seed)
    parts = []
    for i, segment in enumerate(segments):
        if not (isinstance(segment, tuple) and len(segment) == 2
                and isinstance(segment[0], Trace)):
            raise ValueError(f"segments[{i}] must be a (Trace, n_requests) pair")
        trace, m = segment[0], _check_n(segment[1], f"segments[{i}] n_requests")
        idx = rng.choice(len(trace), size=m, replace=m > len(trace))
        part = trace.take(idx)
        if part.dataset is None:
            label = Path(trace.source).stem or trace.format
            part = replace(part, dataset=(label,) * m)
        parts.append(part)
    source = "drift(" + ", ".join(f"{Path(t.source).name or t.format} x {m}"
                                  for t, m in segments) + ")"
    return concat(parts, source=source, format="drift")
