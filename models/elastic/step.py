"""One iteration of the elastic server: eLLM (unified pool, CPU buffer, Algorithms 1-2),
vLLM with its static activation reservation and vLLM with chunked prefill.

Implements ``docs/elastic-semantics.md`` (numbered steps in the comments). Structure
(who is admitted, kept, fetched) is decided by the exact comparisons at every
temperature; an admitted request's contribution is weighted by its soft gate
(``models.relax``), and Algorithm 2's buffer moves in log space by soft events when
T > 0, so the relaxed run tends to the exact one as T -> 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hardware import Work, work_time
from models import relax
from models.elastic.state import (ElasticAcc, ElasticPolicy, ElasticRecord, ElasticSlots,
                                  ElasticState, LogicalBuffer, W_MAX)
from models.family import IterLog
from models.server import finish_outcomes, nth_true

__all__ = ["Memory", "activation", "memory", "pool_tokens", "step"]

_BIG = jnp.iinfo(jnp.int32).max


class Memory(NamedTuple):
    """The run's memory model in KV tokens (see the semantics' first section)."""

    chunk: jax.Array   # c
    coef: jax.Array    # (f, h, r, z)
    pool: jax.Array    # P
    space: jax.Array   # K (static systems) or P (eLLM)
    theta: jax.Array   # eLLM's threshold in tokens; the watermark for vLLM

    def kv(self, x):
        return self.chunk * jnp.ceil(x / self.chunk)

    def act(self, tokens, rows):
        f, h, r, z = self.coef[0], self.coef[1], self.coef[2], self.coef[3]
        tokens = jnp.asarray(tokens, jnp.float32)
        rows = jnp.asarray(rows, jnp.float32)
        need = jnp.maximum(f * tokens, h * tokens + r * rows + z)
        return jnp.where(tokens > 0, self.kv(need), 0.0)


def activation(extra) -> Memory:
    """The chunk and activation model of the family inputs alone (``kv``/``act``)."""
    z = jnp.float32(0)
    return Memory(extra.chunk, extra.coef, z, z, z)


def pool_tokens(extra, cfg):
    """The pool: the deployment's KV capacity plus vLLM's activation reservation at
    (``max_prefill``, ``max_batch``), in KV tokens."""
    return cfg.capacity_tokens + activation(extra).act(
        cfg.max_prefill, cfg.max_batch.astype(jnp.float32))


def memory(extra, cfg, params, pol: ElasticPolicy) -> Memory:
    """Pool, KV space and threshold of a system on a server config."""
    m = activation(extra)
    pool = pool_tokens(extra, cfg)
    if pol.unified:
        return m._replace(pool=pool, space=pool, theta=params["theta"] * pool)
    budget = params["chunk"] if pol.chunked else cfg.max_prefill
    return m._replace(pool=pool, space=pool - m.act(budget, cfg.max_batch.astype(
        jnp.float32)), theta=cfg.watermark_tokens)


def _sorted_slots(sl: ElasticSlots):
    """Slot indices by running-queue order (occupied slots first)."""
    return jnp.argsort(jnp.where(sl.status > 0, sl.order, _BIG))


def _keep(sl: ElasticSlots, mem: Memory, perm, pol: ElasticPolicy):
    """Step 3/4 decode growth. vLLM: the longest prefix (in order) of resident slots
    whose needs fit the KV space; the rest are preempted. eLLM (Algorithm 1's decode
    walk): the longest prefix whose growth and activation fit the free pool decodes,
    the rest stall holding their KV; only when not even the first fits does vLLM's
    preemption rule apply. Returns (keep, preempt, decoders, need) per slot."""
    res = sl.status == 1
    dec = res & (sl.todo == 0) & (sl.gen >= 1)
    need = jnp.where(dec, mem.kv((sl.prompt + sl.gen).astype(jnp.float32)),
                     jnp.where(res, sl.kv, 0.0))
    res_s, dec_s = res[perm], dec[perm]
    n_dec = jnp.cumsum(dec_s.astype(jnp.float32))
    a_dec = mem.act(n_dec, n_dec) if pol.unified else 0.0

    def prefix(ok, mask):
        keep_s = jnp.cumprod((ok | ~mask).astype(jnp.int32)).astype(bool) & mask
        return jnp.zeros_like(res).at[perm].set(keep_s)

    cut = prefix(jnp.cumsum(need[perm]) + a_dec <= mem.space, res_s)
    if not pol.unified:
        return cut, res & ~cut, dec, need
    held = jnp.sum(jnp.where(res, sl.kv, 0.0))
    grow = jnp.cumsum(jnp.where(dec_s, need[perm] - sl.kv[perm], 0.0))
    run = prefix(held + grow + a_dec <= mem.pool, dec_s)
    stuck = ~jnp.any(run) & jnp.any(dec)
    keep = jnp.where(stuck, cut, run | (res & ~dec))
    return keep, jnp.where(stuck, res & ~cut, False), dec, need


def _fetch(sl: ElasticSlots, mem: Memory, perm, keep, preempt, dec, need):
    """Step 3, eLLM: host slots in order are fetched while the pool keeps ``theta``
    free after the residents' KV (grown for the decoders), the decoders' activation and
    the fetched KV."""
    hst = sl.status == 3
    fneed = jnp.where(hst, mem.kv((sl.prompt + sl.gen).astype(jnp.float32)), 0.0)
    hst_s = hst[perm]
    run = keep & dec
    n_run = jnp.sum(run).astype(jnp.float32)
    held = jnp.sum(jnp.where(run, need, jnp.where((sl.status == 1) & ~preempt, sl.kv,
                                                    0.0)))
    m = jnp.cumsum(hst_s.astype(jnp.float32))
    room = mem.pool - held - jnp.cumsum(fneed[perm]) - mem.act(n_run + m, n_run + m)
    ok = (room >= mem.theta) | ~hst_s
    fetch_s = jnp.cumprod(ok.astype(jnp.int32)).astype(bool) & hst_s
    return jnp.zeros_like(hst).at[perm].set(fetch_s), fneed


class _Cands(NamedTuple):
    is_pre: jax.Array   # [A] bool a preempted slot (else a new request)
    slot: jax.Array     # [A] int32 its slot (preempted) or target free slot (new; S none)
    req: jax.Array      # [A] int32
    tokens: jax.Array   # [A] float32 prefill tokens T_i
    present: jax.Array  # [A] bool arrived, valid, has a slot
    prompt: jax.Array
    output: jax.Array
    gen: jax.Array
    arrival: jax.Array


def _candidates(sl: ElasticSlots, head, clock, wl, cfg, perm, blocked) -> _Cands:
    """Step 2's candidates: preempted slots in order, then new requests from the head."""
    a, n, n_slots = cfg.admit_window, wl.size, cfg.n_slots
    pre = (sl.status == 2) & ~blocked
    pre_s = pre[perm]
    rank = jnp.cumsum(pre_s.astype(jnp.int32)) - 1
    pre_slot = jnp.full(a, n_slots, jnp.int32).at[jnp.where(pre_s, rank, a)].set(
        perm.astype(jnp.int32), mode="drop")
    n_pre = jnp.minimum(jnp.sum(pre), a)
    j = jnp.arange(a, dtype=jnp.int32)
    is_pre = j < n_pre
    new = head + j - n_pre
    nc = jnp.clip(new, 0, n - 1)
    free_slot = nth_true(sl.status == 0, jnp.maximum(j - n_pre, 0))
    ps = jnp.minimum(pre_slot, n_slots - 1)
    slot = jnp.where(is_pre, pre_slot, free_slot)
    prompt = jnp.where(is_pre, sl.prompt[ps], wl.prompt_tokens[nc])
    gen = jnp.where(is_pre, sl.gen[ps], 0)
    present = jnp.where(is_pre, True, (new < n) & wl.valid[nc] & (wl.arrival_s[nc] <= clock)
                        & (free_slot < n_slots))
    return _Cands(is_pre=is_pre, slot=slot, req=jnp.where(is_pre, sl.req[ps], nc),
                  tokens=(prompt + gen).astype(jnp.float32), present=present,
                  prompt=prompt, output=jnp.where(is_pre, sl.output[ps],
                                                  wl.output_tokens[nc]),
                  gen=gen, arrival=jnp.where(is_pre, sl.arrival[ps], wl.arrival_s[nc]))


