"""Hand-worked scenarios for the NumPy reference of the elastic family.

Every expected value below is worked out by hand in the comments (see
docs/elastic-semantics.md and the Interpretations list in tests/reference_elastic.py).
Unless a test says otherwise: chunk c = 4 tokens, activation coefficients all 0 (so
act(T, R) = 0 and K = P), an iteration with any work costs exactly 1.0 s (a power of
two, so float32 clock arithmetic is exact) and an iteration with no work 0 s.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from reference_elastic import act_tokens, kv_tokens, simulate_reference  # noqa: E402


class Recorder:
    """iteration_time returning a constant; records every call's six arguments."""

    def __init__(self, dt=1.0):
        self.dt = dt
        self.calls = []

    def __call__(self, prefill, decode_seqs, decode_ctx, kv_chunk, copy_bytes, pairs):
        self.calls.append((prefill, decode_seqs, decode_ctx, kv_chunk, copy_bytes, pairs))
        return self.dt


ELLM_PARAMS = {"theta": 0.0, "a": 2.0, "cpu_buffer_gib": 2.0 ** -26, "k": 3.0, "w": 5.0}


def run(system, prompt, output, *, arrival=None, valid=None, params=None, n_slots=4,
        admit_window=None, max_batch=None, max_prefill=10_000, pool_tokens=1000.0,
        chunk_tokens=4, act_coef=(0.0, 0.0, 0.0, 0.0), watermark_tokens=0.0,
        ttft_slo_s=1e9, tpot_slo_s=1e9, timer=None, kv_bytes_per_token=1.0,
        host_link_bw=1e12, **kw):
    n = len(prompt)
    arrival = np.zeros(n, np.float32) if arrival is None else np.asarray(arrival, np.float32)
    valid = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
    if params is None:
        params = dict(ELLM_PARAMS) if system == "ellm" else (
            {"chunk": 512.0} if system == "vllm-cp" else {})
    timer = Recorder() if timer is None else timer
    # the hand-worked cases below take Algorithm 2's buffer unit as one chunk
    kw.setdefault("buffer_unit_mib", chunk_tokens * kv_bytes_per_token / 2 ** 20)
    out = simulate_reference(
        arrival, np.asarray(prompt), np.asarray(output), valid, system=system,
        params=params, n_slots=n_slots,
        admit_window=n_slots if admit_window is None else admit_window,
        max_batch=n_slots if max_batch is None else max_batch, max_prefill=max_prefill,
        pool_tokens=pool_tokens, chunk_tokens=chunk_tokens, act_coef=act_coef,
        watermark_tokens=watermark_tokens, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s,
        iteration_time=timer, kv_bytes_per_token=kv_bytes_per_token,
        host_link_bw=host_link_bw, **kw)
    return out, timer


# --------------------------------------------------------------------------------------
def test_kv_and_act_helpers():
    assert kv_tokens(0, 4) == 0 and kv_tokens(1, 4) == 4 and kv_tokens(8, 4) == 8
    assert kv_tokens(9, 4) == 12
    # act = kv(max(f T, h T + r R + z)): f T = 10, h T + r R + z = 5 + 6 + 0.5 = 11.5 -> 12
    assert act_tokens(10, 2, (1.0, 0.5, 3.0, 0.5), 4) == 12
    # f T wins: 2 * 10 = 20 -> 20
    assert act_tokens(10, 2, (2.0, 0.5, 3.0, 0.5), 4) == 20
    assert act_tokens(0, 5, (2.0, 0.5, 3.0, 0.5), 4) == 0


