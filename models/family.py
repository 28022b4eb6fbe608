"""What a family of memory systems implements to plug into the driver and the tuner.

A family is one simulator (a sub-package of ``models``) that runs one or more registered
systems (``models.registry``). The generic driver (``models.simulate``) scans blocks of
``step`` calls, absorbs each block's completions into the latency histograms, calls the
family's end-of-block hook and runs exact mode until ``done``; the tuner, sweeps,
evaluation and export only ever see the :class:`Family` interface, the systems'
parameter specs and the metrics the family declares.

State contract: a family's state is a frozen pytree (``flax.struct``) with at least
``acc`` (:class:`models.server.Acc` or a subclass), ``rec`` (a
:class:`models.server.Record` or subclass, or None), ``clock`` and ``it``; the driver's
latency absorption and the shared metrics read those.

Optional: ``deployment(inputs, params, opts)`` (see :class:`Family`); a family without
it has no derived deployment values (:func:`deployment_values` returns ``{}``).
``memory_limit(inputs, params, opts)``: the tokens the memory a step reports may never
exceed (default: the KV capacity; the elastic family's pool, into which eLLM's KV
inflates).

Work log (``SimOptions.work_log``): a family that supports calibration returns
``(used_tokens, Finished, IterLog)`` from ``step`` when the option is on: what the
iteration computed (:class:`hardware.Work`), whether it ran and the clock after it, so
that its step times can be recomputed for other roofline parameters on the same
schedule (``tuner.calibrate``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Protocol

import jax.numpy as jnp
from flax import struct

__all__ = ["Family", "HeadQueueFamily", "Inputs", "IterLog", "Metric", "SimOptions", "Sink", "deployment_values",
           "check_priority", "family_of", "get_family", "list_families", "make_inputs", "make_options",
           "register_family"]


@struct.dataclass
class Inputs:
    """What a run simulates: the workload, the server config and the family's own
    inputs (``extra``: e.g. the bucketed family's ODMA window prior; None if none)."""

    wl: Any      # models.Workload
    cfg: Any     # models.ServerConfig
    extra: Any = None


@dataclass(frozen=True)
class Metric:
    """A metric a family reports: its unit, meaning and whether it is a share in [0, 1]
    (an objective's tightened ``>=`` bound moves toward 1 for shares)."""

    unit: str
    doc: str
    share: bool = False


class Sink(NamedTuple):
    """A family's consumer of the block's completions in FIFO order (iteration, then
    slot), fused with the driver's latency absorption so both share one pass.

    ``get(state)`` -> carry; ``add(carry, fin, r, s, ok, j)`` -> carry for a chunk of
    completion positions ``(r, s)`` (``ok`` masks real ones, ``j`` = 0..chunk-1);
    ``put(state, carry, m)`` -> state after ``m`` completions; ``max_chunk(state)`` an
    upper bound (static int) on the chunk size.
    """

    get: Callable
    add: Callable
    put: Callable
    max_chunk: Callable


class IterLog(NamedTuple):
    """One iteration of a work log (stacked over iterations by the driver)."""

    work: Any        # hardware.Work: the arguments of hardware.iteration_time
    busy: Any        # [] bool: the iteration ran (else its time is 0)
    clock: Any       # [] float32 seconds at the iteration's end


class Family(Protocol):
    """The protocol (see the module docstring for the state contract).

    Every method is required except ``deployment`` (optional: families without it
    return nothing, see :func:`deployment_values`). A family that orders admission by
    ``Workload.priority`` sets ``reads_priority = True``; the others are refused a
    workload with priorities (:func:`models.simulate.init_state`).
    """

    name: str
    metrics_spec: Mapping[str, Metric]   # every metric ``metrics`` returns

    def options(self, system: str, **settings) -> Any:
        """The family's frozen (hashable) static options; unknown settings raise."""

    def extra(self, wl, cfg, opts: "SimOptions", history=None, deployment=None) -> Any:
        """Host-side family inputs (:attr:`Inputs.extra`, a pytree or None) from the
        workload, config, ``history`` (realised output lengths of the requests that
        preceded the workload, the deployment's past, or None) and ``deployment``
        (:class:`hardware.Deployment`, or None: a family that needs the model's shapes
        raises)."""

    def init(self, inputs: Inputs, params, t, opts: "SimOptions") -> Any:
        """The initial state."""

    def step(self, state, inputs: Inputs, params, *, hw, t, opts: "SimOptions"):
        """One iteration: ``(state, (used_tokens, server.Finished))``, plus an
        :class:`IterLog` as a third element when ``opts.work_log``. Pure."""

    def sink(self, opts: "SimOptions") -> Sink | None:
        """The completion consumer, if the family has one."""

    def end_block(self, state, inputs: Inputs, params, *, t, opts: "SimOptions"):
        """Per-block work after the completions are absorbed (e.g. a refresh)."""

    def done(self, state, inputs: Inputs):
        """Every valid request finished or dropped (a traced bool)."""

    def metrics(self, state, inputs: Inputs) -> dict:
        """Float32 scalars keyed by the names of ``metrics_spec``."""

    def deployment(self, inputs: Inputs, params, opts: "SimOptions") -> dict:
        """OPTIONAL. Derived deployment values in physical units (plain Python
        numbers/lists, JSON-ready) of a system with these params on these inputs: what
        an engineer configures a real server with (e.g. bucket bounds in tokens, pool
        sizes in tokens and bytes). Runs on the host, outside jit."""


class HeadQueueFamily:
    """Defaults for a family without a completion sink or end-of-block work whose state
    has ``head`` (first request not yet admitted) and ``slots.status`` (0 empty): it is
    done when every valid request was admitted and every slot is empty."""

    def sink(self, opts: "SimOptions"):
        return None

    def end_block(self, state, inputs: Inputs, params, *, t, opts: "SimOptions"):
        return state

    def done(self, state, inputs: Inputs):
        n_valid = jnp.sum(inputs.wl.valid)
        return (state.head >= n_valid) & ~jnp.any(state.slots.status > 0)


@dataclass(frozen=True)
class SimOptions:
    """Static options of a run (changing one recompiles): the system, ``block``
    iterations per scanned block (the end-of-block hook's cadence), whether to keep a
    per-request ``record``, whether to keep the TTFT/TPOT histograms (``latency_hist=
    False``: their p50/p99 metrics become NaN, SLO-attainment counters stay) and the
    family's own frozen options. Build with :func:`make_options`."""

    system: str
    family: Any = field(default=None)
    block: int = 16
    record: bool = False
    latency_hist: bool = True
    work_log: bool = False  # the step also returns an IterLog (see the module doc)


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    missing = [m for m in ("options", "extra", "init", "step", "sink", "end_block",
                           "done", "metrics", "metrics_spec", "name")
               if not hasattr(family, m)]
    if missing:
        raise TypeError(f"family {getattr(family, 'name', family)!r} lacks {missing}")
    _FAMILIES[family.name] = family
    return family


def get_family(name: str) -> Family:
    if name not in _FAMILIES:
        raise ValueError(f"unknown family {name!r}; known: {', '.join(sorted(_FAMILIES))}")
    return _FAMILIES[name]


def list_families() -> list[str]:
    return sorted(_FAMILIES)


_SYSTEM_FAMILY: dict[str, str] = {}  # system -> its family's name (models.registry fills it)


def bind_system(system: str, family: str) -> None:
    """Record that ``system`` runs on ``family`` (called by ``register_system``)."""
    get_family(family)  # fails with the known families' names
    _SYSTEM_FAMILY[system] = family


def family_of(system: str) -> Family:
    if system not in _SYSTEM_FAMILY:
        raise ValueError(f"unknown system {system!r}; known: "
                         f"{', '.join(sorted(_SYSTEM_FAMILY))}")
    return get_family(_SYSTEM_FAMILY[system])


def make_options(system: str, *, block: int = 16, record: bool = False,
                 latency_hist: bool = True, work_log: bool = False,
                 **settings) -> SimOptions:
    """:class:`SimOptions` for ``system``; ``settings`` go to its family's options
    (e.g. the bucketed family's ``window`` and ``refresh_every``)."""
    if int(block) < 1:
        raise ValueError(f"block must be >= 1 iteration, got {block}")
    fam = family_of(system)
    return SimOptions(system=system, family=fam.options(system, **settings),
                      block=int(block), record=bool(record),
                      latency_hist=bool(latency_hist), work_log=bool(work_log))


def deployment_values(inputs: Inputs, params, opts: SimOptions) -> dict:
    """The derived deployment values of ``opts.system`` with ``params`` on ``inputs``
    (its family's optional ``deployment``), or ``{}`` when the family has none."""
    fn = getattr(family_of(opts.system), "deployment", None)
    return dict(fn(inputs, params, opts)) if callable(fn) else {}


def make_inputs(wl, cfg, opts: SimOptions, history=None, deployment=None) -> Inputs:
    """:class:`Inputs` for a run of ``opts.system`` (host side, before jit);
    ``deployment`` (:class:`hardware.Deployment`) for families that model more than
    the KV pool (the elastic family's activation memory)."""
    check_priority(wl, opts.system)
    extra = family_of(opts.system).extra(wl, cfg, opts, history, deployment=deployment)
    return Inputs(wl=wl, cfg=cfg, extra=extra)


def check_priority(wl, system: str) -> None:
    """Raise ValueError when ``wl`` carries per-request priorities and ``system``'s
    family does not read them (it would serve first-come-first-served in silence)."""
    fam = family_of(system)
    if wl.priority is not None and not getattr(fam, "reads_priority", False):
        raise ValueError(f"{system}: the workload carries per-request priorities and "
                         f"the {fam.name} family schedules first-come-first-served (only "
                         "the bucketed family reads Workload.priority)")