def _walk(c: _Cands, mem: Memory, used, host_used, buf_size, n_run, budget, exempt, go0,
          t, cfg, pol: ElasticPolicy):
    """Step 2's admission walk (Algorithm 1 for eLLM): sequential over the candidates,
    stopping at the first failure. Returns per candidate (admitted, to the host, weight,
    tokens prefilled now)."""
    scale = cfg.token_scale

    def body(carry, x):
        go, n_adm, m_kv, m_host, t_cum, r_cum, left = carry
        tok, present = x
        kv_i = mem.kv(tok)
        batch_ok = n_run + n_adm < cfg.max_batch
        if pol.chunked:
            tok_ok = left > 0
            take = jnp.minimum(tok, left)
        else:
            tok_ok = (exempt & (n_adm == 0)) | (t_cum + tok <= budget)
            take = tok
        if pol.unified:
            m_act = mem.act(t_cum + tok, r_cum + 1.0)
            free = mem.pool - used
            x_res = free - (m_kv + kv_i + m_act)
            ok_res = x_res >= mem.theta
            w_res = relax.soft_ge(x_res, mem.theta, t, scale, margin=0.25)
            if pol.offload:
                x_off = free - (m_kv + m_act)
                room = buf_size - host_used - m_host - kv_i
                ever = mem.pool - mem.theta - mem.kv(tok + 1.0) - mem.act(tok, 1.0)
                ok_off = (x_off >= mem.theta) & (room >= 0) & (ever >= 0)
                w_off = (relax.soft_ge(x_off, mem.theta, t, scale, margin=0.25)
                         * relax.soft_ge(room, 0.0, t, scale, margin=0.25))
            else:
                ok_off, w_off = jnp.zeros((), bool), jnp.zeros(())
        else:
            x_res = mem.space - mem.theta - used - m_kv - kv_i
            ok_res = x_res >= 0
            w_res = relax.soft_ge(x_res, 0.0, t, scale, margin=0.25)
            ok_off, w_off = jnp.zeros((), bool), jnp.zeros(())
        ok = go & present & batch_ok & tok_ok & (ok_res | ok_off)
        host = ok & ~ok_res
        w = jnp.where(ok, jnp.where(host, w_off, w_res), 0.0)
        carry = (ok, n_adm + ok, m_kv + jnp.where(ok & ~host, kv_i, 0.0),
                 m_host + jnp.where(host, kv_i, 0.0), t_cum + jnp.where(ok, tok, 0.0),
                 r_cum + ok, left - jnp.where(ok, take, 0.0))
        return carry, (ok, host, w, jnp.where(ok, take, 0.0))

    init = (go0, jnp.int32(0), jnp.float32(0), jnp.float32(0), jnp.float32(0),
            jnp.float32(0), jnp.asarray(budget, jnp.float32))
    _, out = jax.lax.scan(body, init, (c.tokens, c.present))
    return out