def test_vllm_fcfs_budget_decode_and_idle_jump():
    # vllm, P = K = 1000, max_prefill 10, dt 0.25 per computing iteration.
    # r0 a=0 p=8 o=3; r1 a=0 p=6 o=2; r2 a=1.0 p=5 o=2; r3 a=3.0 p=4 o=1.
    # it0 t=0: r0 admitted (T 8); r1 8+6 = 14 > 10 -> stop. prefill-only: 8 tokens,
    #   pairs 8*(0+4.5) = 36. t=0.25; r0 first token 0.25 (gen 1).
    # it1: r1 first candidate (exempt) admitted; r2 not arrived (1.0 > 0.25) -> stop.
    #   prefill-only (r0 waits): 6 tokens, pairs 21. t=0.5; r1 first token 0.5.
    # it2: r2 not arrived -> nobody admitted -> decode r0 (ctx 9), r1 (ctx 7): 2 seqs,
    #   ctx 16. t=0.75. r1 gen 2 == o -> finishes (it2, 0.75).
    # it3: r2 not arrived (1.0 > 0.75); r0 decodes ctx 10 -> t=1.0, gen 3 -> finishes.
    # it4: no slot; arrival 1.0 <= 1.0 -> no jump; r2 prefill 5 (pairs 15) -> t=1.25.
    # it5: r2 decodes ctx 6 -> t=1.5, finishes.
    # it6: no slot, r3 arrives at 3.0 > 1.5 -> idle jump t=3.0; prefill 4 (pairs 10)
    #   -> t=3.25; o=1 -> finishes at once.
    # TTFT: 0.25, 0.5, 0.25, 0.25; TPOT: r0 (1.0-0.25)/2 = 0.375, r1 0.25, r2 0.25,
    # r3 0 (o=1). SLOs 0.3 / 0.3: ttft_ok 3 (not r1), tpot_ok 3 (not r0), slo_ok 2.
    # peak resident: it2 after decode kv(9)+kv(7) = 12+8 = 20.
    timer = Recorder(0.25)
    out, _ = run("vllm", [8, 6, 5, 4], [3, 2, 2, 1], arrival=[0.0, 0.0, 1.0, 3.0],
                 max_prefill=10, timer=timer, ttft_slo_s=0.3, tpot_slo_s=0.3)
    assert out["admit_iter"].tolist() == [0, 1, 4, 6]
    assert out["finish_iter"].tolist() == [3, 2, 5, 6]
    assert out["first_token_s"].tolist() == [0.25, 0.5, 1.25, 3.25]
    assert out["finish_s"].tolist() == [1.0, 0.75, 1.5, 3.25]
    assert timer.calls == [(8, 0, 0, 4, 0.0, 36.0), (6, 0, 0, 4, 0.0, 21.0),
                           (0, 2, 16, 4, 0.0, 0.0), (0, 1, 10, 4, 0.0, 0.0),
                           (5, 0, 0, 4, 0.0, 15.0), (0, 1, 6, 4, 0.0, 0.0),
                           (4, 0, 0, 4, 0.0, 10.0)]
    assert out["iterations"] == 7 and out["loop_iterations"] == 7
    assert out["clock"] == 3.25
    assert (out["completed"], out["dropped"], out["preemptions"]) == (4, 0, 0)
    assert (out["ttft_ok"], out["tpot_ok"], out["slo_ok"]) == (3, 3, 2)
    assert out["tpot_s"].tolist() == [0.375, 0.25, 0.25, 0.0]
    assert out["max_decode_batch"] == 2
    assert out["peak_gpu_tokens"] == 20.0
    assert out["buffer_trace"] == [] and out["offload_tokens"] == 0
    # the request overhead enters TTFT: +0.125 -> r0, r2, r3 at 0.375 > 0.3
    out2, _ = run("vllm", [8, 6, 5, 4], [3, 2, 2, 1], arrival=[0.0, 0.0, 1.0, 3.0],
                  max_prefill=10, timer=Recorder(0.25), ttft_slo_s=0.3, tpot_slo_s=0.3,
                  request_overhead_s=0.125)
    assert out2["ttft_ok"] == 0 and out2["ttft_s"].tolist()[0] == 0.375


def test_vllm_growth_preemption_and_recompute():
    # vllm, P = K = 16, c = 4. r0, r1: prompt 4, output 6.
    # it0: both admitted (kv 4 + 4 = 8 <= 16), prefill 8 (pairs 2 * 4*2.5 = 20), gen 1.
    # it1..it4: needs kv(4+gen) = 8 each (gen 1..4), 16 <= 16 -> both decode; gen 5.
    # it5: needs kv(9) = 12 each: prefix [r0] 12 <= 16, [r0, r1] 24 > 16 -> r1 (the most
    #   recently admitted, order 1) preempted (gen 5 kept, kv freed). r0 decodes
    #   (ctx 9) -> gen 6 -> finishes (it5, t=6).
    # it6: r1 is the first candidate: T = 4 + 5 = 9, KV kv(9) = 12 <= 16 -> re-admitted;
    #   prefill-only 9 tokens (pairs 9*5 = 45) -> gen 6 -> finishes (it6, t=7).
    out, timer = run("vllm", [4, 4], [6, 6], n_slots=2, pool_tokens=16.0)
    assert out["preemptions"] == 1
    assert out["admit_iter"].tolist() == [0, 0]
    assert out["finish_iter"].tolist() == [5, 6]
    assert out["first_token_s"].tolist() == [1.0, 1.0]
    assert out["finish_s"].tolist() == [6.0, 7.0]
    assert timer.calls[0] == (8, 0, 0, 4, 0.0, 20.0)
    assert timer.calls[4] == (0, 2, 16, 4, 0.0, 0.0)  # ctx (4+4) * 2
    assert timer.calls[5] == (0, 1, 9, 4, 0.0, 0.0)  # only r0 decodes
    assert timer.calls[6] == (9, 0, 0, 4, 0.0, 45.0)  # recompute of p + gen = 9
    assert out["peak_gpu_tokens"] == 16.0
    assert (out["completed"], out["dropped"]) == (2, 0)


def test_vllm_watermark_and_activation_reservation():
    # act_coef f = 1 -> act(T, R) = kv(T). K = P - act(max_prefill 8, 4) = 40 - 8 = 32;
    # watermark 8 -> admission needs used + M_kv + KV <= 24.  r0 p=12 o=3, r1 p=12 o=2.
    # it0: r0 is exempt from the budget (12 > 8, first candidate); r1: 12 + 12 > 8 ->
    #   stop. it1: r1 (exempt) admitted: used 12 + 0 + 12 = 24 <= 24.
    # it2: decode: needs kv(13) = 16 each, 32 <= K = 32 (growth may use the watermark);
    #   ctx 13 + 13 = 26; both gen 2 -> r1 done.
    out, timer = run("vllm", [12, 12], [3, 2], pool_tokens=40.0, max_prefill=8,
                     act_coef=(1.0, 0.0, 0.0, 0.0), watermark_tokens=8.0)
    assert out["K"] == 32.0
    assert out["admit_iter"].tolist() == [0, 1]
    # it3: r0 needs kv(14) = 16 -> gen 3 done.
    assert out["finish_iter"].tolist() == [3, 2]
    assert out["peak_gpu_tokens"] == 32.0
    assert timer.calls[2] == (0, 2, 26, 4, 0.0, 0.0)


