"""The generic driver: any registered family, one code path for exact and relaxed runs.

``run_blocks`` is the pure, jittable core (a scan of blocks of ``opts.block`` family
steps, each block's completions absorbed into the latency histograms, in one pass with
the family's completion sink, then the family's end-of-block hook); ``simulate`` runs a
fixed number of iterations (for gradients and sweeps); ``simulate_until_done`` runs
exact-mode chunks until every request is accounted for, and
``simulate_until_done_many`` does so for a batch of runs of one system in one
``vmap``-ped call per chunk (until every run of the batch is done). The family is
looked up from ``opts.system`` at trace time; nothing here knows a family's state
beyond the contract of ``models.family``.
"""

from __future__ import annotations

import collections
import contextlib
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from models.family import Inputs, SimOptions, Sink, check_priority, family_of
from models.server import fifo_entries, hist_add

__all__ = ["absorb", "compile_many", "init_state", "metrics", "run_blocks", "simulate",
           "simulate_until_done", "simulate_until_done_many", "trace_guard", "note_trace"]


# -- compile guard: one trace per (entry point, system, static options, shapes) ---------

TRACES: collections.Counter = collections.Counter()
_GUARD: list[int] = []


def note_trace(where: str, opts, *trees) -> None:
    """Count a trace of ``where`` (call at trace time); under :func:`trace_guard` a
    second trace with the same system, static options and argument shapes raises."""
    shapes = tuple(jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x).name), t)
                   for t in trees)
    key = (where, opts, repr(jax.tree.structure(trees)), repr(shapes))
    TRACES[key] += 1
    if _GUARD and TRACES[key] > _GUARD[-1]:
        raise AssertionError(f"{where}: traced {TRACES[key]} times for system "
                             f"{getattr(opts, 'system', opts)!r} with equal shapes "
                             f"(at most {_GUARD[-1]} allowed)")


@contextlib.contextmanager
def trace_guard(max_traces: int = 1):
    """Within the block, each (entry point, system, options, shapes) may trace at most
    ``max_traces`` times (like ``chex.assert_max_traces``, but keyed by system and
    shapes, so different systems and shapes do not count against each other)."""
    TRACES.clear()
    _GUARD.append(max_traces)
    try:
        yield TRACES
    finally:
        _GUARD.pop()


# -- the driver -------------------------------------------------------------------------

def init_state(inputs: Inputs, params, t, opts: SimOptions):
    """The family's initial state. Raises ValueError when the workload carries
    per-request priorities and the system's family does not read them."""
    check_priority(inputs.wl, opts.system)
    return family_of(opts.system).init(inputs, params, t, opts)


def absorb(state, fin, *, latency: bool, sink: Sink | None, chunk: int = 64):
    """Enter a block's completions ``fin`` ([R, S]) into the latency histograms (unless
    ``latency`` is False) and the family's ``sink``, in FIFO order (iteration, then
    slot), ``chunk`` completions at a time, so the work follows the number of
    completions, not ``R * S``."""
    if not latency and sink is None:
        return state
    acc = state.acc
    m = jnp.sum(jax.lax.population_count(fin.bits).astype(jnp.int32))
    n_slots = fin.length.shape[-1]
    if sink is not None:
        chunk = min(chunk, sink.max_chunk(state))
    j = jnp.arange(chunk, dtype=jnp.int32)

    def body(c):
        c0, carry, th, ph = c
        r, s = fifo_entries(fin.bits, c0 + j)
        s = jnp.minimum(s, n_slots - 1)
        ok = c0 + j < m
        if latency:
            ones = jnp.where(ok, 1.0, 0.0)
            ttft, tpot = jax.lax.stop_gradient((fin.ttft[r, s], fin.tpot[r, s]))
            th, ph = hist_add(th, ttft, ones), hist_add(ph, tpot, ones)
        if sink is not None:
            carry = sink.add(carry, fin, r, s, ok, j)
        return c0 + chunk, carry, th, ph

    # the first chunk outside the loop: XLA runs a loop body markedly slower, and the
    # loop (more than ``chunk`` completions in a block) is rare
    c = body((jnp.zeros((), jnp.int32), sink.get(state) if sink is not None else (),
              acc.ttft_hist, acc.tpot_hist))
    c = jax.lax.while_loop(lambda c: c[0] < m, body, c)
    state = state.replace(acc=acc.replace(ttft_hist=c[2], tpot_hist=c[3]))
    return sink.put(state, c[1], m) if sink is not None else state


def run_blocks(state, inputs: Inputs, hw, params, t, opts: SimOptions, n_blocks: int):
    """Run ``n_blocks * opts.block`` iterations; returns (state, used tokens per iter),
    plus the work log (:class:`models.family.IterLog`, one row per iteration) when
    ``opts.work_log``."""
    fam = family_of(opts.system)
    t = jnp.asarray(t, jnp.float32)
    sink = fam.sink(opts)

    def inner(s, _):
        return fam.step(s, inputs, params, hw=hw, t=t, opts=opts)

    def block(s, _):
        s, out = jax.lax.scan(inner, s, None, length=opts.block)
        s = absorb(s, out[1], latency=opts.latency_hist, sink=sink)
        return fam.end_block(s, inputs, params, t=t, opts=opts), (out[0],) + out[2:]

    state, out = jax.lax.scan(block, state, None, length=n_blocks)
    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), out)
    return (state,) + flat


