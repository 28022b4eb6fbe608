"""One iteration of the bucketed server: static pre-allocation, paged KV, S3 buckets, ODMA.

``step`` implements ``docs/server-semantics.md`` (steps 1-6) for every bucketed system;
the system's :class:`~models.bucketed.policies.BucketPolicy` (static: pure functions and
flags, looked up once at trace time) supplies the reservation, overflow and resume
rules, the temperature (traced) selects exact (0) or relaxed (> 0) decisions. The state
lives in ``models.bucketed.state``, the reservation rules with steps 2 and 3a in
``models.bucketed.memory``, step 3b with the drop rule in ``models.bucketed.admission``.
"""

from __future__ import annotations

import jax.numpy as jnp

from hardware import Work, work_time
from models import relax
from models.bucketed import memory
from models.bucketed.admission import Admission, Queue, admit, drop_unservable
from models.bucketed.memory import (Budget, Overflow, Resume, in_queue, overflow, pool_sizes,
                                    resume)
from models.bucketed.state import BucketAcc, BucketRecord, BucketSlots, SimState
from models.family import IterLog
from models.server import Finished, ServerConfig, cap_prefill, pack_bits
from models.workload import Workload

__all__ = ["step"]


def _idle_jump(st: SimState, wl: Workload, cfg: ServerConfig):
    """Step 1: an idle server jumps its clock to the head request's arrival. Returns the
    clock and the counts of free and waiting slots at the iteration's start."""
    n = wl.size
    head_arr = jnp.where(st.head < n, wl.arrival_s[jnp.minimum(st.head, n - 1)],
                         jnp.inf)
    # slot counts by status; the phases update them (integers: no further sums)
    n_free, n_wait = jnp.sum(st.slots.status == 0), jnp.sum(st.slots.status == 2)
    jump = (n_free == cfg.n_slots) & (head_arr > st.clock) & jnp.isfinite(head_arr)
    return jnp.where(jump, head_arr, st.clock), n_free, n_wait


def _advance(sl: BucketSlots, acc: BucketAcc, ov: Overflow, rs: Resume, ad: Admission,
             cont, pools, clock, hw, params, cfg: ServerConfig, pol):
    """Steps 4-5: the iteration's prefill chunks and decodes move the clock; a slot
    whose prefill completes (new: its first token) or that decodes generates a token.
    ``cont`` [S] are the prefill tokens a running, partly prefilled slot computes (chunked
    prefill). Returns the slot table, clock, accumulators and the tokens held per slot
    (``now``)."""
    size_n, size_l = pools
    weight, large = sl.weight, sl.large
    dec_w = jnp.where(ov.decoding, weight, 0.0)
    chunk = ad.chunk + rs.chunk + cont  # disjoint: new, resumed, continuing slots
    done_pre = jnp.where(cont > 0, sl.prompt + sl.gen - sl.todo - cont, 0).astype(
        jnp.float32)  # context already computed before a continuing chunk (else 0)
    w_pre = jnp.where(chunk > 0, weight, 0.0)
    prefill = jnp.sum(w_pre * chunk)
    pairs = jnp.sum(w_pre * chunk * (done_pre + (chunk + 1.0) / 2.0))
    dec_seqs = jnp.sum(dec_w)
    dec_ctx = jnp.sum(dec_w * ov.ctx)
    kv_chunk = pol.chunk(params, cfg)
    busy = (prefill > 0) | (dec_seqs > 0)
    work = Work(prefill, dec_seqs, dec_ctx, jnp.asarray(kv_chunk, jnp.float32),
                jnp.asarray(ov.copy_bytes, jnp.float32), pairs)
    dt = jnp.where(busy, work_time(hw, work), 0.0)
    clock = clock + dt
    finished_pre = (chunk > 0) & (sl.todo == 0)  # prefill complete: a token now
    progressed = finished_pre | ov.decoding
    first = progressed & (sl.gen == 0)
    t_first = jnp.where(first, clock, sl.t_first)
    gen = jnp.where(progressed, sl.gen + 1, sl.gen)
    now = jnp.where(sl.status == 1, sl.reserved, 0.0)
    # context whose KV is cached after the iteration (a decode writes the previous token)
    cached = jnp.where(sl.status != 1, 0,
                       jnp.where(sl.todo > 0, sl.prompt + gen - sl.todo, sl.prompt + gen - 1))
    used_l = jnp.sum(now * large)
    spill = jnp.maximum(used_l - size_l, 0.0)  # borrowed normal tokens (0 without borrow)
    use = jnp.maximum((jnp.sum(now) - used_l + spill) / size_n,
                      jnp.where(size_l > 0, jnp.minimum(used_l, size_l)
                                / jnp.maximum(size_l, 1.0), 0.0))
    acc = acc.replace(peak_kv=jnp.maximum(acc.peak_kv, jnp.sum(now)),
                      max_use=jnp.maximum(acc.max_use, use),
                      busy_s=acc.busy_s + dt, iters=acc.iters + busy,
                      res_token_s=acc.res_token_s + jnp.sum(now) * dt,
                      used_token_s=acc.used_token_s + jnp.sum(cached) * dt)
    return sl.replace(gen=gen, t_first=t_first), clock, acc, now, first, (work, busy)