def test_ellm_offload_then_fetch_with_transfer_bound_step():
    # ellm, P = 32, c = 4, theta = 0.125 -> theta_tok = 4; act f = 1 -> act(T, R) = kv(T).
    # B_logic starts at c = 4 tokens; kv_bytes 1, link 2 tok/s -> 4 tokens take 2.0 s,
    # compute takes 1.0 s.  r0 p=12 o=2, r1 p=4 o=2, max_prefill 16.
    # it0 walk, F = 32:
    #   r0: T 12, KV 12, M_act = act(12, 1) = 12: 32 - (0 + 12 + 12) = 8 >= 4 -> resident.
    #   r1: T 4, KV 4, M_act = act(16, 2) = 16: 32 - (12 + 4 + 16) = 0 < 4; offload:
    #   32 - (12 + 16) = 4 >= 4, host 0 + 0 + 4 <= B_logic 4, KV + act(4, 1) = 8 <= 28
    #   -> r1 goes to the host (host 4).
    #   prefill-only: 16 tokens, pairs 12*6.5 + 4*2.5 = 88; offload 4 tok = 2.0 s > 1.0 s
    #   -> t = 2.0; both first tokens at 2.0. GPU: 12 resident + act(16, 2) 16 = 28.
    # it1: no candidate -> decode. r0 kept: kv(13) = 16, + A_dec(1) = act(1, 1) = 4 <= 32.
    #   fetch r1: 32 - 16 - act(2, 2) 4 - 0 - kv(5) 8 = 4 >= 4 -> fetched (4 host tokens,
    #   2.0 s). decode 2 seqs, ctx 13 + 5 = 18 -> step max(1.0, 0, 2.0) = 2.0, t = 4.0;
    #   both reach gen 2 = o -> finish. GPU: 16 + 8 + act(2, 2) 4 = 28.
    # Ownership: K0 = 32 - act(16, 4) = 16. it0: resident 12 <= 16; demand 16 <= 32 - 16.
    #   it1: resident 24 > 16 -> one inflation (8 tokens).
    params = dict(ELLM_PARAMS, theta=0.125)
    out, timer = run("ellm", [12, 4], [2, 2], params=params, pool_tokens=32.0,
                     max_prefill=16, act_coef=(1.0, 0.0, 0.0, 0.0), host_link_bw=2.0)
    assert out["K0"] == 16.0
    assert out["offloaded"].tolist() == [False, True]
    assert out["offload_tokens"] == 4 and out["fetch_tokens"] == 4
    assert timer.calls == [(16, 0, 0, 4, 0.0, 88.0), (0, 2, 18, 4, 0.0, 0.0)]
    assert out["first_token_s"].tolist() == [2.0, 2.0]
    assert out["finish_s"].tolist() == [4.0, 4.0]
    assert out["finish_iter"].tolist() == [1, 1]
    assert out["clock"] == 4.0
    assert out["peak_host_tokens"] == 4.0
    assert out["peak_gpu_tokens"] == 28.0
    assert (out["inflation_events"], out["inflated_tokens"]) == (1, 8.0)
    assert out["deflation_events"] == 0
    assert out["buffer_trace"] == [4.0, 4.0]
    # A fast link: the compute time (1.0 s) bounds both steps.
    out2, _ = run("ellm", [12, 4], [2, 2], params=params, pool_tokens=32.0,
                  max_prefill=16, act_coef=(1.0, 0.0, 0.0, 0.0), host_link_bw=8.0)
    assert out2["finish_s"].tolist() == [2.0, 2.0] and out2["offloaded"][1]
    # Without theta r1 fits resident (32 - (12 + 4 + 16) = 0 >= 0): no offload.
    out3, _ = run("ellm", [12, 4], [2, 2], pool_tokens=32.0, max_prefill=16,
                  act_coef=(1.0, 0.0, 0.0, 0.0), host_link_bw=2.0)
    assert out3["offload_tokens"] == 0 and not out3["offloaded"].any()
    assert out3["clock"] == 2.0


