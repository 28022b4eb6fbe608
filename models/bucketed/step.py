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

from hardware import iteration_time
from models import relax
from models.bucketed.admission import Admission, admit, drop_unservable
from models.bucketed.memory import Overflow, Resume, overflow, pool_sizes, resume
from models.bucketed.state import BucketAcc, BucketRecord, BucketSlots, SimState
from models.server import Finished, ServerConfig, pack_bits
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
             pools, clock, hw, params, cfg: ServerConfig, pol):
    """Steps 4-5: the iteration's prefill and decode work moves the clock; every slot
    that ran generates a token. Returns the slot table, clock, accumulators and the
    tokens held per slot (``now``)."""
    size_n, size_l = pools
    take, weight, large = ad.take, sl.weight, sl.large
    dec_w = jnp.where(ov.decoding, weight, 0.0)
    prefill = (jnp.sum(jnp.where(take, weight * sl.prompt, 0.0))
               + jnp.sum(jnp.where(rs.resumed, weight * ov.ctx, 0.0)))
    dec_seqs = jnp.sum(dec_w)
    dec_ctx = jnp.sum(dec_w * ov.ctx)
    chunk = pol.chunk(params, cfg)
    busy = ad.n_adm + rs.n_res + rs.n_dec > 0
    dt = jnp.where(busy, iteration_time(hw, prefill, dec_seqs, dec_ctx, chunk,
                                        ov.copy_bytes), 0.0)
    clock = clock + dt
    progressed = take | rs.resumed | ov.decoding
    gen = jnp.where(progressed, sl.gen + 1, sl.gen)
    t_first = jnp.where(take, clock, sl.t_first)
    now = jnp.where(sl.status == 1, sl.reserved, 0.0)
    used_l = jnp.sum(now * large)
    use = jnp.maximum((jnp.sum(now) - used_l) / size_n,
                      jnp.where(size_l > 0, used_l / jnp.maximum(size_l, 1.0), 0.0))
    acc = acc.replace(peak_kv=jnp.maximum(acc.peak_kv, jnp.sum(now)),
                      max_use=jnp.maximum(acc.max_use, use),
                      busy_s=acc.busy_s + dt, iters=acc.iters + busy)
    return sl.replace(gen=gen, t_first=t_first), clock, acc, now


def _complete(sl: BucketSlots, acc: BucketAcc, rec: BucketRecord | None, take, clock, it,
              n, t, cfg: ServerConfig):
    """Step 6: slots that generated their whole output finish and free their slot; their
    outcomes enter the accumulators, the ``Record`` (if kept) and ``Finished``."""
    status, output, weight, t_first = sl.status, sl.output, sl.weight, sl.t_first
    done = (status == 1) & (sl.gen >= output)
    wd = jnp.where(done, weight, 0.0)
    ttft = t_first - sl.arrival
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
        ridx = jnp.where(take, sl_req, n)  # out of range -> dropped by the scatter
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
    status = jnp.where(done, 0, status)
    sl = sl.replace(req=jnp.where(status == 0, -1, sl_req), status=status,
                    reserved=jnp.where(status == 0, 0.0, sl.reserved))
    return sl, acc, fin, rec


def step(st: SimState, wl: Workload, cfg: ServerConfig, hw, params, t, pol):
    """One continuous-batching iteration (docs/server-semantics.md, steps 1-6)."""
    pools = pool_sizes(cfg, params, pol)  # (normal, large) pool sizes in tokens
    slot = jnp.arange(cfg.n_slots, dtype=jnp.int32)
    clock, n_free, n_wait = _idle_jump(st, wl, cfg)  # 1
    sl, acc, ov = overflow(st.slots, st.acc, pools, params, t, cfg, pol)  # 2
    sl, rs = resume(sl, ov, n_free, n_wait, pools, slot, params, t, cfg, pol)  # 3a
    sl, head, acc, ad = admit(  # 3b
        sl, st.head, acc, st.win.bounds, rs, n_free, pools, clock, wl, params, t, cfg,
        pol)
    sl, head, acc = drop_unservable(  # the drop rule
        sl, head, acc, ov, rs, ad, pools, slot, clock, cfg, pol)
    sl, clock, acc, now = _advance(  # 4-5
        sl, acc, ov, rs, ad, pools, clock, hw, params, cfg, pol)
    sl, acc, fin, rec = _complete(  # 6
        sl, acc, st.rec, ad.take, clock, st.it, wl.size, t, cfg)
    new = SimState(slots=sl, head=head, clock=clock, it=st.it + 1, win=st.win, acc=acc,
                   rec=rec)
    return new, (jnp.sum(now), fin)