def _complete(sl: BucketSlots, acc: BucketAcc, rec: BucketRecord | None, take, first,
              clock, it, n, t, cfg: ServerConfig, pol, hw):
    """Step 6: slots that generated their whole output finish and free their slot; their
    outcomes enter the accumulators, the ``Record`` (if kept) and ``Finished``."""
    status, output, weight, t_first = sl.status, sl.output, sl.weight, sl.t_first
    done = (status == 1) & (sl.gen >= output)
    wd = jnp.where(done, weight, 0.0)
    ttft = t_first - sl.arrival + hw.request_overhead_s  # as the client sees it
    tpot = jnp.where(output > 1, (clock - t_first) / jnp.maximum(output - 1, 1), 0.0)
    fit = relax.soft_ge(sl.r_admit, output.astype(jnp.float32), t, cfg.token_scale,
                        margin=0.25)
    ttft_ok = relax.soft_ge(cfg.ttft_slo_s, ttft, t, 0.1 * cfg.ttft_slo_s)
    tpot_ok = relax.soft_ge(cfg.tpot_slo_s, tpot, t, 0.1 * cfg.tpot_slo_s)
    acc = acc.replace(
        completed=acc.completed + jnp.sum(wd),
        tokens=acc.tokens + jnp.sum(wd * output),
        actual_kv=acc.actual_kv + jnp.sum(wd * (sl.prompt + output)),
        reserved_kv=acc.reserved_kv + jnp.sum(wd * sl.peak_res),
        fit=acc.fit + jnp.sum(wd * fit),
        ttft_ok=acc.ttft_ok + jnp.sum(wd * ttft_ok),
        tpot_ok=acc.tpot_ok + jnp.sum(wd * tpot_ok),
        slo_ok=acc.slo_ok + jnp.sum(wd * ttft_ok * tpot_ok),
    )
    fin = Finished(length=jnp.where(done, jnp.minimum(output, cfg.max_len), 0),
                   ttft=ttft, tpot=tpot, bits=pack_bits(done))
    sl_req = sl.req
    if rec is not None:
        ridx = jnp.where(first, sl_req, n)  # out of range -> dropped by the scatter
        first_adm = take & (rec.admit_iter[jnp.minimum(sl_req, n - 1)] < 0)
        aidx = jnp.where(first_adm, sl_req, n)
        didx = jnp.where(done, sl_req, n)
        rec = BucketRecord(
            admit_iter=rec.admit_iter.at[aidx].set(it, mode="drop"),
            finish_iter=rec.finish_iter.at[didx].set(it, mode="drop"),
            first_s=rec.first_s.at[ridx].set(clock, mode="drop"),
            finish_s=rec.finish_s.at[didx].set(clock, mode="drop"),
            reserved=rec.reserved.at[didx].set(sl.peak_res, mode="drop"),
            r_admit=rec.r_admit.at[aidx].set(sl.r_admit, mode="drop"),
        )
    order = sl.order
    if pol.priority:  # finished requests leave the running queue: close the gaps
        gone = in_queue(order, done, jnp.ones(done.shape, jnp.float32))
        order = jnp.where(status == 1, order - jnp.round(gone).astype(jnp.int32), order)
    status = jnp.where(done, 0, status)
    sl = sl.replace(req=jnp.where(status == 0, -1, sl_req), status=status,
                    reserved=jnp.where(status == 0, 0.0, sl.reserved), order=order)
    return sl, acc, fin, rec