def test_ellm_fetch_waits_for_memory_and_deflation():
    # ellm, P = 32, theta_tok = 4 (theta 0.125), act f = 0.5 -> act(T, R) = kv(T / 2);
    # kv_bytes 1, link 2 tok/s, compute 1.0 s. r0 p=16 o=2, r1 p=4 o=2, max_prefill 20.
    # it0 walk, F = 32:
    #   r0: KV 16, M_act = act(16, 1) = 8: 32 - (16 + 8) = 8 >= 4 -> resident.
    #   r1: budget 16 + 4 = 20 <= 20; KV 4, M_act = act(20, 2) = kv(10) = 12:
    #   32 - (16 + 4 + 12) = 0 < 4; 32 - (16 + 12) = 4 >= 4, host 4 <= B_logic 4,
    #   4 + act(4, 1) = 8 <= 28 -> offload. Prefill 20 tokens, pairs 16*8.5 + 4*2.5 =
    #   146; step max(1.0, 4/2 = 2.0) = 2.0 -> t = 2. GPU 16 + 12 = 28.
    # it1: decode: r0 kept (kv(17) = 20 + act(1, 1) = 4 <= 32). Fetch r1:
    #   32 - 20 - act(2, 2) 4 - 0 - kv(5) 8 = 0 < 4 -> r1 stays on the host.
    #   r0 decodes alone (ctx 17), t = 3, done.
    # it2: fetch r1: 32 - 0 - act(1, 1) 4 - 0 - 8 = 20 >= 4 -> fetched (4 tokens, 2.0 s);
    #   decode ctx 5 -> step max(1.0, 2.0) = 2.0 -> t = 5, done.
    # Ownership: K0 = 32 - act(20, 4) = 32 - 12 = 20. it0: resident 16 <= 20, demand
    # 12 <= 32 - 20; it1: resident 20 <= 20, demand 4; it2: 8, 4 -> no event.
    params = dict(ELLM_PARAMS, theta=0.125)
    out, timer = run("ellm", [16, 4], [2, 2], params=params, pool_tokens=32.0,
                     max_prefill=20, act_coef=(0.5, 0.0, 0.0, 0.0), host_link_bw=2.0)
    assert out["K0"] == 20.0
    assert timer.calls == [(20, 0, 0, 4, 0.0, 146.0), (0, 1, 17, 4, 0.0, 0.0),
                           (0, 1, 5, 4, 0.0, 0.0)]
    assert out["finish_s"].tolist() == [3.0, 5.0]
    assert out["finish_iter"].tolist() == [1, 2]
    assert out["offloaded"].tolist() == [False, True]
    assert out["offload_tokens"] == out["fetch_tokens"] == 4
    assert out["peak_gpu_tokens"] == 28.0 and out["peak_host_tokens"] == 4.0
    assert out["inflation_events"] == 0 and out["deflation_events"] == 0
    assert out["max_decode_batch"] == 1
    # Deflation: r0 p=4 o=2 then r1 p=20 o=1 arriving at t = 10.
    # theta 0, P 32, max_prefill 4 -> K0 = 32 - act(4, 4) = 28.
    # it0: r0 prefill; resident 4, demand act(4, 1) = 4 <= 32 - 28 = 4: nothing.
    # it1: r0 decodes and finishes; resident kv(5) = 8 <= 28; demand 4 <= 4.
    # it2: idle jump to 10; r1 (exempt) T 20 -> KV 20, act 20: 32 - 40 < 0 -> no
    #   resident; offload needs 32 - 20 >= 0 and host 20 <= B_logic 4: no -> stop.
    #   Drop: 20 + 20 = 40 > 32 -> dropped.
    out4, _ = run("ellm", [4, 20], [2, 1], arrival=[0.0, 10.0], pool_tokens=32.0,
                  max_prefill=4, act_coef=(1.0, 0.0, 0.0, 0.0))
    assert out4["dropped"] == 1 and out4["completed"] == 1
    assert out4["deflation_events"] == 0 and out4["inflation_events"] == 0
    # r1 p=12 instead: it2: 32 - (12 + 12) = 8 >= 0 -> resident; demand act(12, 1) =
    # 12 > 32 - 28 = 4 -> deflation of 8 tokens (owned 20); resident 12 <= 20.
    out5, _ = run("ellm", [4, 12], [2, 1], arrival=[0.0, 10.0], pool_tokens=32.0,
                  max_prefill=4, act_coef=(1.0, 0.0, 0.0, 0.0))
    assert out5["completed"] == 2
    assert (out5["deflation_events"], out5["deflated_tokens"]) == (1, 8.0)
    assert out5["inflation_events"] == 0
    assert out5["peak_gpu_tokens"] == 24.0


def _alg2_run(w, k):
    # ellm, huge pool (no offload needed), act 0, c = 4, B_max = 2**-26 GiB / 1 B = 16.
    # r0..r3: p=4, o=1 (one per iteration: max_prefill 4, so a second one exceeds it);
    # r4: p=4, o=4. Tiny SLOs: every first token misses TTFT; r4 finishes (it7) with
    # TPOT 1.0 > SLO. Iterations: it0..it4 prefill r0..r4 (one TTFT miss each),
    # it5..it7 decode r4 (gen 2, 3, 4); only its finish is a TPOT miss.
    params = dict(ELLM_PARAMS, w=w, k=k)
    out, _ = run("ellm", [4] * 5, [1, 1, 1, 1, 4], params=params, n_slots=2,
                 max_prefill=4, ttft_slo_s=1e-6, tpot_slo_s=1e-6)
    assert out["finish_iter"].tolist() == [0, 1, 2, 3, 7]
    return out


def test_algorithm2_every_miss_is_an_event():
    # w = 1, k = 1: each TTFT miss is an event: 4 -> 8 -> 16 -> 16 (B_max) -> 16 -> 16;
    # it5, it6 no miss; it7 r4's finish (TPOT 3 s / 3 = 1.0) halves: 8.
    out = _alg2_run(1.0, 1.0)
    assert out["B_max"] == 16.0
    assert out["buffer_trace"] == [8.0, 16.0, 16.0, 16.0, 16.0, 16.0, 16.0, 8.0]
    assert (out["ttft_events"], out["tpot_events"]) == (5, 1)


@pytest.mark.parametrize("w,k", [(2.0, 2.0), (1.5, 1.5)])
def test_algorithm2_window_and_count(w, k):
    # lags j in {0, 1} (w = 2 or 1.5), k = 2 (or 1.5 -> 2 misses).
    # it0 TTFT 1 (sum 1): none -> 4.  it1 sum 2: event -> 8, rings cleared.
    # it2 sum 1 -> 8.  it3 sum 2: event -> 16, cleared.  it4 sum 1 -> 16.
    # it5: TTFT ring lags (0, 1) = (0, 1) -> 1 -> 16; it6: 0.  it7: one TPOT miss
    # (sum 1 < 2) -> 16.
    out = _alg2_run(w, k)
    assert out["buffer_trace"] == [4.0, 8.0, 8.0, 16.0, 16.0, 16.0, 16.0, 16.0]
    assert (out["ttft_events"], out["tpot_events"]) == (2, 0)


