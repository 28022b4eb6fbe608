"""The gradient-quality check: per theta coordinate, the relaxed gradient of a
:class:`tuner.objective.problem.Problem` against exact-mode finite differences under common random
numbers (both of the log surrogate).

Every check is classified by :func:`classify` (one rule, used by the fit's estimator
choice and temperature floor, ``experiments.grad_check`` and
``experiments.bench_tuners``): ``flat``, ``vanishing``, ``agree`` or ``disagree``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuner.objective.problem import Problem

__all__ = ["CoordCheck", "CLASSES", "FLAT_TOL", "VANISHING_RATIO", "classify", "check",
           "check_directions"]

# An exact finite difference of the log objective at most this large is "flat": the
# log objective is relative (d log f = df / f), so this is a relative change of the
# objective of 2e-7 over a central step of 2 x 0.1 in theta, float32's resolution
# (1.2e-7) of one evaluation: below it the difference is rounding, not a slope.
FLAT_TOL = 1e-6
# A relaxed derivative below this share of the exact difference is "vanishing".
VANISHING_RATIO = 1e-2
CLASSES = ("agree", "disagree", "vanishing", "flat")


def classify(relaxed: float, exact: float, flat_tol: float = FLAT_TOL,
             ratio: float = VANISHING_RATIO) -> str:
    """A gradient check in one word; the rule, in this order:

    * ``flat``: ``|exact| <= flat_tol`` (:data:`FLAT_TOL`, 1e-6 per theta unit of the
      log objective, float32 rounding): the exact objective does not move along it, so
      there is nothing to agree with.
    * ``vanishing``: ``|relaxed| < ratio * |exact|`` (:data:`VANISHING_RATIO`, 1%),
      whatever the signs (0 included): the relaxed derivative is far below the exact
      difference's scale (a saturated surrogate: -1.7e-13 against an exact -7.75), its
      sign is rounding noise, and after the fit's global-norm clip the coordinate would
      move at under 1% of the rate the exact objective rewards. Why 1%: of the 83
      non-flat checks committed under ``experiments/results`` (bench_tuners,
      grad_check), 46 have ratios ``|relaxed| / |exact|`` below 0.0044 (33 below 1e-3,
      down to 1e-16: numerically zero slopes) and 37 above 0.016, none between; 1% lies
      in that gap, where a 1e-3 cut would still call "agree" derivatives 250-750x
      smaller than the exact slope.
    * ``agree``: the signs match (and the magnitude is not vanishing).
    * ``disagree``: otherwise (opposite signs), and whenever either number is not
      finite (an infinite exact difference included).

    The fit treats ``vanishing`` like ``disagree`` (exact CRN finite differences for that
    coordinate) and counts neither towards the temperature floor.
    """
    r, e = float(relaxed), float(exact)
    if not np.isfinite(e) or abs(e) <= flat_tol:
        return "flat" if np.isfinite(e) else "disagree"
    if not np.isfinite(r):
        return "disagree"
    if abs(r) < ratio * abs(e):
        return "vanishing"
    return "agree" if np.sign(r) == np.sign(e) else "disagree"


@dataclass(frozen=True)
class CoordCheck:
    name: str
    index: int
    relaxed: float
    exact_fd: float
    sign_agrees: bool   # the signs match (or the exact difference is flat)
    rel_error: float
    status: str = ""    # classify(relaxed, exact_fd): agree, disagree, vanishing, flat

    @property
    def label(self) -> str:
        return f"{self.name}[{self.index}]"

    @property
    def usable(self) -> bool:
        """The relaxed gradient may stand for the exact objective here (agree or
        flat); vanishing and disagreeing coordinates need exact differences."""
        return self.status in ("agree", "flat")


def _make(name: str, index: int, r: float, e: float) -> CoordCheck:
    status = classify(r, e)
    sign = status == "flat" or bool(np.sign(r) == np.sign(e))
    rel = abs(r - e) / max(abs(e), FLAT_TOL)
    return CoordCheck(name, index, float(r), float(e), sign, float(rel), status)


def check(problem: Problem, theta, t: float, fd: dict | None = None, h=0.1):
    """Per-coordinate relaxed gradient vs exact-mode CRN finite differences (both of the
    log surrogate). Returns the checks, the finite differences and the relaxed metrics
    (with ``log_objective``) at ``theta``."""
    _, g, m = problem.grad(theta, t)
    coords = problem.space.coords()
    fd = fd if fd is not None else problem.fd(theta, coords, h)
    out = [_make(name, i, float(np.asarray(g[name]).reshape(-1)[i]), float(fd[(name, i)]))
           for name, i in coords]
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
    out = [_make("dir", j, _dot(g, v), float(e)) for j, (v, e) in enumerate(zip(dirs, fd))]
    return out, m
