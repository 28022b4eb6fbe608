"""State of the parameter-dropping cluster (KunServe and its baselines): the scan carry,
the family inputs and options. Semantics: ``docs/kunserve-semantics.md``."""

from __future__ import annotations

from dataclasses import dataclass

import jax
from flax import struct

from models.server import Record

__all__ = ["DropAcc", "DropInputs", "DropOptions", "DropPolicy", "DropState", "Requests",
           "MICROBATCH", "MAX_PIECES"]

MICROBATCH = ("lookahead", "token")
MAX_PIECES = 16  # microbatches a round can form: 2 ** max_depth at the largest depth


@dataclass(frozen=True)
class DropOptions:
    """Static options: ``n_instances`` (cluster size), ``microbatch`` (KunServe's split:
    "lookahead" or the token-count ablation), ``coordinated`` (KV exchange in chunks,
    activations first), ``restore`` (KunServe restores weights when load falls) and
    ``max_depth`` (deepest lookahead split: 2 ** max_depth microbatches)."""

    n_instances: int = 8
    microbatch: str = "lookahead"
    coordinated: bool = True
    restore: bool = True
    max_depth: int = 4

    def __post_init__(self):
        if int(self.n_instances) < 1:
            raise ValueError(f"dropping options: n_instances must be >= 1, got "
                             f"{self.n_instances}")
        if self.microbatch not in MICROBATCH:
            raise ValueError(f"dropping options: microbatch must be one of {MICROBATCH}, "
                             f"got {self.microbatch!r}")
        if not 0 <= int(self.max_depth) <= 4:
            raise ValueError(f"dropping options: max_depth must be in 0..4 (at most "
                             f"{MAX_PIECES} microbatches), got {self.max_depth}")


@dataclass(frozen=True)
class DropPolicy:
    """Which rules a system applies (see ``models.dropping.family.POLICIES``)."""

    drop: bool = False          # KunServe: merge groups and drop a weight copy
    pairs: bool = False         # static pipeline groups of two (vLLM PP)
    lookahead: bool = False     # microbatches by the lookahead cost split
    swap: bool = False          # preemption swaps KV to the host (InferCept)
    migrate: bool = False       # Llumnix migration of a running request when throttled


@struct.dataclass
class DropInputs:
    """Per-deployment inputs (tokens are KV tokens of the whole model, ``kvb`` bytes)."""

    weight_tokens: jax.Array  # [] W: one model copy's weight bytes / kvb
    cost_a: jax.Array         # [] seconds per attention (query, key) pair, eq. (1) fit
    cost_b: jax.Array         # [] seconds per token (MLP), eq. (1) fit
    cost_g: jax.Array         # [] seconds per microbatch (reported; moves no split)
    t_chunk: jax.Array        # [] seconds of overhead per exchanged chunk


@struct.dataclass
class Requests:
    """Per-request state, indexed by request (arrival order = queue order)."""

    status: jax.Array   # [R] int32 0 not dispatched, 1 queued, 2 running, 3 done, 4 swapped
    inst: jax.Array     # [R] int32 home instance (its group: gid[inst])
    target: jax.Array   # [R] float32 prompt tokens to compute (prompt + gen after recompute)
    done: jax.Array     # [R] float32 of those computed
    gen: jax.Array      # [R] float32 output tokens generated
    kv: jax.Array       # [R] float32 KV tokens held on the group
    host: jax.Array     # [R] float32 KV tokens swapped to the host
    stall: jax.Array    # [R] float32 no compute before this time (KV exchange)
    weight: jax.Array   # [R] float32 admission weight (1 exact; soft gate relaxed)
    t_admit: jax.Array  # [R] float32 first admission (NaN before)
    t_first: jax.Array  # [R] float32 first token (NaN before)
    t_done: jax.Array   # [R] float32 finish (NaN before): exact latency percentiles
    mig_to: jax.Array   # [R] int32 destination gid of a live migration, -1 none
    mig_end: jax.Array  # [R] float32 when the migration lands
    mig_kv: jax.Array   # [R] float32 tokens reserved at the destination


@struct.dataclass
class DropAcc:
    """The shared accumulators (:class:`models.server.Acc`, same names) and the cluster's."""

    completed: jax.Array
    tokens: jax.Array
    actual_kv: jax.Array
    preemptions: jax.Array
    stalls: jax.Array
    dropped: jax.Array
    queue_s: jax.Array
    ttft_ok: jax.Array
    tpot_ok: jax.Array
    slo_ok: jax.Array
    ttft_hist: jax.Array
    tpot_hist: jax.Array
    peak_kv: jax.Array        # [] largest cluster KV tokens held
    max_use: jax.Array        # [] largest held / capacity of a group
    busy_s: jax.Array         # [] summed round time
    iters: jax.Array          # [] rounds with work
    res_token_s: jax.Array    # [] KV tokens held x seconds, summed over groups
    bubble_gpu_s: jax.Array   # [] idle GPU-seconds of pipelined rounds
    pipe_gpu_s: jax.Array     # [] GPU-seconds of pipelined rounds
    inst_s: jax.Array         # [] instance-seconds of rounds
    group_inst_s: jax.Array   # [] group size x instance-seconds of rounds
    drops: jax.Array          # [] merges (one weight copy dropped each)
    restores: jax.Array       # [] groups restored to singletons
    stall_s: jax.Array        # [] request-seconds stalled by KV exchanges
    exchanged: jax.Array      # [] KV tokens exchanged between instances
    swapped: jax.Array        # [] KV tokens moved to or from the host
    migrations: jax.Array     # [] migrations started
    peak_cap: jax.Array       # [] largest cluster KV capacity (tokens)


@struct.dataclass
class DropState:
    req: Requests
    gid: jax.Array        # [N] int32 group of each instance (its smallest member)
    iclock: jax.Array     # [N] float32 per-instance clock (equal within a group)
    capw: jax.Array       # [N] float32 KV capacity of the group named by this row
    x_end: jax.Array      # [N] float32 the group's KV exchange ends (row = gid)
    restoring: jax.Array  # [N] bool the group is pulling its weights back
    pull_end: jax.Array   # [N] float32 when the pull ends
    mig_res: jax.Array    # [N] float32 tokens reserved by migrations into the group
    # the groups' request sums, kept up to date so that a step need not sum over every
    # request (row = gid; 0 in rows that name no group; see cluster.loads)
    held: jax.Array       # [N] float32 summed kv of the group's running requests
    queued: jax.Array     # [N] float32 summed need of its queued requests
    live: jax.Array       # [N] int32 its queued, running and swapped requests
    hol: jax.Array        # [N] int32 its smallest-index queued request (R: none)
    head: jax.Array       # [] int32 next request to dispatch
    clock: jax.Array      # [] float32 latest round end (the makespan's end)
    it: jax.Array         # [] int32 steps
    picked: jax.Array     # [] int32 the last step's group (-1: the step ran no round)
    round_s: jax.Array    # [] float32 the last round's time (0: no work)
    acc: DropAcc
    rec: Record | None