def test_algorithm2_tpot_wins_over_ttft():
    # Alternating events in separate iterations: r0 p=4 o=3 at t=0, r1 p=4 o=1 at
    # t=1.0, w = k = 1, tiny SLOs.  it0: r0 prefill (TTFT miss) -> 8 (at t = 1, r1 has
    # waited 0 s: no miss).  it1 (t=1): r1 prefill (r0 waits), TTFT miss -> 16.  it2:
    # r0 decodes (gen 2): no finish, no miss -> 16.  it3: r0 finishes, TPOT (4 - 1) / 2
    # -> miss -> 8.
    params = dict(ELLM_PARAMS, w=1.0, k=1.0)
    out, _ = run("ellm", [4, 4], [3, 1], arrival=[0.0, 1.0], params=params,
                 ttft_slo_s=1e-6, tpot_slo_s=1e-6)
    assert out["buffer_trace"] == [8.0, 16.0, 16.0, 8.0]
    # Both events in one iteration: a recompute that finishes (a TPOT miss) next to a
    # new request's first token (a TTFT miss). ellm, P 16, theta 0, act 0, w = k = 1,
    # TTFT SLO 0.5, TPOT SLO 1.1. r0, r1 p=4 o=6 at 0; r2 p=4 o=1 at 5.5.
    # it0: both prefilled (32 - ... fits), TTFT 1.0 > 0.5 twice -> event -> 8. t = 1.
    # it1..it4: decodes, needs 8 + 8 <= 16; r2 not arrived -> 8.  it5 (t=5): needs
    #   12 + 12 > 16 -> r1 preempted; r0 decodes, done (t = 6), TPOT 1.0 <= 1.1; r2
    #   has waited 0.5, not > 0.5 -> 8.
    # it6 (t=6): r1 re-admitted (T 9, KV 12: 16 - 12 = 4 >= 0), r2 (arrived 5.5) too
    #   (16 - 16 = 0 >= 0); prefill-only, t = 7: r1 gen 6 finishes, TPOT (7 - 1) / 5 =
    #   1.2 > 1.1 (miss); r2 TTFT 1.5 > 0.5 (miss) -> TPOT event wins: max(8 / 2, 4) =
    #   4 (a TTFT event would have given 16).
    params = dict(ELLM_PARAMS, w=1.0, k=1.0)
    out, _ = run("ellm", [4, 4, 4], [6, 6, 1], arrival=[0.0, 0.0, 5.5], params=params,
                 n_slots=3, pool_tokens=16.0, ttft_slo_s=0.5, tpot_slo_s=1.1)
    assert out["preemptions"] == 1
    assert out["finish_iter"].tolist() == [5, 6, 6]
    assert out["buffer_trace"] == [8.0] * 6 + [4.0]
    assert (out["ttft_events"], out["tpot_events"]) == (1, 1)
    assert out["first_token_s"].tolist() == [1.0, 1.0, 7.0]


def test_algorithm2_ttft_includes_request_overhead():
    # One request p=4 o=1, first token at t = 1.0: TTFT = 1.0 (+ overhead 0.5 = 1.5).
    # SLO 1.0, w = k = 1: a miss (event, 4 -> 8) only when the overhead is counted.
    params = dict(ELLM_PARAMS, w=1.0, k=1.0)
    out, _ = run("ellm", [4], [1], params=params, ttft_slo_s=1.0)
    assert out["buffer_trace"] == [4.0] and out["ttft_ok"] == 1
    out, _ = run("ellm", [4], [1], params=params, ttft_slo_s=1.0, request_overhead_s=0.5)
    assert out["buffer_trace"] == [8.0] and out["ttft_ok"] == 0
    assert out["ttft_s"].tolist() == [1.5]


def test_algorithm2_a_request_waiting_past_its_ttft_slo_is_a_miss():
    # One slot: r0 p=4 o=4 and r1 p=4 o=1 both at 0; TTFT SLO 1.5, w = k = 1.
    # it0 (t 0 -> 1): r0 prefill, TTFT 1.0; r1 has waited 1.0: no miss -> 4.
    # it1 (-> 2): r1 has waited 2.0 > 1.5 -> miss -> 8.  it2 (-> 3): 3.0 -> 16.
    # it3 (-> 4): r0 finishes (slot free only after the iteration), r1 waited 4.0 ->
    #   16 (B_max).  it4 (-> 5): r1 prefill, TTFT 5.0 -> 16.  Without the waiting rule
    #   only it4's first token would miss: [4, 4, 4, 4, 8].
    params = dict(ELLM_PARAMS, w=1.0, k=1.0)
    out, _ = run("ellm", [4, 4], [4, 1], params=params, n_slots=1, ttft_slo_s=1.5)
    assert out["first_token_s"].tolist() == [1.0, 5.0]
    assert out["buffer_trace"] == [4.0, 8.0, 16.0, 16.0, 16.0]
    assert out["ttft_events"] == 4


def test_algorithm2_tpot_is_the_request_mean_not_its_early_gaps():
    # r0 p=4 o=4 at 0; r1 p=4 o=1 at 1.5 takes a prefill-only iteration (it2) while r0
    # waits: r0's tokens at 1, 2, 4, 5 -> gaps 1, 2, 1, TPOT (5 - 1) / 3 = 1.333.
    # TPOT-so-far after it3 is (4 - 1) / 2 = 1.5, above an SLO of 1.4 that the request
    # meets: no event. With SLO 1.3 its finish (it4) is a miss: one event.
    params = dict(ELLM_PARAMS, w=1.0, k=1.0)
    for slo, events in ((1.4, 0), (1.3, 1)):
        out, _ = run("ellm", [4, 4], [4, 1], arrival=[0.0, 1.5], params=params,
                     tpot_slo_s=slo)
        assert out["first_token_s"].tolist() == [1.0, 3.0]
        assert out["finish_s"].tolist() == [5.0, 3.0]
        assert out["tpot_events"] == events, slo


