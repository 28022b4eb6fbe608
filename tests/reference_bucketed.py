"""Independent NumPy event-loop reference of the bucketed KV-memory server.

This file implements ``docs/server-semantics.md`` (exact mode) literally, with plain Python
loops over iterations, slots and candidates. It must not import anything from
``models/``: it exists to check the JAX implementation independently.

Interpretations
---------------
Where the spec leaves a choice open, this reference does the following. The JAX side
should be aligned with these.

1. Clock. The clock starts at ``np.float32(0)``; it is kept as ``np.float32`` and every
   iteration adds ``np.float32(dt)``. Arrivals are compared as ``arrival[i] <= t`` in
   float32. An iteration with no prefill and no decode costs 0 s and ``iteration_time``
   is not called. ``iteration_time`` gets Python ints for ``prefill_tokens``,
   ``decode_seqs``, ``decode_ctx_tokens`` and ``kv_chunk_tokens``,
   ``float(copy_tokens * kv_bytes_per_token)`` for ``copy_bytes`` and, as a sixth
   positional argument, the float ``pairs`` (``prefill_ctx_tokens``, see 19).
2. Slot states. A slot is empty, *running* (holds memory; it may be *stalled* for one
   iteration, or, with chunked prefill, *partly prefilled*) or *waiting* (preempted:
   holds no memory, keeps its generated count). "Running" in the spec (batch check, drop
   rule) means running, stalled or partly prefilled slots.
3. Idle jump (step 1) only happens when no slot is occupied at all, i.e. a preempted
   slot waiting for re-admission also prevents the jump (it can be resumed now, so time
   must not skip ahead). The jump sets ``t = arrival[head]``.
4. Head and invalid rows. ``head`` is the first valid request not yet admitted or
   dropped; invalid rows are skipped when they are at the head. Candidates are the raw
   indices ``head .. head+A-1`` (clipped to N); an invalid candidate fails the checks and
   stops the walk. (Invalid rows are expected to be trailing padding, where this does
   not matter.) The loop ends when every valid request is finished or dropped, or after
   ``max_iters`` iterations.
5. Prefix rule in step 2 (s3, odma; paged: see 16). The free tokens of the target pool
   are taken at the start of step 2. Overflowing running slots (done with their prefill)
   are visited in slot order; each adds its demand (prompt+max_len) to a running sum,
   denied ones included, and is granted iff the sum <= that free amount. Memory released
   in step 2 (preempted slots' blocks, migrated slots' old blocks) is returned to the
   pools only after all of step 2, so it is not available to other step-2 grants; it is
   available to the walk of the next iteration (v0, where step 2 follows the walk) or of
   the same iteration (chunked, where step 2 precedes the walk; with a preemption there
   is no walk, see 19). For s3 (single shared pool) a migration needs prompt+max_len free
   tokens while its old block is still held (the copy needs both blocks at once).
6. ODMA stall vs preempt. A denied odma slot stalls iff some running slot holds
   large-pool memory after this iteration's migrations were granted; otherwise it is
   preempted. (With the prefix rule, a preemption then implies its prompt+max_len
   exceeds the whole large pool; see 9.)
7. The walk (step 3). Waiting slots are tried first, in queue order (paged: ascending
   ``order``, see 16; static/s3/odma: slot order), with head-of-line blocking: a slot is
   resumed iff running + admitted-so-far < max_batch, its resume reservation <= pool
   size - used - watermark (``used`` already includes this walk's reservations; 20) and
   it passes the token budget (17). Resumes are not limited by the admission window A.
   New requests are considered only when no slot is waiting after the resumes; candidate
   i is admitted iff it is valid, ``arrival[i] <= t``, a free slot exists (lowest-numbered
   first), running + admitted < max_batch, it passes the token budget and its
   reservation <= pool size - used - watermark; the first failure stops the walk.
   Resumes and new admissions alike count for the batch check, the pools, the token
   budget (including using up the first-item exemption), "nothing was admitted" (drop
   rules, v0 prefill-only iteration) and ``order``: the walk's (re)admission number
   n = 0, 1, ... in iteration ``it`` gets ``order = it * (S + A) + n``. A slot preempted
   in an iteration is never resumed in it: in v0 step 2 runs after the walk, in chunked
   mode an iteration with a preemption has no walk (19).
8. Resume reservations: paged ``ceil((ctx+1)/k)*k`` (normal pool); s3 ``prompt+max_len``
   (shared pool); odma ``prompt+max_len`` (large pool). A resumed slot recomputes its
   ``ctx = prompt + generated`` tokens from scratch (0 computed before) and produces one
   more token in the iteration that computes its last chunk (v0: the resume iteration);
   it keeps its first admission iteration, first-token time and ``r_admit``; its new
   ``order`` puts it at the tail of the running queue.
9. Dropping a waiting slot. If no slot is running when the walk starts (chunked: after
   step 2) and the walk resumed and admitted nothing, the first waiting slot in queue
   order (the one that stopped the walk; in a chunked iteration with a preemption, the
   queue's first) is dropped iff its resume reservation exceeds its pool's whole size
   less the watermark (slot freed, counted in ``dropped`` and ``unserved``). Only that
   slot is checked. Chunked mode can thus drop a slot in the iteration that preempted
   it; v0 drops it in the next iteration.
10. Dropping the head (step 3) is checked only when no slot is occupied after the walk
    (none running at its start, none waiting, nothing admitted); the head, if arrived,
    is dropped iff its reservation under the current bounds exceeds its pool's size less
    the watermark. At most one request is dropped per iteration.
11. Reservations. s3 bounds and odma quantile bounds are used as they are (no clipping to
    max_len). s3 compares ``np.float32(b_j) >= np.float32(pred)``; odma computes
    ``e = pred * (1 + gamma*u)`` in float32 and compares ``u > tau`` and
    ``np.float32(b_j) >= e`` in float32. odma-pb: odma with a gamma per bucket,
    ``gamma[k]`` for the first bound ``k`` (in level order) with ``np.float32(b_k) >=
    pred`` (the last gamma when none fits). Paged admission: ``r = ceil((prompt+1)/k)*k -
    prompt``.
12. Pools. odma large pool size is ``floor(large_share * C)`` with the product rounded
    to float32 first (``math.floor(np.float32(large_share) * np.float32(C))``: a share of
    0.45 of 200 tokens is 90, not the 89 that float64 makes of float32(0.45) * 200);
    normal is the rest. Other systems: one pool
    of C tokens, the large pool has size 0.
13. ODMA window. The ring has exactly ``window`` entries. Prior: ``prior_lengths`` if
    given (the last ``window`` entries if longer, tiled with ``np.resize`` if shorter),
    else ``np.clip(np.round(pred[:window][valid[:window]]), 1, max_len)``, tiled to
    ``window`` with ``np.resize``; values are rounded and clipped to 0..max_len as ints.
    The write pointer starts at index 0 (position 0 is the oldest) and advances by one
    (mod ``window``) per completion. Completions enter in slot order within an
    iteration; the realised length is ``output[i]``. Quantile:
    ``hist = bincount(ring, minlength=max_len+1)``; ``cdf =
    np.cumsum(hist).astype(np.float32) / np.float32(window)``; ``b_j = sum(cdf <
    np.float32(p_j))``. The completion counter is reset only when a refresh happens.
14. Completion. A slot finishes at the end of the iteration in which its generated count
    reaches ``output``; ``finish_s`` is the clock after step 5 of that iteration, and
    ``first_token_s`` the clock after step 5 of the iteration that computed its prompt's
    last chunk (v0: its first admission iteration).
15. Metrics. ``reserved_final`` = the largest reservation (prompt included) a request held
    (0 if never admitted); ``r_admit`` = output reservation at first admission (-1 if
    never admitted); ``first_token_s``/``finish_s`` are float32 arrays, NaN when absent.
    ``kv_utilization`` and ``accuracy`` are NaN with no completed request. ``tps`` =
    completed output tokens / (float(clock) - float(first valid arrival)), 0.0 if that
    span is <= 0. ``peak_kv_tokens`` and ``max_pool_use_ratio`` are sampled after steps
    2 and 3 of each iteration, before step 4 (all pools summed; ratio over pools of size
    > 0, 0.0 if none). ``stalls`` counts stalled slot-iterations; ``preemptions`` counts
    preemption events; ``migrations`` counts granted migrations; ``unserved`` = valid
    requests not completed; ``res_token_s``: see 21.
16. Paged overflow: vLLM's tail-preemption walk. The running queue is every running slot
    (partly prefilled ones included) in ascending ``order``. Walking it front to back, a
    slot done with its prefill and needing a block (ctx+1 > reserved) while the pool has
    fewer than k free tokens (pool size - used; the watermark is not subtracted) preempts
    the queue's tail (largest ``order``) again and again until k tokens are free, then
    grows by k; if it is itself the tail it preempts itself instead. A preemption frees
    the victim's blocks at once (usable by later grants of the same walk). The kept set
    is thus the longest queue prefix whose held tokens plus one block per overflowing
    member fit the pool, whatever the slot numbers. Waiting queue: vLLM v0's
    ``waiting.extendleft(preempted)``: an iteration's victims, in ascending ``order``,
    go to the front, ahead of earlier victims; a victim's ``order`` becomes
    ``-(it + 1) * (S + A) + rank`` (rank among the iteration's victims) and the waiting
    queue is sorted by it.
17. Token budget. The walk's items (resume: ctx tokens; new: prompt tokens) are checked
    in walk order; a failing item stops the walk. v0: an item passes iff the tokens of
    the earlier items plus its own are <= ``max_prefill``, or it is the walk's first item
    (exempt); items are computed whole. Chunked: the walk's budget is ``max(max_prefill -
    decoding slots, 0)`` (running, done with prefill, not stalled, counted after step 2)
    minus the partly prefilled slot's chunk; an item passes iff the earlier items' tokens
    are < that budget and computes ``min(tokens, budget - earlier tokens)``. Earlier
    items count whole, so no item passes after a cut one: at most one slot is partly
    prefilled. With a per-request cap (``prefill_cap``, vLLM V1's
    long_prefill_token_threshold) every chunk, of a partly prefilled slot or of a walk
    item, is at most the cap, and an item counts as its capped tokens: several slots
    can then be partly prefilled at once (each continues in slot order, capped).
18. Iteration order; v0 prefill-only iterations. v0: idle jump, walk (7), then, only if
    the walk resumed and admitted nothing, step 2 and the decodes; otherwise the
    iteration is prefill-only: no overflow check, no stall, no running slot decodes.
    Chunked: idle jump, step 2, the partly prefilled slot's next chunk, the walk (unless
    step 2 preempted), then every running slot done with its prefill and not stalled
    decodes (the iteration's prefill does not stop it).
19. Chunked prefill. A (re)admitted slot whose chunk is shorter than its tokens stays
    running with the rest to do: it holds its whole reservation from admission, is not
    overflow-checked and does not decode; in each later iteration it computes
    ``min(rest, max_prefill - decoding slots)`` before the walk, and produces its token
    (a new request its first) in the iteration computing its last chunk. Preempting it
    discards the computed chunks. No walk (no resume, no admission) happens in an
    iteration where step 2 preempted; the drop rules (9, 10) still apply. ``pairs`` =
    sum over this iteration's chunks c of ``c * (b + (c+1)/2)`` with b the tokens of that
    prompt (or resumed context) computed before the chunk (0 for a new or resumed slot's
    first chunk; in v0 every chunk is a whole item with b = 0).
20. Watermark (paged only; ``watermark`` tokens, ignored for the other kinds). A resume or
    admission needs its reservation <= pool size - used - watermark; growth in step 2 may
    use the watermark; both drop rules compare with pool size - watermark.
21. Reserved token-seconds. ``res_token_s`` = sum over iterations with work of the tokens
    held in all pools after steps 2 and 3 (before completions release) times
    ``float(np.float32(dt))``, accumulated in float64; 0-s iterations add nothing.
22. Per-request priorities (``priority``, lower first; None: FCFS as in 4 and 7). The
    walk's new-request candidates are the valid requests at indices ``head ..
    head + W - 1`` (``W = max(priority_window, A)``) that are neither admitted nor
    dropped and have arrived, sorted by (priority, index), the first A of them; the
    walk over them is as in 7. The drop rule 10 looks at the first of that sorted list
    instead of the head. ``head`` then moves to the first index not admitted or dropped.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["simulate_reference", "odma_quantiles", "initial_ring"]

NORMAL, LARGE = 0, 1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def odma_quantiles(ring, levels, max_len: int) -> list[int]:
    """b_j = min{x >= 0 : F(x) >= p_j} over the ring's empirical CDF (Interpretation 13)."""
    ring = np.asarray(ring, dtype=np.int64)
    hist = np.bincount(ring, minlength=max_len + 1)
    cdf = np.cumsum(hist).astype(np.float32) / np.float32(ring.shape[0])
    return [int(np.sum(cdf < np.float32(p))) for p in levels]