def _never_fits(c: _Cands, mem: Memory, pol: ElasticPolicy):
    """Step 5: the first candidate could not be admitted into an empty server."""
    kv0 = mem.kv(c.tokens[0])
    if pol.unified:
        return kv0 + mem.act(c.tokens[0], 1.0) > mem.pool - mem.theta
    return kv0 > mem.space - mem.theta


def buffer_bounds(extra, params, kv_bytes):
    """Algorithm 2's floor and ceiling of the logical buffer, in tokens: one buffer unit
    (``buffer_unit_mib``, capped at the ceiling) and ``B_max = cpu_buffer_gib``."""
    gib = jnp.float32(2.0 ** 30)
    b_max = params["cpu_buffer_gib"] * gib / kv_bytes
    return jnp.minimum(extra.buf_unit_mib * jnp.float32(2.0 ** 20) / kv_bytes, b_max), b_max


def _buffer(buf: LogicalBuffer, miss_ttft, miss_tpot, params, bounds, t):
    """Step 8, Algorithm 2: violation events over the last ``w`` iterations move the
    logical buffer by the factor ``a`` (log space, soft events, when T > 0)."""
    ttft = jnp.concatenate([miss_ttft[None], buf.ttft_ring[:-1]])
    tpot = jnp.concatenate([miss_tpot[None], buf.tpot_ring[:-1]])
    in_w = (jnp.arange(W_MAX, dtype=jnp.float32) < params["w"]).astype(jnp.float32)
    k = params["k"]
    e_tpot = relax.soft_ge(jnp.sum(tpot * in_w), k, t, 1.0, margin=0.5)
    e_ttft = relax.soft_ge(jnp.sum(ttft * in_w), k, t, 1.0, margin=0.5)
    a, size = params["a"], buf.size
    floor, b_max = bounds
    up, down = e_ttft * (1.0 - e_tpot), e_tpot
    soft = jnp.clip(size * jnp.exp(jnp.log(a) * (up - down)), floor, b_max)
    hard = jnp.where(e_tpot >= 0.5, jnp.maximum(size / a, floor),
                     jnp.where(e_ttft >= 0.5, jnp.minimum(size * a, b_max), size))
    size = jnp.where(t > 0, soft, hard)
    clear = jnp.where(t > 0, 1.0 - (up + down),
                      jnp.where((e_tpot >= 0.5) | (e_ttft >= 0.5), 0.0, 1.0))
    return buf.replace(size=size, ttft_ring=ttft * clear, tpot_ring=tpot * clear), (
        jnp.where(t > 0, down, e_tpot >= 0.5), jnp.where(t > 0, up, (e_ttft >= 0.5)
                                                         & (e_tpot < 0.5)))


