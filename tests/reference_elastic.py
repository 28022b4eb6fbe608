"""Independent NumPy event-loop reference of the elastic family (``ellm``, ``vllm``,
``vllm-cp``).

This file implements ``docs/elastic-semantics.md`` (exact mode) literally, with plain
Python loops over iterations, slots and candidates. It must not import anything from
``models/`` or ``tuner/``: it exists to check the JAX implementation independently
(numpy and the standard library only).

Interpretations
---------------
Where the spec leaves a choice open, this reference does the following. The JAX side
should be aligned with these.

1. Numbers. The clock starts at ``np.float32(0)`` and adds ``np.float32`` step times;
   arrivals are compared as ``arrival[i] <= t`` in float32. All memory amounts (``P``,
   ``K``, ``K0``, ``theta_tok``, ``used``, ``M_kv``, ``M_act``, ``M_host``, host tokens,
   needs, ``B_logic``, ``B_max``, owned tokens) are ``np.float32`` and every sum or
   difference is evaluated in float32, left to right, in exactly the form the spec
   writes it (e.g. ``F - (M_kv + KV_i + M_act) >= theta_tok`` with ``F = P - used``,
   ``M_kv + KV_i`` first). ``kv(x) = c * ceil(x / c)`` is computed exactly in integers
   and then converted to float32; ``act(T, R)`` is ``c * ceil(max(f*T, h*T + r*R + z) /
   c)`` with every operation in float32 (``T``, ``R`` converted to float32; ``h*T +
   r*R`` first, then ``+ z``) and 0 for ``T <= 0``. ``theta_tok = f32(theta) * f32(P)``;
   ``B_max = f32(cpu_buffer_gib) * f32(2**30) / f32(kv_bytes)``.
2. Token budgets. ``max_prefill`` is compared as a Python float with the integer token
   sums (``sum T + T_i <= max_prefill``); ``K = P - act(B, max_batch)`` uses
   ``B = max_prefill`` (vllm) or ``params["chunk"]`` (vllm-cp) as float32 in ``act``. The
   vllm-cp per-iteration budget is ``floor(chunk)`` tokens (an int); ``watermark_tokens``
   is a float32 amount subtracted from ``K`` (ellm ignores it).
3. Queue head and invalid rows. ``head`` is the first valid request not yet admitted or
   dropped (invalid rows at the head are skipped). New candidates are the raw indices
   ``head, head+1, ...``; an invalid or not yet arrived candidate fails and stops the
   walk. The candidates are the preempted slots (status 2) in ascending ``order``, then
   new requests, at most ``admit_window`` in all (preempted slots count). A new request
   takes the lowest-numbered empty slot (the slot number has no other effect).
4. Idle jump. Only when every slot is empty (no status 1, 2 or 3) and ``arrival[head] >
   t``: ``t = arrival[head]``. The iteration counter advances once per pass through the
   loop, whether or not anything is computed; ``iterations`` counts only the passes that
   computed something (``iteration_time`` was called).
5. Admission bookkeeping. ``admit_iter`` is the iteration of a request's first
   admission. Each (re)admission, resident or to the host, gets ``order = n`` from a
   run-wide counter starting at 0 (walk order within an iteration); a fetch, a
   preemption or a chunk of a continuing prefill does not change ``order``. A preempted
   slot keeps its ``order`` while it waits (the spec's "preempted slots wait in
   ``order``"), so the waiting queue is the preempted slots by ascending old ``order``.
   A recompute (re-admission of a preempted slot) prefills ``T = p + gen`` tokens from
   scratch (``y = 0`` for the pairs) and produces one token (``gen += 1``) in the
   iteration that computes its last prefill token; ``admit_iter`` and ``first_token_s``
   keep their first values. A preempted slot may be re-admitted to the host (ellm).
6. "Running" in the batch test is the number of slots with status 1 or 3 at the start
   of the walk (vllm-cp: after its keep/preempt step; partly prefilled slots included),
   plus the candidates admitted so far (resident or host).
7. Keep/preempt (step 3, also first part of step 4). The running queue is every
   resident slot in ascending ``order``; a slot done with its prefill needs
   ``n_j = kv(p + gen)``, a partly prefilled (vllm-cp) slot needs its ``kv``. The kept
   set is the largest ``m`` with ``sum(n_1..n_m) + A_dec(m) <= S`` (prefix sums in
   float32; ``A_dec(m) = act(m, m)`` for ellm, 0 otherwise; ``S = P`` ellm, ``K``
   otherwise, no watermark); every resident slot after it is preempted (status 2,
   ``kv = 0``, ``todo = 0`` (computed chunks discarded), ``gen`` kept, one preemption
   each). In vllm-cp the partly prefilled slot is therefore part of the queue (it is
   always the queue's tail, see 11) and can be preempted. ``A_dec`` counts the kept
   slots of the prefix, including a partly prefilled one (ellm has none).
7b. ellm decode iterations (docs step 3): resident slots in ``order`` decode while
   ``U + sum(growth over the prefix) + act(m, m) <= P`` (``U`` = resident KV at that
   point, growth = ``kv(p + gen) - kv``); the rest stall holding their KV (``stalls``
   counts them). Only when not even the first fits does the keep/preempt rule of 7 apply
   (cap P, ``A_dec`` = act). The fetch test's ``H`` is the decoders' needs plus the
   stalled slots' KV.
8. vllm-cp growth is allocated when a decoder is kept: its ``kv`` becomes ``n_j`` at the
   keep step, before the continuing prefills and the walk (vLLM's ``append_slots``
   precedes prefill scheduling), so the walk's ``used`` includes the decoders' growth.
   (vllm and ellm: the walk comes before any decode, ``used`` is the ``kv`` held at the
   iteration's start.) Thus resident KV never exceeds ``K`` in vllm and vllm-cp.
9. vllm-cp walk blocking: any preemption in step 4 (a decoder's or the partly
   prefilled slot's) blocks the walk for that iteration, as vLLM v0 schedules prefills
   only when nothing was preempted. The budget is ``floor(chunk) -
   decoders`` with ``decoders`` = kept slots done with their prefill; continuing
   prefills (status 1, ``todo > 0``) in ``order`` take ``min(todo, left)`` while
   ``left > 0``; the walk's token test is ``left > 0`` and a candidate computes
   ``min(T_i, left)``; its whole ``KV_i`` is allocated at admission (``kv = KV_i``).
10. ellm Algorithm 1. ``used`` = resident ``kv`` at the walk's start, ``host_used`` =
    host tokens at the iteration's start. ``M_act = act(T_cum + T_i, R_cum + 1)`` over
    all candidates admitted so far in the walk. A host admission prefills on the GPU
    (its tokens and activation count) and sends ``KV_i`` tokens to the host in the same
    iteration (``offload_tokens``); the request's ``offloaded`` flag is set even if it
    finishes in that iteration (``o == 1`` or a recompute reaching ``o``), in which case
    its host tokens are freed at completion and never fetched.
11. ellm fetch (decode iterations only): ``theta`` in the fetch test is ``theta_tok``;
    "fetched so far" is the summed ``kv(p_j + gen_j)`` of the slots fetched before;
    ``fetch_tokens`` counts the slot's ``host`` tokens (what crosses the link), the GPU
    then holds ``kv(p_j + gen_j)`` (its decode need). An offload requires
    ``kv(T_i + 1) + act(T_i, 1) <= P - theta_tok`` (docs), so a host slot alone can
    always be fetched for its first decode.
12. Drop rule (step 5) is evaluated right after the walk (vllm/ellm: before any decode;
    vllm-cp: after the keep/preempt step, continuing prefills and the walk). It needs:
    no slot with status 1 or 3 at that point, nothing admitted in the walk; the first
    candidate is the first preempted slot in ``order`` that was not preempted in this
    iteration, else the head request if valid and arrived. It is dropped iff ``KV_i >
    K - watermark`` (vllm, vllm-cp) or ``KV_i + act(T_i, 1) > P - theta_tok`` (ellm),
    whatever made the walk stop (in particular also when the walk was blocked by a
    vllm-cp preemption). At most one drop per iteration. A dropped new request keeps
    ``admit_iter = -1``; a dropped preempted slot keeps its ``admit_iter`` and
    ``first_token_s``.
13. Work and time. ``pairs`` = sum over the iteration's prefill chunks of ``x * (y + (x
    + 1) / 2)`` (Python float); ``decode_ctx`` = sum of ``p + gen`` (before the
    increment) over decoding slots (kept residents done with their prefill, plus
    fetched slots). ``iteration_time(prefill_tokens, decode_seqs, decode_ctx, c, 0.0,
    pairs)`` is called with Python ints/floats only when ``prefill_tokens + decode_seqs
    > 0``; otherwise the step is 0 s. The step is ``max(f32(compute), f32(off) *
    f32(kv_bytes) / f32(bw), f32(fetch) * f32(kv_bytes) / f32(bw))`` (tokens as
    float32), ``t = f32(t + step)``.
14. Timestamps. ``first_token_s`` / ``finish_s`` are the clock after the step of the
    iteration that produced the first / last token. TTFT = ``f32(first - arrival) +
    f32(request_overhead_s)``, TPOT = ``f32(finish - first) / f32(o - 1)`` (0 for
    ``o == 1``), all float32; ``ttft_ok``, ``tpot_ok``, ``slo_ok`` count finished
    requests with TTFT <= ``f32(ttft_slo_s)``, TPOT <= ``f32(tpot_slo_s)``, both.
15. Sampling point. ``peak_gpu_tokens``, ``peak_host_tokens`` and the ownership update
    (9 of the spec) use the state after the step (``kv``/``host`` updated, fetched slots
    resident, preempted ones freed) and before completions free anything. For ellm
    ``peak_gpu_tokens`` adds the iteration's activation demand ``act(T, R)`` (``T`` =
    prefill tokens + decode sequences, ``R`` = rows that produce a token: admitted
    candidates whose prefill completes + decoders); for the others it is resident KV
    only. ``max_decode_batch`` counts decoding slots (not prefill completions).
16. Ownership (ellm, metrics only). ``owned`` starts at ``K0 = P - act(max_prefill,
    max_batch)``. After each iteration: if resident > owned, ``owned = resident`` (one
    inflation event, ``inflated_tokens`` += the difference); elif demand > ``P -
    owned``, ``owned = P - demand`` (one deflation event, ``deflated_tokens`` += the
    shortfall). (Since resident + demand <= P they never both apply.)
17. Algorithm 2 (ellm) runs after every iteration, also 0-s ones (which push zero
    counts into the rings). The iteration is a TTFT miss (1, else 0) when a first token
    of it has TTFT (14) > ``f32(ttft_slo_s)``, or when the request at ``head`` (after
    this iteration's admissions and drop) is valid, has arrived (``arrival <= t``) and
    ``f32(t - arrival) + overhead > f32(ttft_slo_s)`` (it waits past its TTFT SLO). It
    is a TPOT miss when a request that finishes in the iteration (``gen >= o``, found
    before completions free the slots) has ``o > 1`` and ``f32(t - t_first) / f32(o -
    1) > f32(tpot_slo_s)`` (its TPOT, the mean over its decode). Each ring has 16
    entries, the current
    iteration's count at lag 0; the window sums the lags ``j = 0 .. ceil(w) - 1``
    (clipped to 16); an event is ``sum >= k`` (i.e. ``>= ceil(k)``). ``B_unit =
    min(f32(f32(buffer_unit_mib * 2**20) / kv_bytes), B_max)``; ``B_logic`` starts at
    ``B_unit``. A TPOT event sets
    ``B_logic = max(B_logic / a, B_unit)``; otherwise a TTFT event sets ``B_logic =
    min(B_logic * a, B_max)`` (float32); after either event both rings are zeroed.
    ``tpot_events`` / ``ttft_events`` count the applied actions (a TTFT event that
    coincides with a TPOT event is not counted). ``buffer_trace`` has one entry per
    loop pass (``B_logic`` after Algorithm 2).
18. Completion: after the step, any slot with ``gen >= o`` finishes (slot, KV and host
    tokens freed), in slot order. The loop ends when every valid request is finished or
    dropped, or after ``max_iters`` passes.
19. Memory constants. :func:`memory_model` derives ``kv_bytes``, the chunk ``c``, the
    activation coefficients and the pool ``P`` from the model's shapes (hidden and
    intermediate size, vocabulary, layers, KV heads, head_dim, dtype bytes, MLP kind),
    ``tp`` and the vLLM version line, with the profiling run's constants written out
    above (nothing taken from ``hardware``): the coefficients are float32 of ``bytes /
    kv_bytes`` and ``P = f32(capacity) + act(max_prefill, max_batch)``.
    ``simulate_reference`` takes ``pool_tokens``, ``act_coef`` and ``chunk_tokens`` as
    given, so that hand-made scenarios can use small numbers.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["simulate_reference", "act_tokens", "kv_tokens", "kv_bytes_per_token",
           "activation_bytes", "memory_model"]

EMPTY, RESIDENT, PREEMPTED, HOST = 0, 1, 2, 3
W_MAX = 16
F32 = np.float32

# vLLM's profiling-run constants, written here from their documented values (module
# docstring of hardware/memory_profile.py, which cites the logs), not imported:
VOCAB_PAD = 64                    # the LM head's rows: vocab padded to a multiple of 64
V0_SAMPLER_FP32_COPIES = 9.29     # V0 sampler: fp32 copies of the [R, V] logits
V1_SAMPLER_FP32_COPIES = 3.0      # V1 sampler: logits.float(), softmax, the noise q
V1_SAMPLER_WORKSPACE = 0.117 * 2 ** 30  # V1 sampler: fixed workspace bytes


# ---- the memory model from the model's shapes (spec: "Units and memory model") ------
def kv_bytes_per_token(model, tp: int = 1) -> float:
    """One token's K and V on one device: 2 (K, V) x layers x KV heads on the device
    (at least 1) x head_dim x dtype bytes."""
    heads = max(int(model.n_kv_heads) // int(tp), 1)
    return float(2 * int(model.n_layers) * heads * int(model.head_dim)
                 * model.dtype_bytes)


def activation_bytes(model, tp: int = 1, version: str = "v0"):
    """``(f, h, r, z)`` in bytes per device: vLLM's live activation of a forward over T
    tokens sampling R rows is ``max(f T, h T + r R + z)``.

    f: the MLP of a decoder layer: the layer input, the residual and the normed
    attention output (3 hidden) plus the MLP's live tensors: gated, gate_up (2 I/tp)
    and its SiluAndMul output (I/tp); ungated (fc1/fc2) 2 I/tp; MoE, for each of the
    k experts of a token 3 I/tp and the hidden-sized output. h: the [T, hidden] output
    held while sampling. r: a row of logits in the model dtype over the padded vocab,
    plus fp32 copies over the real vocab (V0 9.29, V1 3). z: V1's fixed workspace."""
    if version not in ("v0", "v1"):
        raise ValueError(f"version must be 'v0' or 'v1', got {version!r}")
    hid = float(model.hidden_size)
    inter = float(model.intermediate_size) / float(tp)
    dt = float(model.dtype_bytes)
    if int(getattr(model, "n_experts", 0) or 0) > 0:
        k = float(model.n_experts_per_token)
        f = (3.0 * hid + k * (3.0 * inter + hid)) * dt
    elif getattr(model, "gated_mlp", True):
        f = (3.0 * hid + 2.0 * inter + inter) * dt
    else:
        f = (3.0 * hid + 2.0 * inter) * dt
    held = hid * dt
    vocab = int(model.vocab_size)
    padded = -(-vocab // VOCAB_PAD) * VOCAB_PAD
    copies = V0_SAMPLER_FP32_COPIES if version == "v0" else V1_SAMPLER_FP32_COPIES
    per_row = padded * dt + copies * 4.0 * vocab
    fixed = 0.0 if version == "v0" else V1_SAMPLER_WORKSPACE
    return f, held, per_row, fixed


def memory_model(model, *, capacity_tokens, max_prefill, max_batch, tp: int = 1,
                 version: str = "v0", chunk_mib: float = 2.0) -> dict:
    """The run's memory constants from the model's shapes (spec, first section):
    ``kv_bytes`` per token per device, the chunk ``c = max(1, round(chunk_mib MiB /
    kv_bytes))`` tokens, the activation coefficients in KV tokens (float32, ``bytes /
    kv_bytes``) and the pool ``P = f32(capacity) + act(max_prefill, max_batch)``
    (vLLM's start-up reservation for ``max_num_batched_tokens`` tokens and
    ``max_num_seqs`` rows)."""
    kvb = kv_bytes_per_token(model, tp)
    c = max(1, int(round(float(chunk_mib) * 2 ** 20 / kvb)))
    coef = tuple(F32(b / kvb) for b in activation_bytes(model, tp, version))
    pool = F32(F32(capacity_tokens) + act_tokens(float(max_prefill), int(max_batch),
                                                 coef, c))
    return {"kv_bytes": kvb, "chunk": c, "coef": coef, "pool": pool}


def kv_tokens(x: int, c: int) -> np.float32:
    """kv(x) = c * ceil(x / c), exact in integers, as float32 (Interpretation 1)."""
    x = int(x)
    return F32(c * (-(-x // c))) if x > 0 else F32(0.0)


def act_tokens(T, R, coef, c: int) -> np.float32:
    """act(T, R) = kv(max(f T, h T + r R + z)) in float32, 0 for T <= 0."""
    if T <= 0:
        return F32(0.0)
    f, h, r, z = (F32(v) for v in coef)
    t32, r32, c32 = F32(T), F32(R), F32(c)
    fwd = F32(f * t32)
    smp = F32(F32(F32(h * t32) + F32(r * r32)) + z)
    m = max(fwd, smp)
    return F32(c32 * F32(np.ceil(F32(m / c32))))


class _Slot:
    """One occupied slot."""

    def __init__(self, req: int, order: int):
        self.req = req
        self.status = RESIDENT
        self.gen = 0  # tokens generated
        self.kv = F32(0.0)  # GPU tokens held
        self.host = F32(0.0)  # host tokens held
        self.todo = 0  # prompt (+ recomputed) tokens still to prefill (vllm-cp)
        self.order = order
        self.weight = 1  # exact mode


def simulate_reference(arrival, prompt, output, valid, *, system, params, n_slots,
                       admit_window, max_batch, max_prefill, pool_tokens, chunk_tokens,
                       act_coef, watermark_tokens, ttft_slo_s, tpot_slo_s,
                       iteration_time, kv_bytes_per_token, host_link_bw,
                       request_overhead_s=0.0, buffer_unit_mib=1024.0,
                       max_iters=200_000) -> dict:
    if system not in ("ellm", "vllm", "vllm-cp"):
        raise ValueError(f"unknown system {system!r}")
    ellm = system == "ellm"
    cp = system == "vllm-cp"
    arrival = np.asarray(arrival, dtype=np.float32)
    prompt = np.asarray(prompt).astype(np.int64)
    output = np.asarray(output).astype(np.int64)
    valid = np.asarray(valid, dtype=bool)
    n = arrival.shape[0]
    S = int(n_slots)
    A = int(admit_window)
    c = int(chunk_tokens)
    coef = tuple(float(v) for v in act_coef)
    P = F32(pool_tokens)
    max_prefill_f = float(max_prefill)
    max_batch = int(max_batch)
    kv_bytes = F32(kv_bytes_per_token)
    bw = F32(host_link_bw)
    zero = F32(0.0)

    def kv(x: int) -> np.float32:
        return kv_tokens(x, c)

    def act(T, R) -> np.float32:
        return act_tokens(T, R, coef, c)

    def a_dec(m: int) -> np.float32:
        return act(m, m) if ellm else zero

    # ---- system constants ------------------------------------------------------------
    wm = F32(watermark_tokens) if not ellm else zero
    if system == "vllm":
        K = F32(P - act(F32(max_prefill_f), max_batch))
    elif cp:
        chunk_budget = int(math.floor(float(params["chunk"])))
        K = F32(P - act(F32(chunk_budget), max_batch))
    else:
        K = None
    if ellm:
        theta_tok = F32(F32(params["theta"]) * P)
        a_fac = F32(params["a"])
        B_max = F32(F32(F32(params["cpu_buffer_gib"]) * F32(2 ** 30)) / kv_bytes)
        k_viol = float(params["k"])
        w_lags = min(W_MAX, max(1, int(math.ceil(float(params["w"])))))
        B_unit = min(F32(F32(F32(buffer_unit_mib) * F32(2 ** 20)) / kv_bytes), B_max)
        B_logic = B_unit
        K0 = F32(P - act(F32(max_prefill_f), max_batch))
        owned = K0
    cap = K if not ellm else P  # S of the keep step
    ttft_slo = F32(ttft_slo_s)
    tpot_slo = F32(tpot_slo_s)
    overhead = F32(request_overhead_s)

    # ---- outputs ---------------------------------------------------------------------
    admit_iter = np.full(n, -1, dtype=np.int64)
    finish_iter = np.full(n, -1, dtype=np.int64)
    first_token_s = np.full(n, np.nan, dtype=np.float32)
    finish_s = np.full(n, np.nan, dtype=np.float32)
    offloaded = np.zeros(n, dtype=bool)
    dropped_mask = np.zeros(n, dtype=bool)

    completed = dropped = preemptions = stalls = 0
    offload_tokens = fetch_tokens = 0
    peak_host = zero
    peak_gpu = zero
    inflation_events = deflation_events = 0
    inflated_tokens = deflated_tokens = zero
    ttft_events = tpot_events = 0
    max_decode_batch = 0
    iterations = 0
    buffer_trace: list[float] = []
    ring_ttft = [0] * W_MAX  # ring[j] = count of the iteration at lag j
    ring_tpot = [0] * W_MAX

    slots: list[_Slot | None] = [None] * S
    t = F32(0.0)
    head = 0
    remaining = int(valid.sum())
    order_ctr = 0
    it = 0

    def resident_used() -> np.float32:
        u = zero
        for sl in slots:
            if sl is not None and sl.status == RESIDENT:
                u = F32(u + sl.kv)
        return u

    def host_used_now() -> np.float32:
        u = zero
        for sl in slots:
            if sl is not None and sl.status == HOST:
                u = F32(u + sl.host)
        return u

    def by_order(status: int) -> list[int]:
        return sorted((s for s in range(S) if slots[s] is not None
                       and slots[s].status == status), key=lambda s: slots[s].order)

    def keep_step() -> tuple[list[int], list[int], int]:
        """Interpretation 7: returns (kept, victims, victims done with their prefill),
        kept and victims in order; the victims are preempted."""
        nonlocal preemptions
        queue = by_order(RESIDENT)
        needs = []
        for s in queue:
            sl = slots[s]
            if sl.todo > 0:
                needs.append(sl.kv)
            else:
                needs.append(kv(int(prompt[sl.req]) + sl.gen))
        best = 0
        cum = zero
        for m in range(1, len(queue) + 1):
            cum = F32(cum + needs[m - 1])
            if F32(cum + a_dec(m)) <= cap:
                best = m
        kept, victims = queue[:best], queue[best:]
        decoder_victims = sum(1 for s in victims if slots[s].todo == 0)
        for s in victims:
            sl = slots[s]
            sl.status = PREEMPTED
            sl.kv = zero
            sl.todo = 0
            preemptions += 1
        return kept, victims, decoder_victims

    def never_fits(T_i: int) -> bool:
        KV_i = kv(T_i)
        if ellm:
            return bool(F32(KV_i + act(T_i, 1)) > F32(P - theta_tok))
        return bool(KV_i > F32(K - wm))

    while it < max_iters and remaining > 0:
        while head < n and not valid[head]:
            head += 1

        # ---- 1. idle jump -----------------------------------------------------------
        if all(sl is None for sl in slots) and head < n and not (arrival[head] <= t):
            t = arrival[head]

        chunks: list[tuple[int, int]] = []  # (x tokens now, y computed before)
        producers: list[int] = []  # slots that produce a token this iteration
        decoders: list[int] = []  # slots that decode this iteration
        first_now: list[int] = []  # slots whose request gets its first token
        off_tok = 0
        fetch_tok = 0
        preempted_now: set[int] = set()
        walk_allowed = True
        left = None  # vllm-cp budget left

        # ---- vllm-cp: keep/preempt, then continuing prefills ------------------------
        if cp:
            kept, victims, decoder_victims = keep_step()
            preempted_now = set(victims)
            walk_allowed = len(victims) == 0  # Interpretation 9
            cp_decoders = [s for s in kept if slots[s].todo == 0]
            for s in cp_decoders:  # Interpretation 8: growth allocated when kept
                sl = slots[s]
                sl.kv = kv(int(prompt[sl.req]) + sl.gen)
            left = chunk_budget - len(cp_decoders)
            for s in kept:
                sl = slots[s]
                if sl.todo > 0 and left > 0:
                    x = min(sl.todo, left)
                    total = int(prompt[sl.req]) + sl.gen
                    chunks.append((x, total - sl.todo))
                    sl.todo -= x
                    left -= x
                    if sl.todo == 0:
                        producers.append(s)
            decoders = list(cp_decoders)

        # ---- 2. admission walk -------------------------------------------------------
        running = sum(1 for sl in slots if sl is not None and sl.status in (RESIDENT, HOST))
        used = resident_used()
        host_used = host_used_now()
        M_kv = zero
        M_host = zero
        T_cum = 0
        R_cum = 0
        admitted: list[int] = []  # slots admitted in walk order
        free_slots = [s for s in range(S) if slots[s] is None]
        n_new = 0
        waiting = [s for s in by_order(PREEMPTED) if s not in preempted_now]
        cands: list[tuple[str, int]] = [("slot", s) for s in waiting][:A]
        for j in range(head, n):
            if len(cands) >= A:
                break
            cands.append(("new", j))
        if walk_allowed:
            for kind, ref in cands:
                if kind == "new":
                    i = ref
                    if not (valid[i] and arrival[i] <= t and n_new < len(free_slots)):
                        break
                    gen_i = 0
                else:
                    i = slots[ref].req
                    gen_i = slots[ref].gen
                T_i = int(prompt[i]) + gen_i
                KV_i = kv(T_i)
                if not (running + len(admitted) < max_batch):
                    break
                if cp:
                    if not (left > 0):
                        break
                elif not (len(admitted) == 0 or T_cum + T_i <= max_prefill_f):
                    break
                to_host = False
                if ellm:
                    F = F32(P - used)
                    M_act = act(T_cum + T_i, R_cum + 1)
                    if F32(F - F32(F32(M_kv + KV_i) + M_act)) >= theta_tok:
                        to_host = False
                    elif (F32(F - F32(M_kv + M_act)) >= theta_tok
                          and F32(F32(host_used + M_host) + KV_i) <= B_logic
                          and F32(kv(T_i + 1) + act(T_i, 1)) <= F32(P - theta_tok)):
                        to_host = True
                    else:
                        break
                else:
                    if not (F32(F32(used + M_kv) + KV_i) <= F32(K - wm)):
                        break
                # admit
                if kind == "new":
                    s = free_slots[n_new]
                    n_new += 1
                    slots[s] = _Slot(i, order_ctr)
                    admit_iter[i] = it
                else:
                    s = ref
                    slots[s].order = order_ctr
                order_ctr += 1
                sl = slots[s]
                sl.status = RESIDENT
                if cp:
                    x = min(T_i, left)
                    left -= x
                    sl.todo = T_i - x
                    chunks.append((x, 0))
                    sl.kv = KV_i
                    M_kv = F32(M_kv + KV_i)
                    if sl.todo == 0:
                        producers.append(s)
                else:
                    sl.todo = 0
                    chunks.append((T_i, 0))
                    producers.append(s)
                    if to_host:
                        sl.status = HOST
                        sl.kv = zero
                        sl.host = KV_i
                        M_host = F32(M_host + KV_i)
                        off_tok += int(KV_i)
                        offloaded[i] = True
                    else:
                        sl.kv = KV_i
                        M_kv = F32(M_kv + KV_i)
                T_cum += T_i
                R_cum += 1
                admitted.append(s)
            head += n_new

        # ---- 5. drop rule (Interpretation 12) ----------------------------------------
        if not admitted and not any(sl is not None and sl.status in (RESIDENT, HOST)
                                    for sl in slots):
            while head < n and not valid[head]:
                head += 1
            if waiting:
                s = waiting[0]
                sl = slots[s]
                if never_fits(int(prompt[sl.req]) + sl.gen):
                    dropped_mask[sl.req] = True
                    slots[s] = None
                    dropped += 1
                    remaining -= 1
            elif head < n and arrival[head] <= t:
                if never_fits(int(prompt[head])):
                    dropped_mask[head] = True
                    dropped += 1
                    remaining -= 1
                    head += 1

        # ---- 3. vllm / ellm: decode iteration when nothing was admitted ---------------
        if not cp and not admitted:
            stalled: list[int] = []
            if ellm:  # Algorithm 1's decode walk: the rest stall (docs, step 3)
                queue = by_order(RESIDENT)
                U = resident_used()
                grow = zero
                best = 0
                for m in range(1, len(queue) + 1):
                    sl = slots[queue[m - 1]]
                    grow = F32(grow + F32(kv(int(prompt[sl.req]) + sl.gen) - sl.kv))
                    if not (F32(F32(U + grow) + a_dec(m)) <= P):
                        break
                    best = m
                if best > 0:
                    kept, stalled = queue[:best], queue[best:]
                    stalls += len(stalled)
                else:  # not even the first can grow: vLLM's preemption rule
                    kept, _, _ = keep_step()
            else:
                kept, _, _ = keep_step()
            fetched: list[int] = []
            if ellm:
                N_kept = zero  # H: the decoders' needs plus the stalled slots' KV
                for s in kept:
                    sl = slots[s]
                    N_kept = F32(N_kept + kv(int(prompt[sl.req]) + sl.gen))
                for s in stalled:
                    N_kept = F32(N_kept + slots[s].kv)
                got = zero
                for s in by_order(HOST):
                    sl = slots[s]
                    need = kv(int(prompt[sl.req]) + sl.gen)
                    m = len(fetched)
                    lhs = F32(F32(F32(F32(P - N_kept) - a_dec(len(kept) + m + 1)) - got)
                              - need)
                    if not (lhs >= theta_tok):
                        break
                    fetch_tok += int(sl.host)
                    sl.status = RESIDENT
                    sl.host = zero
                    sl.kv = need
                    got = F32(got + need)
                    fetched.append(s)
            decoders = list(kept) + fetched

        # ---- decode work -------------------------------------------------------------
        decode_ctx = 0
        for s in decoders:
            sl = slots[s]
            decode_ctx += int(prompt[sl.req]) + sl.gen
            sl.gen += 1
            sl.kv = kv(int(prompt[sl.req]) + sl.gen - 1)
            producers.append(s)
        for s in producers:
            if s in decoders:
                continue
            sl = slots[s]
            if sl.gen == 0:
                first_now.append(s)
            sl.gen += 1
        max_decode_batch = max(max_decode_batch, len(decoders))

        # ---- 6. time -----------------------------------------------------------------
        prefill_tokens = sum(x for x, _ in chunks)
        pairs = sum(x * (y + (x + 1) / 2.0) for x, y in chunks)
        step = zero
        if prefill_tokens + len(decoders) > 0:
            compute = F32(iteration_time(int(prefill_tokens), int(len(decoders)),
                                         int(decode_ctx), int(c), 0.0, float(pairs)))
            off_s = F32(F32(F32(off_tok) * kv_bytes) / bw)
            fetch_s = F32(F32(F32(fetch_tok) * kv_bytes) / bw)
            step = max(compute, off_s, fetch_s)
            iterations += 1
        t = F32(t + step)
        offload_tokens += off_tok
        fetch_tokens += fetch_tok
        for s in first_now:
            first_token_s[slots[s].req] = t

        # ---- peaks and ownership (Interpretations 15, 16) -----------------------------
        res_now = resident_used()
        host_now = host_used_now()
        demand = act(prefill_tokens + len(decoders), len(producers)) if ellm else zero
        gpu_now = F32(res_now + demand) if ellm else res_now
        peak_gpu = max(peak_gpu, gpu_now)
        peak_host = max(peak_host, host_now)
        if ellm:
            if res_now > owned:
                inflated_tokens = F32(inflated_tokens + F32(res_now - owned))
                owned = res_now
                inflation_events += 1
            elif demand > F32(P - owned):
                deflated_tokens = F32(deflated_tokens + F32(demand - F32(P - owned)))
                owned = F32(P - demand)
                deflation_events += 1

        # ---- 8. SLO misses (before completion frees the slots) ------------------------
        if ellm:
            ttft_miss = 0
            for s in first_now:
                i = slots[s].req
                ttft = F32(F32(t - arrival[i]) + overhead)
                if ttft > ttft_slo:
                    ttft_miss = 1  # the iteration missed (docs step 8)
            tpot_miss = 0
            for s in range(S):  # requests that finish now, TPOT over their whole decode
                sl = slots[s]
                if sl is None or sl.status == PREEMPTED or sl.gen < int(output[sl.req]):
                    continue
                o = int(output[sl.req])
                if o > 1:
                    tpot = F32(F32(t - first_token_s[sl.req]) / F32(o - 1))
                    if tpot > tpot_slo:
                        tpot_miss = 1
            # the oldest request still waiting for admission, already past the TTFT SLO
            if head < n and valid[head] and arrival[head] <= t:
                if F32(F32(t - arrival[head]) + overhead) > ttft_slo:
                    ttft_miss = 1

        # ---- 7. completion -----------------------------------------------------------
        for s in range(S):
            sl = slots[s]
            if sl is None or sl.status == PREEMPTED:
                continue
            if sl.gen >= int(output[sl.req]):
                finish_iter[sl.req] = it
                finish_s[sl.req] = t
                slots[s] = None
                completed += 1
                remaining -= 1

        # ---- 8. Algorithm 2 ----------------------------------------------------------
        if ellm:
            ring_ttft = [ttft_miss] + ring_ttft[:-1]
            ring_tpot = [tpot_miss] + ring_tpot[:-1]
            e_ttft = sum(ring_ttft[:w_lags]) >= k_viol
            e_tpot = sum(ring_tpot[:w_lags]) >= k_viol
            if e_tpot:
                B_logic = max(F32(B_logic / a_fac), B_unit)
                tpot_events += 1
            elif e_ttft:
                B_logic = min(F32(B_logic * a_fac), B_max)
                ttft_events += 1
            if e_tpot or e_ttft:
                ring_ttft = [0] * W_MAX
                ring_tpot = [0] * W_MAX
            buffer_trace.append(float(B_logic))

        it += 1

    # ---- metrics ---------------------------------------------------------------------
    done = finish_iter >= 0
    ttft_s = np.full(n, np.nan, dtype=np.float32)
    tpot_s = np.full(n, np.nan, dtype=np.float32)
    ttft_ok = tpot_ok = slo_ok = 0
    for i in range(n):
        if not done[i]:
            continue
        ttft = F32(F32(first_token_s[i] - arrival[i]) + overhead)
        o = int(output[i])
        tpot = F32(F32(finish_s[i] - first_token_s[i]) / F32(o - 1)) if o > 1 else zero
        ttft_s[i], tpot_s[i] = ttft, tpot
        a_ok, b_ok = bool(ttft <= ttft_slo), bool(tpot <= tpot_slo)
        ttft_ok += a_ok
        tpot_ok += b_ok
        slo_ok += a_ok and b_ok
    return {
        "admit_iter": admit_iter,
        "finish_iter": finish_iter,
        "first_token_s": first_token_s,
        "finish_s": finish_s,
        "offloaded": offloaded,
        "dropped_mask": dropped_mask,
        "ttft_s": ttft_s,
        "tpot_s": tpot_s,
        "completed": int(completed),
        "dropped": int(dropped),
        "unserved": int((valid & ~done).sum()),
        "preemptions": int(preemptions),
        "stalls": int(stalls),
        "offload_tokens": int(offload_tokens),
        "fetch_tokens": int(fetch_tokens),
        "peak_host_tokens": float(peak_host),
        "peak_gpu_tokens": float(peak_gpu),
        "inflation_events": int(inflation_events),
        "deflation_events": int(deflation_events),
        "inflated_tokens": float(inflated_tokens),
        "deflated_tokens": float(deflated_tokens),
        "ttft_events": int(ttft_events),
        "tpot_events": int(tpot_events),
        "max_decode_batch": int(max_decode_batch),
        "iterations": int(iterations),
        "loop_iterations": int(it),
        "clock": float(t),
        "buffer_trace": buffer_trace,
        "ttft_ok": int(ttft_ok),
        "tpot_ok": int(tpot_ok),
        "slo_ok": int(slo_ok),
        "K": float(K) if K is not None else None,
        "K0": float(K0) if ellm else None,
        "B_max": float(B_max) if ellm else None,
    }