def initial_ring(pred, valid, *, max_len: int, window: int, prior_lengths=None) -> np.ndarray:
    """The starting contents of the ODMA window ring (Interpretation 13)."""
    if prior_lengths is None:
        pred = np.asarray(pred, dtype=np.float32)
        valid = np.asarray(valid, dtype=bool)
        sample = np.clip(np.round(pred[:window][valid[:window]]), 1, max_len)
    else:
        sample = np.asarray(prior_lengths, dtype=np.float64).reshape(-1)
        if sample.shape[0] > window:
            sample = sample[-window:]
    if sample.shape[0] == 0:
        sample = np.array([max_len])
    sample = np.clip(np.round(sample), 0, max_len).astype(np.int64)
    return np.resize(sample, window).astype(np.int64)


class _Slot:
    """One occupied slot."""

    def __init__(self, req: int):
        self.req = req
        self.state = "run"  # "run" (holds memory) or "wait" (preempted)
        self.gen = 0  # generated tokens
        self.reserved = 0  # reserved KV tokens (prompt included) while running
        self.pool = NORMAL
        self.preempted_iter = -1
        self.resume_reserved = 0
        self.resume_pool = NORMAL
        self.order = 0  # (re)admission sequence number (vLLM's queue order)
        self.todo = 0  # prefill tokens still to compute (chunked prefill)