def simulate(inputs: Inputs, hw, params, t, opts: SimOptions, n_steps: int):
    """Fixed-length run from the initial state: ``(final state, used tokens per iter)``
    (and the work log with ``opts.work_log``)."""
    n_blocks = -(-n_steps // opts.block)
    state = init_state(inputs, params, t, opts)
    return run_blocks(state, inputs, hw, params, t, opts, n_blocks)


@partial(jax.jit, static_argnames=("opts", "n_blocks", "exact"))
def _chunk(state, inputs, hw, params, t, opts, n_blocks, exact=False):
    note_trace("simulate_until_done", opts, state, inputs, hw, params, t)
    # exact: T = 0 as a constant, so XLA drops every relaxed branch (same results)
    t = 0.0 if exact else t
    state, used = run_blocks(state, inputs, hw, params, t, opts, n_blocks)[:2]
    return state, jnp.max(used), family_of(opts.system).done(state, inputs)


def simulate_until_done(inputs: Inputs, hw, params, opts: SimOptions, *, t=0.0,
                        max_steps=2_000_000, chunk_blocks=64):
    """Exact-mode evaluation: run chunks until every valid request finished or dropped."""
    state = init_state(inputs, params, jnp.float32(t), opts)
    exact = float(t) == 0.0
    steps = 0
    while steps < max_steps:
        state, _, done = _chunk(state, inputs, hw, params, jnp.float32(t), opts,
                                chunk_blocks, exact)
        steps += chunk_blocks * opts.block
        if bool(done):
            break
    return state


@partial(jax.jit, static_argnames=("opts", "n_blocks", "exact"))
def _chunk_many(state, inputs, hw, params, t, opts, n_blocks, exact=False):
    note_trace("simulate_until_done_many", opts, state, inputs, hw, params, t)
    t = 0.0 if exact else t
    fam = family_of(opts.system)

    def one(s, x, p):
        s = run_blocks(s, x, hw, p, t, opts, n_blocks)[0]
        return s, fam.done(s, x)

    state, done = jax.vmap(one)(state, inputs, params)
    return state, jnp.all(done)


@partial(jax.jit, static_argnames=("opts",))
def _init_many(inputs, params, t, opts):
    return jax.vmap(lambda x, p: init_state(x, p, t, opts))(inputs, params)


@partial(jax.jit, static_argnames=("opts",))
def _metrics_many(state, inputs, opts):
    return jax.vmap(lambda s, x: metrics(s, x, opts))(state, inputs)


def compile_many(inputs: Inputs, hw, params, opts: SimOptions, *, t=0.0,
                 chunk_blocks=64) -> None:
    """Compile the programs :func:`simulate_until_done_many` runs for these arguments'
    shapes, without running them: a later call with arguments of the same shapes and
    types uses them. A caller may do this in a thread while other work runs (XLA
    compiles outside the GIL)."""
    tt = jnp.float32(t)
    init = _init_many.lower(inputs, params, tt, opts)
    state = init.out_info
    init.compile()
    _chunk_many.lower(state, inputs, hw, params, tt, opts, chunk_blocks,
                      float(t) == 0.0).compile()
    _metrics_many.lower(state, inputs, opts).compile()


def simulate_until_done_many(inputs: Inputs, hw, params, opts: SimOptions, *, t=0.0,
                             max_steps=2_000_000, chunk_blocks=64) -> dict:
    """:func:`simulate_until_done` of a batch of ``B`` runs of one system: ``inputs`` and
    ``params`` carry a leading axis ``B`` (``hw`` is shared); chunks run ``vmap``-ped
    until every run of the batch is done (a finished run's state no longer changes, so
    each run's result equals its own ``simulate_until_done``). Returns every metric as
    a ``[B]`` NumPy array: one compiled program per (system, options, ``B``, shapes)."""
    state = _init_many(inputs, params, jnp.float32(t), opts)
    exact = float(t) == 0.0
    steps = 0
    while steps < max_steps:
        state, done = _chunk_many(state, inputs, hw, params, jnp.float32(t), opts,
                                  chunk_blocks, exact)
        steps += chunk_blocks * opts.block
        if bool(done):
            break
    return {k: np.asarray(v) for k, v in _metrics_many(state, inputs, opts).items()}


@partial(jax.jit, static_argnames=("opts",))
def metrics(state, inputs: Inputs, opts: SimOptions) -> dict:
    """The family's metrics of a finished (or truncated) run, float32 scalars
    (differentiable). Compiled as one program: called on a finished run outside a trace,
    its dozens of reductions would otherwise each compile and run as its own operation."""
    return family_of(opts.system).metrics(state, inputs)