def test_algorithm2_buffer_unit_starts_and_floors_the_buffer():
    # 1 MiB per token: the default unit (1 GiB) is 1024 tokens; B_max 2 GiB = 2048.
    # Capped by B_max when the host buffer is smaller (0.5 GiB: 512 tokens).
    for gib, start in ((2.0, 1024.0), (0.5, 512.0)):
        out, _ = run("ellm", [4], [1], params=dict(ELLM_PARAMS, cpu_buffer_gib=gib),
                     kv_bytes_per_token=2.0 ** 20, buffer_unit_mib=1024.0)
        assert out["buffer_trace"] == [start]


def test_vllm_cp_chunked_prefill():
    # vllm-cp, chunk 8, P = K = 1000. r0 p=20 o=2, r1 p=4 o=2, both at t=0.
    # it0: no decoder, budget 8: r0 admitted (kv(20) = 20 allocated), computes 8
    #   (pairs 8*4.5 = 36), todo 12; budget left 0 -> r1 fails.
    # it1: r0 partial (kept with need 20); budget 8: r0 computes 8 after 8 (pairs
    #   8*(8+4.5) = 100), todo 4; left 0.
    # it2: r0 computes 4 after 16 (pairs 4*(16+2.5) = 74), todo 0 -> first token;
    #   left 4 -> r1 admitted, computes 4 (pairs 10), todo 0 -> first token too.
    #   prefill 8, pairs 84; t = 3.
    # it3: decoders r0 (ctx 21), r1 (ctx 5); budget 8 - 2 = 6 unused; both gen 2 -> done.
    out, timer = run("vllm-cp", [20, 4], [2, 2], params={"chunk": 8.0})
    assert out["admit_iter"].tolist() == [0, 2]
    assert out["first_token_s"].tolist() == [3.0, 3.0]
    assert out["finish_iter"].tolist() == [3, 3]
    assert out["finish_s"].tolist() == [4.0, 4.0]
    assert timer.calls == [(8, 0, 0, 4, 0.0, 36.0), (8, 0, 0, 4, 0.0, 100.0),
                           (8, 0, 0, 4, 0.0, 84.0), (0, 2, 26, 4, 0.0, 0.0)]
    assert out["max_decode_batch"] == 2
    # it3 after the step: kv(21) + kv(5) = 24 + 8 (it2: 20 + 4)
    assert out["peak_gpu_tokens"] == 32.0


def test_vllm_cp_decoders_share_the_budget():
    # chunk 4: r0 p=4 o=3 at t=0, r1 p=6 o=2 at t=0.
    # it0: r0 admitted, computes 4 (todo 0) -> first token; left 0 -> r1 fails.
    # it1: decoder r0 (ctx 5, gen 2); budget 4 - 1 = 3: r1 admitted, computes 3 of 6
    #   (pairs 3*2 = 6).
    # it2: decoder r0 (ctx 6) -> gen 3 done; budget 3: r1 computes 3 after 3 (pairs
    #   3*(3+2) = 15) -> todo 0 -> first token (t = 3).
    # it3: r1 decodes (ctx 7) -> gen 2 done (t = 4).
    out, timer = run("vllm-cp", [4, 6], [3, 2], params={"chunk": 4.0})
    assert timer.calls == [(4, 0, 0, 4, 0.0, 10.0), (3, 1, 5, 4, 0.0, 6.0),
                           (3, 1, 6, 4, 0.0, 15.0), (0, 1, 7, 4, 0.0, 0.0)]
    assert out["admit_iter"].tolist() == [0, 1]
    assert out["first_token_s"].tolist() == [1.0, 3.0]
    assert out["finish_s"].tolist() == [3.0, 4.0]


def test_vllm_cp_preemption_blocks_admission():
    # vllm-cp chunk 8, P = K = 16, c = 4. r0, r1: p=4 o=6; r2 p=4 o=1 arriving at 4.5.
    # it0: r0 (4) and r1 (4) admitted, computed whole (budget 8), first tokens, t=1.
    # it1..it4: decoders need kv(4 + gen) = 8 each = 16 <= 16 -> gen 5, t = 5.
    # it5 (t=5): needs 12 + 12 > 16 -> r1 preempted (decoder) -> no walk, although r2
    #   has arrived and would fit (used 12 + 4 <= 16). r0 decodes (ctx 9) -> gen 6 done,
    #   t = 6.
    # it6 (t=6): r1 candidate first: T 9, KV 12 <= 16 -> admitted, computes 8 (budget
    #   8), todo 1; left 0 -> r2 fails.  t = 7.
    # it7: r1 partial (kept, need 12); computes 1 after 8 -> gen 6 -> done. left 7:
    #   r2 admitted (12 + 4 <= 16), 4 tokens -> done (o = 1). t = 8.
    out, timer = run("vllm-cp", [4, 4, 4], [6, 6, 1], arrival=[0.0, 0.0, 4.5],
                     params={"chunk": 8.0}, n_slots=3, pool_tokens=16.0)
    assert out["preemptions"] == 1
    assert out["admit_iter"].tolist() == [0, 0, 7]
    assert out["finish_iter"].tolist() == [5, 7, 7]
    assert out["finish_s"].tolist() == [6.0, 8.0, 8.0]
    assert timer.calls[5] == (0, 1, 9, 4, 0.0, 0.0)
    assert timer.calls[6] == (8, 0, 0, 4, 0.0, 36.0)
    # chunks 1 after 8 (1*(8+1) = 9) and 4 after 0 (10)
    assert timer.calls[7] == (5, 0, 0, 4, 0.0, 19.0)
    assert out["peak_gpu_tokens"] == 16.0


