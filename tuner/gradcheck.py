"""The gradient-quality check: per theta coordinate, the relaxed gradient of a
:class:`tuner.problem.Problem` against exact-mode finite differences under common random
numbers (both of the log surrogate)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuner.problem import Problem

__all__ = ["CoordCheck", "check", "check_directions"]


@dataclass(frozen=True)
class CoordCheck:
    name: str
    index: int
    relaxed: float
    exact_fd: float
    sign_agrees: bool
    rel_error: float

    @property
    def label(self) -> str:
        return f"{self.name}[{self.index}]"


def check(problem: Problem, theta, t: float, fd: dict | None = None, h=0.1):
    """Per-coordinate relaxed gradient vs exact-mode CRN finite differences (both of the
    log surrogate). Returns the checks, the finite differences and the relaxed metrics
    (with ``log_objective``) at ``theta``."""
    _, g, m = problem.grad(theta, t)
    coords = problem.space.coords()
    fd = fd if fd is not None else problem.fd(theta, coords, h)
    out = []
    scale = max(max(abs(v) for v in fd.values()), 1e-12) if fd else 1.0
    for name, i in coords:
        r = float(np.asarray(g[name]).reshape(-1)[i])
        e = fd[(name, i)]
        tiny = 1e-3 * scale  # an exact slope this small contradicts no direction
        agree = abs(e) < tiny or np.sign(r) == np.sign(e)
        rel = abs(r - e) / max(abs(e), tiny)
        out.append(CoordCheck(name, i, r, e, bool(agree), float(rel)))
    return out, fd, m


def _dot(g, v) -> float:
    return float(sum(np.sum(np.asarray(g[n], np.float64) * np.asarray(v[n], np.float64))
                     for n in v))


def check_directions(problem: Problem, theta, t: float, dirs: list, fd: list):
    """The relaxed directional derivative ``g . v`` along each theta direction ``v``
    against the exact CRN finite difference ``fd[j]`` along it (a check whose cost does
    not grow with the number of coordinates). Returns checks labelled ``dir[j]`` and the
    relaxed metrics at ``theta``."""
    _, g, m = problem.grad(theta, t)
    scale = max(max((abs(e) for e in fd), default=0.0), 1e-12)
    out = []
    for j, (v, e) in enumerate(zip(dirs, fd)):
        r = _dot(g, v)
        tiny = 1e-3 * scale
        agree = abs(e) < tiny or np.sign(r) == np.sign(e)
        out.append(CoordCheck("dir", j, r, float(e), bool(agree),
                              float(abs(r - e) / max(abs(e), tiny))))
    return out, m
