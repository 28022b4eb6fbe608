"""The parameter-dropping family as a plug-in (``models.family``): options, the cost-model
fit and weight size as family inputs, the initial cluster, the step, metrics and the
derived deployment values."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from models.dropping.state import (DropAcc, DropInputs, DropOptions, DropPolicy,
                                   DropState, Requests)
from models.dropping.step import step as _step
from models.family import Inputs, Metric, SimOptions
from models.outcomes import CORE_METRICS, core_metrics
from models.server import init_acc, init_record

__all__ = ["DROPPING", "POLICIES", "T_CHUNK_S", "fit_cost_model", "initial_groups"]

POLICIES = {
    "kunserve": DropPolicy(drop=True, lookahead=True),
    "vllm-dp": DropPolicy(),
    "vllm-pp": DropPolicy(pairs=True),
    "infercept": DropPolicy(swap=True),
    "llumnix": DropPolicy(migrate=True),
}
GIB = 2.0 ** 30
# per exchanged chunk: post one RDMA write and check for pending activations (our
# assumption; the paper gives no figure)
T_CHUNK_S = 20e-6


def _policy(system: str) -> DropPolicy:
    if system not in POLICIES:
        raise ValueError(f"no dropping policy for system {system!r}; known: "
                         f"{', '.join(sorted(POLICIES))}")
    return POLICIES[system]


def initial_groups(n: int, pairs: bool) -> np.ndarray:
    """gid per instance: singletons, or pairs {0,1}, {2,3}, ... (vLLM PP)."""
    i = np.arange(n)
    return np.where(pairs & (i // 2 * 2 + 1 < n), i // 2 * 2, i).astype(np.int32)


def fit_cost_model(hw, k: int = 2):
    """(a, b, g): least squares of eq. (1) on the stage roofline of single microbatches
    (docs/kunserve-semantics.md, "Cost model fit"), negative coefficients clipped."""
    from hardware.roofline import iteration_time

    stage = hw._replace(weight_bytes=hw.weight_bytes / k,
                        kv_bytes_per_token=hw.kv_bytes_per_token / k,
                        dense_flops_per_token=hw.dense_flops_per_token / k,
                        attn_flops_per_ctx_token=hw.attn_flops_per_ctx_token / k,
                        allreduces_per_stage=hw.allreduces_per_stage / k,
                        pp=1.0, step_overhead_s=0.0, token_overhead_s=0.0)
    rows, ys = [], []
    for c in 2.0 ** np.arange(7, 13):
        for p in (0.0, 1024.0, 4096.0):
            pairs = p * c + (c * c + c) / 2.0
            rows.append([pairs, c, 1.0])
            ys.append(float(iteration_time(stage, c, 0.0, 0.0, 16.0, prefill_ctx_tokens=pairs)))
    for nseq in (8.0, 32.0, 128.0):
        for ctx in (512.0, 2048.0):
            rows.append([nseq * (ctx + 1.0), nseq, 1.0])
            ys.append(float(iteration_time(stage, 0.0, nseq, nseq * ctx, 16.0)))
    coef, *_ = np.linalg.lstsq(np.asarray(rows), np.asarray(ys), rcond=None)
    return tuple(float(max(v, 0.0)) for v in coef)


class _Dropping:
    name = "dropping"
    default_objective = "ttft_tail"  # tuner.objective.objectives preset: p99 TTFT under a TPOT SLO
    metrics_spec = {
        **CORE_METRICS,
        "inv_ttft_p99": Metric("1/s", "1 / ttft_p99_s (higher is better: objectives "
                               "maximise)"),
        "bubble_share": Metric("share of GPU time", "idle GPU-seconds / GPU-seconds of "
                               "pipelined rounds (the paper's bubble ratio)", share=True),
        "drops": Metric("events", "group merges (one weight copy dropped each)"),
        "restores": Metric("events", "groups restored to singletons"),
        "exchange_stall_s": Metric("request-s", "request-seconds stalled by KV exchange"),
        "exchanged_gib": Metric("GiB", "KV moved between instances (exchange, restore "
                                "gather, migration)"),
        "swap_gib": Metric("GiB", "KV moved to or from host memory"),
        "migrations": Metric("events", "live migrations started"),
        "peak_cluster_kv_gib": Metric("GiB", "largest KV held in the cluster"),
        "peak_cluster_cap_gib": Metric("GiB", "largest cluster KV capacity (grows when "
                                       "weights are dropped)"),
        "mean_group_size": Metric("instances", "instance-time-weighted group size"),
        "pipelined_share": Metric("share of instance time", "instance-time in groups of "
                                  "more than one instance", share=True),
    }

    def options(self, system, **settings):
        _policy(system)
        allowed = {"n_instances", "microbatch", "coordinated", "restore", "max_depth"}
        unknown = set(settings) - allowed
        if unknown:
            raise ValueError(f"{system}: unknown option(s) {sorted(unknown)}; the dropping "
                             f"family takes {sorted(allowed)}")
        kw = dict(settings)
        for key in ("n_instances", "max_depth"):
            if key in kw:
                kw[key] = int(kw[key])
        for key in ("coordinated", "restore"):
            if key in kw:
                v = kw[key]
                kw[key] = v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")
        o = DropOptions(**kw)
        if o.n_instances > 16:
            raise ValueError(f"{system}: n_instances must be <= 16 (a round's token "
                             f"microbatches are at most 16), got {o.n_instances}")
        return o

    def extra(self, wl, cfg, opts: SimOptions, history=None, deployment=None):
        """Weight tokens W and the fitted cost model of ``deployment``."""
        import hardware

        if deployment is None:
            raise ValueError(f"{opts.system}: the dropping family frees weight memory and "
                             "needs the deployment (make_inputs(..., deployment=...))")
        kvb = float(cfg.kv_bytes_per_token)
        w = float(deployment.weight_bytes_per_device) / kvb
        a, b, g = fit_cost_model(hardware.roofline_params(deployment))
        return DropInputs(weight_tokens=jnp.float32(w), cost_a=jnp.float32(a),
                          cost_b=jnp.float32(b), cost_g=jnp.float32(g),
                          t_chunk=jnp.float32(T_CHUNK_S))

    def init(self, inputs: Inputs, params, t, opts: SimOptions) -> DropState:
        wl, cfg, x = inputs.wl, inputs.cfg, inputs.extra
        n = opts.family.n_instances
        pol = _policy(opts.system)
        gid = initial_groups(n, pol.pairs)
        size = np.bincount(gid, minlength=n).astype(np.float32)
        capw = jnp.where(jnp.asarray(size) > 0,
                         jnp.asarray(size) * cfg.capacity_tokens
                         + jnp.maximum(jnp.asarray(size) - 1.0, 0.0) * x.weight_tokens,
                         cfg.capacity_tokens)
        R = wl.size
        zf = jnp.zeros(R, jnp.float32)
        nan = jnp.full(R, jnp.nan, jnp.float32)
        req = Requests(status=jnp.zeros(R, jnp.int32), inst=jnp.zeros(R, jnp.int32),
                       target=wl.prompt_tokens.astype(jnp.float32), done=zf, gen=zf, kv=zf,
                       host=zf, stall=jnp.full(R, -jnp.inf, jnp.float32),
                       weight=jnp.ones(R, jnp.float32), t_admit=nan, t_first=nan, t_done=nan,
                       mig_to=jnp.full(R, -1, jnp.int32), mig_end=zf, mig_kv=zf)
        t0 = jnp.float32(0.0)
        rec = init_record(R) if opts.record else None
        return DropState(req=req, gid=jnp.asarray(gid), iclock=jnp.zeros(n, jnp.float32) + t0,
                         capw=capw.astype(jnp.float32),
                         x_end=jnp.full(n, -jnp.inf, jnp.float32),
                         restoring=jnp.zeros(n, bool), pull_end=jnp.zeros(n, jnp.float32),
                         mig_res=jnp.zeros(n, jnp.float32),
                         held=jnp.zeros(n, jnp.float32), queued=jnp.zeros(n, jnp.float32),
                         live=jnp.zeros(n, jnp.int32), hol=jnp.full(n, R, jnp.int32),
                         head=jnp.int32(0),
                         clock=t0, it=jnp.int32(0), picked=jnp.int32(-1),
                         round_s=jnp.float32(0.0), acc=init_acc(DropAcc), rec=rec)

    def step(self, state, inputs: Inputs, params, *, hw, t, opts: SimOptions):
        if opts.work_log:
            raise ValueError(f"{opts.system}: the dropping family keeps no work log")
        return _step(state, inputs, hw, params, t, _policy(opts.system), opts)

    def sink(self, opts: SimOptions):
        return None

    def end_block(self, state, inputs: Inputs, params, *, t, opts: SimOptions):
        return state

    def done(self, state, inputs: Inputs):
        return jnp.sum((state.req.status == 3) & inputs.wl.valid) >= jnp.sum(inputs.wl.valid)

    def memory_limit(self, inputs: Inputs, params, opts: SimOptions):
        """Upper bound on the cluster KV a step reports: every instance dropped to a
        single weight copy, ``N C + (N - 1) W``."""
        n = opts.family.n_instances
        return n * inputs.cfg.capacity_tokens + (n - 1) * inputs.extra.weight_tokens

    def metrics(self, state, inputs: Inputs) -> dict:
        acc, cfg = state.acc, inputs.cfg
        gib = cfg.kv_bytes_per_token / GIB
        n = state.gid.shape[0]
        out = core_metrics(state, inputs)
        if state.rec is None:  # exact percentiles from the per-request times the state
            # keeps anyway (the histograms' 12%-wide bins make tail objectives flat)
            r, wl = state.req, inputs.wl
            fin = (r.status == 3) & wl.valid
            ttft = jnp.where(fin, r.t_first - wl.arrival_s, jnp.nan)
            tpot = jnp.where(fin & (wl.output_tokens > 1), (r.t_done - r.t_first)
                             / jnp.maximum(wl.output_tokens - 1, 1), jnp.nan)
            for name, v in (("ttft", ttft), ("tpot", tpot)):
                for q in (50, 90, 99):
                    out[f"{name}_p{q}_s"] = jnp.nanpercentile(v, float(q))
        span = out["makespan_s"]
        cluster = n * cfg.capacity_tokens
        inst = jnp.maximum(acc.inst_s, 1e-9)
        out.update({
            "peak_kv_share": acc.peak_kv / cluster,
            "kv_occupancy": acc.res_token_s / (span * cluster),
            "inv_ttft_p99": 1.0 / jnp.maximum(out["ttft_p99_s"], 1e-6),
            "bubble_share": acc.bubble_gpu_s / jnp.maximum(acc.pipe_gpu_s, 1e-9),
            "drops": acc.drops,
            "restores": acc.restores,
            "exchange_stall_s": acc.stall_s,
            "exchanged_gib": acc.exchanged * gib,
            "swap_gib": acc.swapped * gib,
            "migrations": acc.migrations,
            "peak_cluster_kv_gib": acc.peak_kv * gib,
            "peak_cluster_cap_gib": acc.peak_cap * gib,
            "mean_group_size": jnp.where(acc.inst_s > 0, acc.group_inst_s / inst, 1.0),
            "pipelined_share": jnp.where(acc.inst_s > 0,
                                         (acc.group_inst_s - acc.inst_s) / inst, 0.0),
        })
        return out

    def deployment(self, inputs: Inputs, params, opts: SimOptions) -> dict:
        """The cluster's sizes, what one drop frees and the fitted cost model."""
        cfg, x, fo = inputs.cfg, inputs.extra, opts.family
        kvb = float(cfg.kv_bytes_per_token)
        out = {"n_instances": fo.n_instances,
               "kv_tokens_per_instance": int(cfg.capacity_tokens),
               "kv_gib_per_instance": float(f"{float(cfg.capacity_tokens) * kvb / GIB:.6g}"),
               "weight_gib_per_copy": float(f"{float(x.weight_tokens) * kvb / GIB:.6g}"),
               "freed_tokens_per_drop": int(x.weight_tokens),
               "cost_model_s": {"a_per_pair": float(x.cost_a), "b_per_token": float(x.cost_b),
                                "g_per_batch": float(x.cost_g)},
               "initial_groups": initial_groups(fo.n_instances,
                                                _policy(opts.system).pairs).tolist()}
        if opts.system == "kunserve":
            out.update(restore_threshold=float(params["theta"]),
                       drop_trigger_margin=float(params["margin"]),
                       min_tokens_per_microbatch=int(round(float(params["min_tokens"]))),
                       exchange_chunk_mib=float(params["chunk_mib"]),
                       microbatch=fo.microbatch, coordinated_exchange=fo.coordinated,
                       restore=fo.restore)
        return out


DROPPING = _Dropping()