def test_vllm_cp_walk_sees_the_decoders_growth():
    # Interpretation 8: a kept decoder's next chunk is allocated before the walk.
    # vllm-cp chunk 8, P = K = 16. r0 p=4 o=3 at 0; r1 p=12 o=1 at 0.5.
    # it0: r0 admitted (kv 4), first token, t = 1.
    # it1: r0 kept, kv := kv(5) = 8; budget 8 - 1 = 7; r1 (arrived): 8 + 0 + 12 = 20
    #   > 16 -> not admitted (with the old kv 4 it would fit: 4 + 12 = 16).
    #   r0 decodes (ctx 5), t = 2.
    # it2: r0 kv(6) = 8 -> 8 + 12 > 16 again; r0 decodes (ctx 6) -> gen 3 done, t = 3.
    # it3: r1 admitted (12 <= 16), 8 of 12 (pairs 36), t = 4.
    # it4: 4 after 8 (pairs 4*(8+2.5) = 42) -> first token, o = 1 -> done, t = 5.
    out, timer = run("vllm-cp", [4, 12], [3, 1], arrival=[0.0, 0.5],
                     params={"chunk": 8.0}, pool_tokens=16.0)
    assert out["admit_iter"].tolist() == [0, 3]
    assert out["finish_s"].tolist() == [3.0, 5.0]
    assert timer.calls[1:] == [(0, 1, 5, 4, 0.0, 0.0), (0, 1, 6, 4, 0.0, 0.0),
                               (8, 0, 0, 4, 0.0, 36.0), (4, 0, 0, 4, 0.0, 42.0)]
    assert out["peak_gpu_tokens"] == 12.0


def test_drop_new_request_that_can_never_fit():
    # vllm: P 64, act f = 1, max_prefill 32 -> K = 64 - kv(32) = 32; watermark 4 -> 28.
    # r0 p=30: KV 32 > 28 -> the walk stops; nothing resident or on the host -> dropped
    # in it0 (0 s). it1: r1 p=8 admitted (t=1); it2: decode -> done (t=2).
    out, timer = run("vllm", [30, 8], [2, 2], pool_tokens=64.0, max_prefill=32,
                     act_coef=(1.0, 0.0, 0.0, 0.0), watermark_tokens=4.0)
    assert out["dropped"] == 1 and out["completed"] == 1
    assert out["dropped_mask"].tolist() == [True, False]
    assert out["admit_iter"].tolist() == [-1, 1]
    assert out["finish_iter"].tolist() == [-1, 2]
    assert out["iterations"] == 2 and out["loop_iterations"] == 3
    assert out["clock"] == 2.0
    assert math.isnan(out["finish_s"][0]) and math.isnan(out["first_token_s"][0])
    assert len(timer.calls) == 2
    # ellm: P 64, theta 0.25 -> theta_tok 16. r0 p=28: 28 + act(28, 1) = 56 > 48 ->
    # dropped. r1 p=20: 64 - (20 + 20) = 24 >= 16 -> resident, served.
    params = dict(ELLM_PARAMS, theta=0.25)
    out, _ = run("ellm", [28, 20], [2, 2], params=params, pool_tokens=64.0,
                 max_prefill=32, act_coef=(1.0, 0.0, 0.0, 0.0))
    assert out["dropped"] == 1 and out["completed"] == 1
    assert out["admit_iter"].tolist() == [-1, 1]
    assert out["offload_tokens"] == 0
    # ellm, offload that could never be fetched: P 32, theta 0.625 -> theta_tok 20,
    # act f = 2.5 -> act(4, 1) = kv(10) = 12. r0 p=4 (KV 4) into the empty server:
    # resident 32 - (4 + 12) = 16 < 20; offload: 32 - (0 + 12) = 20 >= 20, host 4 <=
    # B_logic 4, but KV + act(4, 1) = 16 > 32 - 20 = 12 -> refused -> the walk stops;
    # drop rule: 16 > 12 -> dropped (nothing offloaded, no host slot stuck forever).
    params = dict(ELLM_PARAMS, theta=0.625)
    out, timer = run("ellm", [4], [2], params=params, pool_tokens=32.0,
                     act_coef=(2.5, 0.0, 0.0, 0.0), max_iters=50)
    assert out["dropped"] == 1 and out["offload_tokens"] == 0
    assert out["loop_iterations"] == 1 and timer.calls == []


def test_drop_preempted_slot_that_outgrew_the_pool():
    # vllm, P = K = 8. r0 p=4 o=20. it0 prefill (kv 4), gen 1.
    # it1..it4: need kv(4 + gen) = 8 <= 8 -> gen 5 (t = 5).
    # it5: need kv(9) = 12 > 8 -> r0 preempted (nothing decodes, 0 s).
    # it6: r0 candidate T 9 -> KV 12 > 8 -> walk stops; nothing resident -> dropped.
    # r1 p=4 o=1 arriving at 100 is then served after an idle jump (it7).
    out, _ = run("vllm", [4, 4], [20, 1], arrival=[0.0, 100.0], pool_tokens=8.0)
    assert out["preemptions"] == 1 and out["dropped"] == 1
    assert out["admit_iter"].tolist() == [0, 7]
    assert out["finish_iter"].tolist() == [-1, 7]
    assert out["first_token_s"][0] == 1.0 and math.isnan(out["finish_s"][0])
    assert out["finish_s"][1] == 101.0
    assert out["iterations"] == 6 and out["loop_iterations"] == 8