def step(st: ElasticState, inputs, hw, params, t, pol: ElasticPolicy, log: bool = False):
    """One iteration (docs/elastic-semantics.md steps 1-9)."""
    wl, cfg = inputs.wl, inputs.cfg
    mem = memory(inputs.extra, cfg, params, pol)
    sl, acc, buf = st.slots, st.acc, st.buf
    n, n_slots = wl.size, cfg.n_slots
    f32 = jnp.float32
    # 1 idle jump
    head_arr = jnp.where(st.head < n, wl.arrival_s[jnp.minimum(st.head, n - 1)], jnp.inf)
    idle = ~jnp.any(sl.status > 0)
    clock = jnp.where(idle & (head_arr > st.clock) & jnp.isfinite(head_arr), head_arr,
                      st.clock)
    perm = _sorted_slots(sl)
    res0 = sl.status == 1
    n_run0 = jnp.sum((sl.status == 1) | (sl.status == 3))
    host_used = jnp.sum(sl.host)
    keep, preempt, dec, need = _keep(sl, mem, perm, pol)
    slot = jnp.arange(n_slots, dtype=jnp.int32)
    if pol.chunked:  # 4: decoders first, then continuing prefills, then the walk
        any_pre = jnp.any(preempt)
        left = params["chunk"] - jnp.sum(keep & dec)
        part = keep & (sl.todo > 0)
        todo_s = jnp.where(part, sl.todo, 0)[perm].astype(f32)
        before = jnp.cumsum(todo_s) - todo_s
        cont_s = jnp.clip(left - before, 0.0, todo_s)
        cont = jnp.zeros(n_slots, f32).at[perm].set(cont_s)
        used = jnp.sum(jnp.where(keep, need, 0.0))
        c = _candidates(sl, st.head, clock, wl, cfg, perm, preempt)
        adm, host, w, take = _walk(c, mem, used, host_used, buf.size, n_run0 - jnp.sum(
            preempt), left - jnp.sum(cont), False, ~any_pre, t, cfg, pol)
    else:  # 2-3: the walk; a decode iteration only if it admitted nobody
        cont = jnp.zeros(n_slots, f32)
        used = jnp.sum(jnp.where(res0, sl.kv, 0.0))
        c = _candidates(sl, st.head, clock, wl, cfg, perm, jnp.zeros(n_slots, bool))
        adm, host, w, take = _walk(c, mem, used, host_used, buf.size, n_run0,
                                   cfg.max_prefill, True, jnp.ones((), bool), t, cfg, pol)
        decode = ~jnp.any(adm)
        keep = keep & decode
        preempt = preempt & decode
    n_adm = jnp.sum(adm)
    if pol.offload and not pol.chunked:
        fetch, fneed = _fetch(sl, mem, perm, keep, preempt, dec, need)
        fetch = fetch & decode
    else:
        fetch, fneed = jnp.zeros(n_slots, bool), jnp.zeros(n_slots, f32)
    # 5 drop rule
    n_run = n_run0 - jnp.sum(preempt) if pol.chunked else n_run0
    drop = (n_run == 0) & (n_adm == 0) & c.present[0] & _never_fits(c, mem, pol)
    drop_pre = drop & c.is_pre[0]
    # place the admitted candidates (new ones into free slots)
    kv_i = mem.kv(c.tokens)
    dst = jnp.where(adm, c.slot, n_slots + jnp.arange(c.slot.shape[0], dtype=jnp.int32))

    def put(x, old):
        return old.at[dst].set(x, mode="drop", unique_indices=True)

    zero = jnp.zeros(n_slots, f32)
    placed = put(jnp.ones_like(adm), jnp.zeros(n_slots, bool))
    chunk_new = put(take, zero)
    todo_new = put(jnp.round(c.tokens - take).astype(jnp.int32), sl.todo)
    host_new = put(host, jnp.zeros(n_slots, bool))
    placed_new = placed & ~put(c.is_pre, jnp.zeros(n_slots, bool))  # first admissions
    order = put(st.counter + jnp.arange(c.slot.shape[0], dtype=jnp.int32), sl.order)
    sl2 = sl.replace(
        req=put(c.req, sl.req), prompt=put(c.prompt, sl.prompt),
        output=put(c.output, sl.output), gen=put(c.gen, sl.gen),
        status=jnp.where(placed, jnp.where(host_new, 3, 1), sl.status),
        kv=jnp.where(placed, jnp.where(host_new, 0.0, put(kv_i, zero)), sl.kv),
        host=jnp.where(placed & host_new, put(kv_i, zero), sl.host),
        weight=put(w, sl.weight), arrival=put(c.arrival, sl.arrival),
        t_admit=jnp.where(placed_new, clock, sl.t_admit),
        todo=todo_new, order=order)
    # 4-6: what this iteration computes
    dec_run = (keep & dec) | fetch
    pre_tok = chunk_new + cont
    done_before = jnp.where(cont > 0, (sl.prompt + sl.gen - sl.todo).astype(f32), 0.0)
    pairs = jnp.sum(pre_tok * (done_before + (pre_tok + 1.0) / 2.0))
    prefill = jnp.sum(pre_tok)
    dec_seqs = jnp.sum(dec_run).astype(f32)
    dec_ctx = jnp.sum(jnp.where(dec_run, sl.prompt + sl.gen, 0)).astype(f32)
    busy = (prefill > 0) | (dec_seqs > 0)
    work = Work(prefill, dec_seqs, dec_ctx, mem.chunk, f32(0.0), pairs)
    off_tok = jnp.sum(jnp.where(host, kv_i, 0.0))
    fetch_tok = jnp.sum(jnp.where(fetch, sl.host, 0.0))  # what crosses the link
    link = hw.host_link_bw
    dt = jnp.maximum(jnp.where(busy, work_time(hw, work), 0.0),
                     jnp.maximum(off_tok * cfg.kv_bytes_per_token / link,
                                 fetch_tok * cfg.kv_bytes_per_token / link))
    clock = clock + dt
    cont_done = (cont > 0) & (sl2.todo - jnp.round(cont).astype(jnp.int32) == 0)
    todo = sl2.todo - jnp.round(cont).astype(jnp.int32)
    progressed = dec_run | cont_done | (placed & (todo == 0))
    rows = jnp.sum(dec_run | (pre_tok > 0)).astype(f32)
    first = progressed & (sl2.gen == 0)
    gen = jnp.where(progressed, sl2.gen + 1, sl2.gen)
    status = jnp.where(fetch, 1, jnp.where(preempt, 2, sl2.status))
    kv = jnp.where(preempt, 0.0, jnp.where(dec_run, jnp.where(fetch, fneed, need), sl2.kv))
    host_kv = jnp.where(fetch, 0.0, sl2.host)
    t_first = jnp.where(first, clock, sl2.t_first)
    sl3 = sl2.replace(gen=gen, status=status, kv=kv, host=host_kv, t_first=t_first,
                      todo=todo)
    # accounting before completion frees memory
    resident = jnp.sum(jnp.where(status == 1, kv, 0.0))
    held_host = jnp.sum(host_kv)
    act_it = mem.act(prefill + dec_seqs, rows) if pol.unified else 0.0
    use = (resident + act_it) / mem.pool if pol.unified else resident / mem.space
    owned = buf.owned
    inflate = pol.unified & (resident > owned)
    owned = jnp.maximum(owned, resident) if pol.unified else owned
    deflate = pol.unified & (act_it > mem.pool - owned)
    owned = jnp.where(deflate, mem.pool - act_it, owned)
    w_host = jnp.where(host, w, 0.0)
    acc = acc.replace(
        preemptions=acc.preemptions + jnp.sum(preempt), dropped=acc.dropped + drop,
        stalls=acc.stalls + jnp.sum(dec & ~dec_run & ~preempt & (dec_seqs > 0)),
        queue_s=acc.queue_s + jnp.sum(jnp.where(adm & ~c.is_pre, w * (clock - dt
                                                                   - c.arrival), 0.0)),
        peak_kv=jnp.maximum(acc.peak_kv, resident), max_use=jnp.maximum(acc.max_use, use),
        busy_s=acc.busy_s + dt, iters=acc.iters + busy,
        res_token_s=acc.res_token_s + resident * dt,
        offloads=acc.offloads + jnp.sum(w_host), offload_tokens=acc.offload_tokens + off_tok,
        fetch_tokens=acc.fetch_tokens + fetch_tok, inflations=acc.inflations + inflate,
        deflations=acc.deflations + deflate,
        peak_inflated=jnp.maximum(acc.peak_inflated, owned - cfg.capacity_tokens),
        peak_host=jnp.maximum(acc.peak_host, held_host),
        peak_gpu=jnp.maximum(acc.peak_gpu, resident + act_it),
        max_dec_batch=jnp.maximum(acc.max_dec_batch, dec_seqs),
        dec_tokens=acc.dec_tokens + dec_seqs,
        dec_busy_s=acc.dec_busy_s + jnp.where(dec_seqs > 0, dt, 0.0))
    # 7 completion
    sl3, acc, fin, rec, ttft, done = _complete(
        sl3, acc, st.rec, placed_new, first,
        progressed, host_new & placed, clock, st.it, n, t, cfg, hw)
    # 5 drop: a new head request is skipped, a preempted slot freed
    ps = jnp.minimum(c.slot[0], n_slots - 1)
    sl3 = sl3.replace(status=jnp.where(drop_pre & (slot == ps), 0, sl3.status),
                      req=jnp.where(drop_pre & (slot == ps), -1, sl3.req))
    head = st.head + jnp.sum(adm & ~c.is_pre) + (drop & ~c.is_pre[0])
    # 8 Algorithm 2, 9 ownership
    if pol.offload:
        # an iteration is a TTFT (TPOT) miss when any request missed in it (soft: the
        # probability that at least one did): a first token late, or the oldest waiting
        # request already past the TTFT SLO; a request finishing with its TPOT (the mean
        # over its decode) above the TPOT SLO
        p_ttft = jnp.where(first, relax.soft_gt(ttft, cfg.ttft_slo_s, t,
                                                0.1 * cfg.ttft_slo_s), 0.0)
        hq = jnp.minimum(head, n - 1)
        waiting = (head < n) & wl.valid[hq] & (wl.arrival_s[hq] <= clock)
        waited = clock - wl.arrival_s[hq] + hw.request_overhead_s
        p_wait = jnp.where(waiting, relax.soft_gt(waited, cfg.ttft_slo_s, t,
                                                  0.1 * cfg.ttft_slo_s), 0.0)
        p_tpot = jnp.where(done, relax.soft_gt(
            fin.tpot, cfg.tpot_slo_s, t, 0.1 * cfg.tpot_slo_s), 0.0)
        miss_ttft = 1.0 - jnp.prod(1.0 - p_ttft) * (1.0 - p_wait)
        miss_tpot = 1.0 - jnp.prod(1.0 - p_tpot)
        buf, (e_tpot, e_ttft) = _buffer(
            buf, miss_ttft, miss_tpot, params,
            buffer_bounds(inputs.extra, params, cfg.kv_bytes_per_token), t)
        acc = acc.replace(tpot_events=acc.tpot_events + e_tpot,
                          ttft_events=acc.ttft_events + e_ttft)
    buf = buf.replace(owned=owned)
    new = ElasticState(slots=sl3, head=head, clock=clock, it=st.it + 1,
                       counter=st.counter + n_adm.astype(jnp.int32), buf=buf, acc=acc,
                       rec=rec)
    out = (resident + (act_it if pol.unified else 0.0), fin)
    if log:
        return new, out + (IterLog(work=work, busy=busy, clock=clock),)
    return new, out