def simulate_reference(arrival, prompt, output, pred, u, valid, *, kind, params, n_slots,
                       capacity, max_batch, max_prefill, admit_window, max_len,
                       iteration_time, kv_bytes_per_token, contiguous_chunk_tokens,
                       prior_lengths=None, window=10000, refresh_every=1000,
                       refresh_check=16, max_iters=100000, watermark=0,
                       chunked=False, large_borrow=False, prefill_cap=None,
                       priority=None, priority_window=256) -> dict:
    if kind not in ("static", "paged", "s3", "odma", "odma-pb"):
        raise ValueError(f"unknown kind {kind!r}")
    per_bucket = kind == "odma-pb"  # odma with gamma[k], k = the raw prediction's bucket
    kind = "odma" if per_bucket else kind
    arrival = np.asarray(arrival, dtype=np.float32)
    prompt = np.asarray(prompt).astype(np.int64)
    output = np.asarray(output).astype(np.int64)
    pred = np.asarray(pred, dtype=np.float32)
    u = np.asarray(u, dtype=np.float32)
    valid = np.asarray(valid, dtype=bool)
    n = arrival.shape[0]
    S = int(n_slots)
    # chunked: the prefill tokens one request computes in an iteration at most (vLLM
    # V1's long_prefill_token_threshold); None: no cap
    cap = float("inf") if prefill_cap is None else int(prefill_cap)
    C = int(capacity)
    max_len = int(max_len)

    # ---- policy parameters and pools -------------------------------------------------
    k = int(params["block_size"]) if kind == "paged" else None
    s3_bounds = [int(b) for b in params["bounds"]] if kind == "s3" else None
    if kind == "odma":
        levels = [float(p) for p in params["levels"]]
        gamma = np.asarray(params["gamma"], np.float32)
        tau = np.float32(params["tau"])
        large_size = int(math.floor(np.float32(params["large_share"]) * np.float32(C)))
        pool_size = [C - large_size, large_size]
        ring = initial_ring(pred, valid, max_len=max_len, window=int(window),
                            prior_lengths=prior_lengths)
        ring_ptr = 0
        odma_bounds = odma_quantiles(ring, levels, max_len)
        since_refresh = 0
    else:
        pool_size = [C, 0]
    used = [0, 0]
    kv_chunk = k if kind == "paged" else int(contiguous_chunk_tokens)
    # s3 migrates into its single (normal) pool, odma into the large pool.
    target_pool = LARGE if kind == "odma" else NORMAL

    def reserve(i: int) -> tuple[int, int]:
        """Output reservation r and pool for a new admission of request i."""
        if kind == "static":
            return max_len, NORMAL
        if kind == "paged":
            return _ceil_div(int(prompt[i]) + 1, k) * k - int(prompt[i]), NORMAL
        if kind == "s3":
            fitting = [b for b in s3_bounds if np.float32(b) >= pred[i]]
            return (min(fitting) if fitting else max_len), NORMAL
        # odma
        if u[i] > tau:
            return max_len, LARGE
        g = gamma
        if per_bucket:  # the raw prediction's bucket index in the sorted bounds
            fit = [j for j, b in enumerate(odma_bounds) if np.float32(b) >= pred[i]]
            g = gamma[fit[0] if fit else len(gamma) - 1]
        e = np.float32(pred[i] * (np.float32(1.0) + g * u[i]))
        fitting = [b for b in odma_bounds if np.float32(b) >= e]
        if fitting:
            return min(fitting), NORMAL
        return max_len, LARGE

    # ---- per-request outputs ---------------------------------------------------------
    admit_iter = np.full(n, -1, dtype=np.int64)
    finish_iter = np.full(n, -1, dtype=np.int64)
    first_token_s = np.full(n, np.nan, dtype=np.float32)
    finish_s = np.full(n, np.nan, dtype=np.float32)
    reserved_final = np.zeros(n, dtype=np.int64)
    r_admit = np.full(n, -1, dtype=np.int64)

    migrations = preemptions = stalls = dropped = 0
    peak_kv = 0
    max_ratio = 0.0

    slots: list[_Slot | None] = [None] * S
    t = np.float32(0.0)
    head = 0
    # with per-request priorities (Interpretation 22): requests admitted or dropped
    # ahead of the head
    taken: set[int] = set()
    prio_w = max(int(priority_window), int(admit_window))

    def by_priority() -> list[int]:
        """The waiting, arrived requests among the window's positions, lowest priority
        value first, ties by index (= arrival)."""
        pos = range(head, min(head + prio_w, n))
        ready = [i for i in pos if valid[i] and i not in taken and arrival[i] <= t]
        return sorted(ready, key=lambda i: (float(priority[i]), i))[:int(admit_window)]

    def skip_taken() -> int:
        h = head
        while h in taken:
            h += 1
        return h

    remaining = int(valid.sum())  # valid requests neither finished nor dropped
    it = 0

    def set_reserved(sl: _Slot, amount: int, pool: int) -> None:
        sl.reserved = amount
        sl.pool = pool
        used[pool] += amount
        reserved_final[sl.req] = max(reserved_final[sl.req], amount)

    wm = int(watermark) if kind == "paged" else 0  # vLLM v0 block-manager watermark
    res_token_s = 0.0

    def walk_key(s: int):
        return slots[s].order if kind == "paged" else s

    borrow = bool(large_borrow) and kind == "odma"

    def room(P: int) -> int:
        """Free tokens for a reservation in pool P (Interpretation: large_borrow)."""
        if borrow and P == LARGE:
            return pool_size[NORMAL] + pool_size[LARGE] - used[NORMAL] - used[LARGE]
        if borrow:
            return pool_size[NORMAL] - used[NORMAL] - max(used[LARGE] - pool_size[LARGE], 0)
        return pool_size[P] - used[P] - (wm if P == NORMAL else 0)

    def whole(P: int) -> int:
        """The most a reservation in pool P can ever get."""
        if borrow and P == LARGE:
            return pool_size[NORMAL] + pool_size[LARGE]
        return pool_size[P] - (wm if P == NORMAL else 0)

    def overflow_step(stalled: set, active: bool) -> tuple[int, int]:
        """Grow, migrate, stall or preempt running slots (Interpretation 5, 16).
        Returns (copy_tokens, preemptions)."""
        nonlocal migrations, stalls
        if not active or kind == "static":
            return 0, 0
        run = [s for s in range(S) if slots[s] is not None and slots[s].state == "run"
               and slots[s].todo == 0]
        overflowing = [s for s in run
                       if int(prompt[slots[s].req]) + slots[s].gen + 1 > slots[s].reserved]
        copy_tokens = n_pre = 0
        releases: list[tuple[int, int]] = []
        if kind == "paged":
            victims: list[int] = []
            queue = sorted((s for s in range(S) if slots[s] is not None
                            and slots[s].state == "run"), key=lambda s: slots[s].order)
            # vLLM: walk the queue; a request short of a block preempts the queue's tail
            keep = list(queue)
            pos = 0
            while pos < len(keep):
                s = keep[pos]
                if s in overflowing:
                    while pool_size[NORMAL] - used[NORMAL] < k and len(keep) > pos + 1:
                        victim = keep.pop()
                        _preempt(victim)
                        victims.append(victim)
                        n_pre += 1
                    if pool_size[NORMAL] - used[NORMAL] >= k:
                        sl = slots[s]
                        used[NORMAL] += k
                        sl.reserved += k
                        reserved_final[sl.req] = max(reserved_final[sl.req], sl.reserved)
                    else:
                        keep.pop()
                        _preempt(s)
                        victims.append(s)
                        n_pre += 1
                        continue
                pos += 1
            # vLLM v0 waiting.extendleft(preempted): this iteration's victims go to the
            # front of the waiting queue, in running order, ahead of earlier victims
            base = -(it + 1) * (S + int(admit_window))
            for rank, v in enumerate(sorted(victims, key=lambda v: slots[v].order)):
                slots[v].order = base + rank
            return 0, n_pre
        free = room(target_pool) if kind == "odma" else pool_size[NORMAL] - used[NORMAL]
        demand = 0
        denied = []
        for s in overflowing:
            sl = slots[s]
            need = int(prompt[sl.req]) + max_len
            demand += need
            if demand <= free:
                ctx = int(prompt[sl.req]) + sl.gen
                releases.append((sl.pool, sl.reserved))
                set_reserved(sl, need, target_pool)
                copy_tokens += ctx
                migrations += 1
            else:
                denied.append(s)
        holds_large = any(sl is not None and sl.state == "run" and sl.pool == LARGE
                          for sl in slots)
        for s in denied:
            sl = slots[s]
            if kind == "odma" and holds_large:
                stalled.add(s)
                stalls += 1
            else:
                releases.append((sl.pool, sl.reserved))
                sl.reserved = 0
                _preempt(s, release=False)
                n_pre += 1
        for pool, amount in releases:
            used[pool] -= amount
        return copy_tokens, n_pre

    def _preempt(s: int, release: bool = True) -> None:
        nonlocal preemptions
        sl = slots[s]
        ctx = int(prompt[sl.req]) + sl.gen
        if release:
            used[sl.pool] -= sl.reserved
            sl.reserved = 0
        sl.state = "wait"
        sl.todo = 0
        sl.preempted_iter = it
        if kind == "paged":
            sl.resume_reserved = _ceil_div(ctx + 1, k) * k
            sl.resume_pool = NORMAL
        else:
            sl.resume_reserved = int(prompt[sl.req]) + max_len
            sl.resume_pool = target_pool
        preemptions += 1

    while it < max_iters and remaining > 0:
        while head < n and not valid[head]:
            head += 1

        # ---- 1. idle jump -----------------------------------------------------------
        occupied = any(sl is not None for sl in slots)
        if not occupied and head < n and arrival[head] > t:
            t = arrival[head]

        stalled: set[int] = set()
        copy_tokens = 0
        chunks: dict[int, tuple[int, int]] = {}  # slot -> (tokens now, computed before)
        order0 = it * (S + int(admit_window))
        if chunked:  # running first: decodes (overflow), then the partial prefills
            copy_tokens, n_pre = overflow_step(stalled, True)
            n_dec = sum(1 for s in range(S) if slots[s] is not None
                        and slots[s].state == "run" and slots[s].todo == 0
                        and s not in stalled)
            left = max(int(max_prefill) - n_dec, 0)
            for s in range(S):
                sl = slots[s]
                if sl is not None and sl.state == "run" and sl.todo > 0 and left > 0:
                    c = min(sl.todo, cap, left)
                    total = int(prompt[sl.req]) + sl.gen
                    chunks[s] = (c, total - sl.todo)
                    sl.todo -= c
                    left -= c
            budget, exempt, allowed = left, False, n_pre == 0
        else:
            budget, exempt, allowed = int(max_prefill), True, True

        # ---- 3. the prefill walk: resumes, then new requests --------------------------
        n_running = sum(1 for sl in slots if sl is not None and sl.state == "run")
        n_admitted = 0
        resumed: list[int] = []
        blocked_wait = None
        tokens = 0  # walk tokens so far (whole items)
        first_item = True

        def token_ok(tok: int):
            """(passes, tokens computed now) under the budget (Interpretation 17)."""
            if chunked:  # a request's chunk: at most the cap, and what budget is left
                return tokens < budget, min(tok, cap, budget - tokens)
            return tokens + tok <= budget or (first_item and exempt), tok

        waiting = sorted((s for s in range(S) if slots[s] is not None
                          and slots[s].state == "wait"), key=walk_key)
        for s in waiting:
            sl = slots[s]
            P = sl.resume_pool
            ctx = int(prompt[sl.req]) + sl.gen
            ok_t, c = token_ok(ctx)
            if (allowed and ok_t and n_running + n_admitted < max_batch
                    and sl.resume_reserved <= room(P)):
                sl.state = "run"
                set_reserved(sl, sl.resume_reserved, P)
                sl.order = order0 + n_admitted
                sl.todo = ctx - c
                chunks[s] = (c, 0)
                resumed.append(s)
                tokens += min(ctx, cap) if chunked else ctx
                first_item = False
                n_admitted += 1
            else:
                blocked_wait = s
                break
        any_waiting = any(sl is not None and sl.state == "wait" for sl in slots)

        new_slots: list[int] = []
        if not any_waiting and allowed:
            free_slots = [s for s in range(S) if slots[s] is None]
            cands = (range(head, min(head + int(admit_window), n)) if priority is None
                     else by_priority())
            for i in cands:
                if not valid[i]:
                    break
                if not (arrival[i] <= t):
                    break
                if len(new_slots) >= len(free_slots):
                    break
                if not (n_running + n_admitted < max_batch):
                    break
                ok_t, c = token_ok(int(prompt[i]))
                if not ok_t:
                    break
                r, P = reserve(i)
                need = int(prompt[i]) + r
                if need > room(P):
                    break
                s = free_slots[len(new_slots)]
                sl = _Slot(i)
                slots[s] = sl
                set_reserved(sl, need, P)
                sl.order = order0 + n_admitted
                sl.todo = int(prompt[i]) - c
                chunks[s] = (c, 0)
                admit_iter[i] = it
                r_admit[i] = r
                new_slots.append(s)
                tokens += min(int(prompt[i]), cap) if chunked else int(prompt[i])
                first_item = False
                n_admitted += 1
            if priority is None:
                head += len(new_slots)
            else:
                taken.update(slots[s].req for s in new_slots)

        # drop rules (Interpretations 9 and 10)
        if n_running == 0 and n_admitted == 0:
            if blocked_wait is not None:
                sl = slots[blocked_wait]
                if sl.resume_reserved > whole(sl.resume_pool):
                    slots[blocked_wait] = None
                    dropped += 1
                    remaining -= 1
            elif not any_waiting and priority is None:
                while head < n and not valid[head]:
                    head += 1
                if head < n and arrival[head] <= t:
                    r, P = reserve(head)
                    if int(prompt[head]) + r > whole(P):
                        dropped += 1
                        remaining -= 1
                        head += 1
            elif not any_waiting:  # the first request in priority order
                first = by_priority()[:1]
                if first and int(prompt[first[0]]) + reserve(first[0])[0] \
                        > whole(reserve(first[0])[1]):
                    dropped += 1
                    remaining -= 1
                    taken.add(first[0])
        if priority is not None:
            head = skip_taken()

        if not chunked:  # v0: decode (with overflow) only if nothing was prefilled
            copy_tokens, _ = overflow_step(stalled, n_admitted == 0)
            decode_now = n_admitted == 0
        else:
            decode_now = True

        peak_kv = max(peak_kv, used[NORMAL] + used[LARGE])
        spill = max(used[LARGE] - pool_size[LARGE], 0)
        if pool_size[NORMAL] > 0:
            max_ratio = max(max_ratio, (used[NORMAL] + spill) / pool_size[NORMAL])
        if pool_size[LARGE] > 0:
            max_ratio = max(max_ratio, min(used[LARGE], pool_size[LARGE]) / pool_size[LARGE])

        # ---- 4. work ----------------------------------------------------------------
        prefill_tokens = sum(c for c, _ in chunks.values())
        pairs = sum(c * (before + (c + 1) / 2.0) for c, before in chunks.values())
        decode_seqs = 0
        decode_ctx = 0
        first_now: list[int] = []
        for s in range(S):
            sl = slots[s]
            if sl is None or sl.state != "run":
                continue
            if s in chunks:
                if sl.todo == 0:
                    if sl.gen == 0:
                        first_now.append(s)
                    sl.gen += 1
            elif s in stalled or not decode_now or sl.todo > 0:
                pass
            else:
                decode_seqs += 1
                decode_ctx += int(prompt[sl.req]) + sl.gen
                sl.gen += 1

        # ---- 5. clock ---------------------------------------------------------------
        if prefill_tokens > 0 or decode_seqs > 0:
            dt = iteration_time(int(prefill_tokens), int(decode_seqs), int(decode_ctx),
                                int(kv_chunk), float(copy_tokens * kv_bytes_per_token),
                                float(pairs))
            t = np.float32(t + np.float32(dt))
            res_token_s += float(used[NORMAL] + used[LARGE]) * float(np.float32(dt))
        for s in first_now:
            first_token_s[slots[s].req] = t

        # ---- 6. completion ----------------------------------------------------------
        for s in range(S):
            sl = slots[s]
            if sl is None or sl.state != "run" or s in stalled:
                continue
            i = sl.req
            if sl.gen == int(output[i]):
                finish_iter[i] = it
                finish_s[i] = t
                used[sl.pool] -= sl.reserved
                slots[s] = None
                remaining -= 1
                if kind == "odma":
                    ring[ring_ptr] = min(max(int(output[i]), 0), max_len)
                    ring_ptr = (ring_ptr + 1) % ring.shape[0]
                    since_refresh += 1

        # ---- 7. odma refresh --------------------------------------------------------
        if kind == "odma" and (it + 1) % int(refresh_check) == 0:
            if since_refresh >= int(refresh_every):
                odma_bounds = odma_quantiles(ring, levels, max_len)
                since_refresh = 0

        it += 1

    # ---- metrics ----------------------------------------------------------------------
    done = finish_iter >= 0
    if done.any():
        kv_util = float((prompt[done] + output[done]).sum() / reserved_final[done].sum())
        accuracy = float(np.mean(output[done] <= r_admit[done]))
    else:
        kv_util = float("nan")
        accuracy = float("nan")
    first_arrival = float(arrival[valid].min()) if valid.any() else 0.0
    span = float(t) - first_arrival
    tps = float(output[done].sum()) / span if span > 0 else 0.0
    return {
        "admit_iter": admit_iter,
        "finish_iter": finish_iter,
        "first_token_s": first_token_s,
        "finish_s": finish_s,
        "reserved_final": reserved_final,
        "r_admit": r_admit,
        "migrations": migrations,
        "preemptions": preemptions,
        "stalls": stalls,
        "dropped": dropped,
        "unserved": int((valid & ~done).sum()),
        "kv_utilization": kv_util,
        "tps": tps,
        "accuracy": accuracy,
        "peak_kv_tokens": int(peak_kv),
        "clock": float(t),
        "iterations": it,
        "max_pool_use_ratio": float(max_ratio),
        "res_token_s": res_token_s,
    }