def _random_workload(seed, n=60):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0.0, 0.5, n)).astype(np.float32)
    prompt = rng.integers(1, 120, n)
    output = rng.integers(1, 40, n)
    prompt[5] = 700  # never fits anywhere below
    valid = np.ones(n, bool)
    valid[-3:] = False
    return arrival, prompt, output, valid


def _roofline(prefill, decode_seqs, decode_ctx, kv_chunk, copy_bytes, pairs):
    return 0.004 + 1e-5 * prefill + 2e-4 * decode_seqs + 1e-6 * decode_ctx + 1e-8 * pairs


@pytest.mark.parametrize("system", ["vllm", "vllm-cp", "ellm"])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_workload_invariants(system, seed):
    arrival, prompt, output, valid = _random_workload(seed)
    P = 400.0
    coef = (0.25, 0.05, 2.0, 8.0)
    params = {"vllm": {}, "vllm-cp": {"chunk": 64.0},
              "ellm": {"theta": 0.05, "a": 2.0, "cpu_buffer_gib": 256 * 2.0 ** -30 * 64,
                       "k": 2.0, "w": 4.0}}[system]
    calls = []

    def timer(*args):
        calls.append(args)
        return _roofline(*args)

    out = simulate_reference(
        arrival, prompt, output, valid, system=system, params=params, n_slots=12,
        admit_window=6, max_batch=10, max_prefill=256, pool_tokens=P, chunk_tokens=8,
        act_coef=coef, watermark_tokens=8.0, ttft_slo_s=0.05, tpot_slo_s=0.01,
        iteration_time=timer, kv_bytes_per_token=64.0, host_link_bw=2e5,
        request_overhead_s=0.001)
    n_valid = int(valid.sum())
    assert out["completed"] + out["dropped"] == n_valid
    assert out["loop_iterations"] < 200_000
    assert out["unserved"] == out["dropped"] >= 1  # request 5 can never fit
    assert out["iterations"] == len(calls)
    assert all(c[3] == 8 and c[4] == 0.0 for c in calls)
    done = out["finish_iter"] >= 0
    assert done.sum() == out["completed"] and not done[~valid].any()
    assert (out["admit_iter"][done] <= out["finish_iter"][done]).all()
    assert (out["finish_s"][done] >= out["first_token_s"][done]).all()
    assert (out["first_token_s"][done] >= arrival[done]).all()
    assert out["clock"] >= float(np.nanmax(out["finish_s"]))
    assert out["max_decode_batch"] <= 10
    if system == "vllm-cp":  # decoders and prefill chunks share the 64-token budget
        assert all(c[0] <= max(64 - c[1], 0) for c in calls)
    else:  # vLLM v0: an iteration prefills or decodes, never both
        assert all(c[0] == 0 or c[1] == 0 for c in calls)
    assert 0 <= out["slo_ok"] <= min(out["ttft_ok"], out["tpot_ok"])
    if system == "ellm":
        B_max = out["B_max"]
        assert B_max == 256.0
        assert out["peak_gpu_tokens"] <= P
        assert out["peak_host_tokens"] <= B_max
        assert out["fetch_tokens"] <= out["offload_tokens"]
        assert len(out["buffer_trace"]) == out["loop_iterations"]
        assert all(8.0 <= b <= B_max for b in out["buffer_trace"])
        if out["offload_tokens"]:
            assert out["offloaded"].any()
    else:
        K = out["K"]
        B = 256 if system == "vllm" else 64
        assert K == P - act_tokens(B, 10, coef, 8)
        assert out["peak_gpu_tokens"] <= K
        assert out["peak_host_tokens"] == 0.0 and out["offload_tokens"] == 0
        assert not out["offloaded"].any() and out["buffer_trace"] == []


def test_random_workload_exercises_the_mechanisms():
    # Not a tautology guard: the invariant workload above must actually preempt (vllm),
    # chunk (vllm-cp) and offload + move the buffer (ellm), else it checks little.
    arrival, prompt, output, valid = _random_workload(0)
    common = dict(n_slots=12, admit_window=6, max_batch=10, max_prefill=256,
                  pool_tokens=400.0, chunk_tokens=8, act_coef=(0.25, 0.05, 2.0, 8.0),
                  watermark_tokens=8.0, ttft_slo_s=0.05, tpot_slo_s=0.01,
                  iteration_time=_roofline, kv_bytes_per_token=64.0, host_link_bw=2e5,
                  request_overhead_s=0.001)
    v = simulate_reference(arrival, prompt, output, valid, system="vllm", params={},
                           **common)
    assert v["preemptions"] > 0
    calls = []
    cp = simulate_reference(arrival, prompt, output, valid, system="vllm-cp",
                            params={"chunk": 64.0},
                            **dict(common, iteration_time=lambda *a: calls.append(a)
                                   or _roofline(*a)))
    assert cp["preemptions"] > 0
    assert any(c[0] > 0 and c[1] > 0 for c in calls)  # mixed prefill + decode steps
    e = simulate_reference(arrival, prompt, output, valid, system="ellm",
                           params={"theta": 0.05, "a": 2.0,
                                   "cpu_buffer_gib": 256 * 2.0 ** -30 * 64,
                                   "k": 2.0, "w": 4.0}, **common)
    assert e["offload_tokens"] > 0 and e["fetch_tokens"] > 0
    assert e["ttft_events"] > 0 and e["tpot_events"] > 0
    assert max(e["buffer_trace"]) >= 64.0
    assert e["inflation_events"] > 0 and e["deflation_events"] > 0