def _complete(sl: ElasticSlots, acc: ElasticAcc, rec, admitted_new, first, progressed,
              offloaded, clock, it, n, t, cfg, hw):
    """Step 7: finished slots free everything; outcomes enter the accumulators, the
    record and ``Finished``. Also returns each slot's TTFT and the finished mask."""
    done = ((sl.status == 1) | (sl.status == 3)) & (sl.gen >= sl.output)
    acc, fin = finish_outcomes(acc, sl, done, clock, t, cfg, hw)
    ttft = fin.ttft
    if rec is not None:
        req = sl.req
        aidx = jnp.where(admitted_new, req, n)
        rec = ElasticRecord(
            admit_iter=rec.admit_iter.at[aidx].set(it, mode="drop"),
            finish_iter=rec.finish_iter.at[jnp.where(done, req, n)].set(it, mode="drop"),
            first_s=rec.first_s.at[jnp.where(first, req, n)].set(clock, mode="drop"),
            finish_s=rec.finish_s.at[jnp.where(done, req, n)].set(clock, mode="drop"),
            offloaded=rec.offloaded.at[jnp.where(offloaded, req, n)].set(1.0, mode="drop"))
    status = jnp.where(done, 0, sl.status)
    sl = sl.replace(status=status, req=jnp.where(done, -1, sl.req),
                    kv=jnp.where(done, 0.0, sl.kv), host=jnp.where(done, 0.0, sl.host))
    return sl, acc, fin, rec, ttft, done