def step(st: SimState, wl: Workload, cfg: ServerConfig, hw, params, t, pol,
         log: bool = False):
    """One continuous-batching iteration (docs/server-semantics.md): vLLM v0's default
    scheduler (an iteration prefills, resumed then new requests, or else decodes) or,
    with ``cfg.chunked``, chunked prefill (decodes first, then prefill chunks fill the
    token budget). ``log`` (static) adds the iteration's :class:`models.IterLog`."""
    pools = pool_sizes(cfg, params, pol)  # (normal, large) pool sizes in tokens
    slot = jnp.arange(cfg.n_slots, dtype=jnp.int32)
    clock, n_free, n_wait = _idle_jump(st, wl, cfg)  # 1
    sl, acc = st.slots, st.acc
    n_run0 = cfg.n_slots - n_free - n_wait
    budget_all = cfg.max_prefill.astype(jnp.float32)
    yes = jnp.ones((), bool)
    if cfg.chunked:  # running first: decodes (and overflow), then the partial prefill
        sl, acc, ov = overflow(sl, acc, pools, params, t, cfg, pol)  # 2
        left = jnp.maximum(budget_all - jnp.sum(ov.decoding), 0.0)
        part = (sl.status == 1) & (sl.todo > 0)
        want = cap_prefill(sl.todo.astype(jnp.float32), cfg)  # this step's chunk at most
        cont = jnp.where(part, jnp.minimum(want, left - _before(part, want)), 0.0)
        cont = jnp.maximum(cont, 0.0)
        sl = sl.replace(todo=sl.todo - jnp.round(cont).astype(jnp.int32))
        budget = Budget(tokens=left - jnp.sum(cont), exempt=~yes, allowed=ov.n_pre == 0)
        n_run0 = n_run0 - ov.n_pre
        n_wait = n_wait + ov.n_pre
        used = (ov.used_n, ov.used_l)
    else:
        budget = Budget(tokens=budget_all, exempt=yes, allowed=yes)
        used = memory.pool_use(sl.status == 1, sl.reserved, sl.large)
        cont = jnp.zeros(sl.reserved.shape, jnp.float32)
    sl, rs = resume(sl, n_run0, n_wait, used, pools, slot, budget, params, t, cfg,
                    pol)  # 3a
    sl, q, acc, ad = admit(  # 3b
        sl, Queue(st.head, st.taken), acc, st.win.bounds, rs, budget, n_free, pools, clock, wl,
        params, t, cfg, pol)
    if not cfg.chunked:  # v0: an iteration that prefills runs no decode
        sl, acc, ov = overflow(sl, acc, pools, params, t, cfg, pol,
                               active=rs.n_res + ad.n_adm == 0)  # 2
    sl, q, acc = drop_unservable(  # the drop rule
        sl, q, acc, rs, ad, n_run0, pools, slot, clock, cfg, pol)
    sl, clock, acc, now, first, (work, busy) = _advance(  # 4-5
        sl, acc, ov, rs, ad, cont, pools, clock, hw, params, cfg, pol)
    sl, acc, fin, rec = _complete(  # 6
        sl, acc, st.rec, ad.take, first, clock, st.it, wl.size, t, cfg, pol, hw)
    new = SimState(slots=sl, head=q.head, clock=clock, it=st.it + 1, win=st.win, acc=acc,
                   rec=rec, cfg=st.cfg, taken=q.taken)
    if log:
        return new, (jnp.sum(now), fin, IterLog(work=work, busy=busy, clock=clock))
    return new, (jnp.sum(now), fin)


def _before(mask, x):
    """For each masked slot, the sum of ``x`` over masked slots before it (slot order;
    at most one slot is partly prefilled at a time, so this is 0 in practice)."""
    xm = jnp.where(mask, x, 0).astype(jnp.float32)
    return jnp.cumsum(xm) - xm
