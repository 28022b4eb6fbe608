"""A scenario: workload slice + deployment + server settings, ready to simulate.

``ScenarioSpec`` is what a user chooses (all plain values, serialisable into a policy
file); ``build_scenario`` turns it into the simulators' inputs: a padded
:class:`models.Workload` with predictions, a :class:`models.ServerConfig`, the hardware
roofline parameters and the history (realised lengths of the requests before the slice,
i.e. the deployment's past; a family may use it, e.g. to fill ODMA's window).
``Scenario.inputs(system)`` hands them to the system's family; the tuner never sees
what a family makes of them.
"""

from __future__ import annotations

import dataclasses
import math
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import hardware
from models import Inputs, ServerConfig, SimOptions, Workload, make_inputs, make_options
from tuner.workloads import arrivals
from tuner.workloads.presets import resolve_trace
from tuner.workloads.traces import Trace, summary, to_workload

__all__ = ["CALIBRATION_MAX", "CALIBRATION_MIN", "DEFAULT_RATE", "KV_CACHE_DTYPES",
           "PREDICTOR_CACHE", "SCHEDULERS", "U_CALIBRATIONS", "Scenario", "ScenarioSpec",
           "build_scenario", "check_profile_model", "check_spec", "clip_lengths",
           "profile_model", "resolve_hardware", "resolve_model",
           "scale_to_max_tokens"]

DEFAULT_RATE = 5.0  # req/s for traces without timestamps (Azure conv. averages 5.53)
# "v0": vLLM v0's default scheduler (chunked prefill off: prefill-only iterations, whole
# prompts under the max_prefill budget); "chunked": chunked prefill (vLLM V1's only mode)
SCHEDULERS = ("v0", "chunked")
# fields added after policy files were first written: at their defaults they are left
# out of the fingerprint, so a scenario that does not use them keeps its fingerprint
_LATER_FIELDS = ("max_tokens", "scheduler", "watermark", "pred_quantile",
                 "u_calibration", "gpu_memory_utilization", "max_model_len", "block_size",
                 "kv_cache_dtype", "enforce_eager")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# how the uncertainty u reaches the simulator: "raw" as the length source gives it (the
# predictor's class entropy / log K, or the error model's recorded u); "rank": its
# empirical CDF position over a calibration set, so that u > tau routes a share ~1 - tau
U_CALIBRATIONS = ("raw", "rank")
# rank calibration's reference: the predictions of the requests before the slice when
# there are at least CALIBRATION_MIN of them (the most recent CALIBRATION_MAX, ODMA's
# window size, bounding the cost on long traces), else the slice's own predictions
CALIBRATION_MIN = 200
CALIBRATION_MAX = 10000
PREDICTOR_CACHE = Path.home() / ".cache" / "kvtune" / "predictor.msgpack"


@dataclass(frozen=True)
class ScenarioSpec:
    trace: str = "default"
    hardware: str = "mlu370-x4"
    model: str = "deepseek-r1-distill-qwen-7b"
    tp: int | None = None
    capacity_tokens: int | None = None   # override the deployment's KV capacity
    rate: float | None = None            # req/s; None: the trace's own timestamps
    n_requests: int | None = None        # None: the whole trace
    offset: int = 0                      # first request of the slice
    seed: int = 0                        # arrivals (when drawn) and prediction errors
    max_len: int | None = None           # output cap; None: next power of two >= max
    #                                      output (at most 16384 and the model's context)
    # per request prompt + output <= max_tokens, scaled down proportionally as Vidur's
    # trace length generator does (scale_to_max_tokens); None: no such clip
    max_tokens: int | None = None
    n_slots: int = 256
    max_batch: int = 256                 # running requests at most (vLLM max_num_seqs)
    max_prefill: int = 8192              # tokens per iteration (max_num_batched_tokens)
    scheduler: str = "v0"                # one of SCHEDULERS
    watermark: float = 0.01              # KV share a paged admission leaves free (vLLM
    #                                      v0 block manager: 1% of the blocks)
    admit_window: int = 32
    ttft_slo_s: float | None = None      # None: slo_scale x the uncontended TTFT
    tpot_slo_s: float | None = None      # None: slo_scale x the uncontended TPOT
    slo_scale: float = 25.0              # eLLM section 5 (after DistServe): 25x
    block: int = 16                      # iterations per scanned block
    # family options as (name, value) pairs, e.g. (("window", 10000),) for ODMA's window;
    # empty: the family's defaults
    options: tuple = ()
    predictor: str | None = None         # model file for traces with prompt text
    # traces with prompt text (the flax predictor): the level of the predictive length
    # distribution used as L_hat; None: the predictor's stored ``quantile`` (the level
    # that minimised held-out MAE, 0.5 for the shipped model). Not for error-model traces
    pred_quantile: float | None = None
    u_calibration: str = "raw"           # one of U_CALIBRATIONS
    # vLLM engine settings of the memory profile (hardware.memory_profile, under vLLM's
    # own names): the KV capacity is what vLLM would allocate with them, for the V0
    # engine under scheduler "v0" and the V1 engine under "chunked"
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None     # None: the model's context (v0: at most
    #                                      max_prefill, as vLLM V0 requires); given: also
    #                                      clips each request's prompt + output to it
    block_size: int = 16
    kv_cache_dtype: str = "auto"         # one of KV_CACHE_DTYPES
    enforce_eager: bool = False

    def replace(self, **kw) -> "ScenarioSpec":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["options"] = {k: v for k, v in self.options}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ScenarioSpec":
        """Inverse of :meth:`to_dict`; also reads files written before family options
        (``window``/``refresh_every`` keys, ``refresh_check`` for ``block``)."""
        d = dict(d)
        opts = dict(d.pop("options", None) or {})
        for old in ("window", "refresh_every"):
            if old in d:
                opts[old] = d.pop(old)
        if "refresh_check" in d:
            d["block"] = d.pop("refresh_check")
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"scenario: unknown field(s) {sorted(unknown)}")
        return cls(**d, options=tuple(sorted(opts.items())))


@dataclass(frozen=True)
class Scenario:
    spec: ScenarioSpec
    workload: Workload
    cfg: ServerConfig
    hw: hardware.RooflineParams
    deployment: hardware.Deployment
    history: np.ndarray      # realised output lengths (<= max_len) before the slice
    prediction_source: str
    summary: dict
    fingerprint: str
    clipped_outputs: int     # requests of the slice whose output was shortened
    clipped_prompts: int = 0  # requests of the slice whose prompt was shortened
    slo: dict = dataclasses.field(default_factory=dict)  # ttft_s, tpot_s, source
    warnings: tuple = ()     # silent assumptions and overload, for the CLI to print
    # the slice's requests all arrive at t = 0 (nominal_rps inf): the unit-rate arrival
    # pattern (seeded Poisson, one per valid request) that at_rate rescales instead
    pattern: np.ndarray | None = None

    @property
    def nominal_rps(self) -> float:
        """The slice's own mean arrival rate, ``(n - 1) / span`` req/s (``inf`` when
        every request arrives at t = 0)."""
        return float(self.summary["rate_rps"])

    def check_rate_ladder(self, objective: str) -> None:
        """ValueError unless a capacity objective's rate ladder (``objective`` names it in
        the message) can place this slice at other rates: a slice whose requests all
        arrive at t = 0 has no time pattern to rescale."""
        if not math.isfinite(self.nominal_rps):
            raise ValueError(
                f"trace {self.spec.trace}: all {self.summary['requests']} requests of the "
                f"slice arrive at t = 0, so there is no time pattern for the rate ladder "
                f"of objective {objective!r}: pass --rate R (Poisson arrivals at R req/s) "
                "or an objective without one (e.g. --objective tps)")

    def padded(self, n: int) -> "Scenario":
        """The same requests padded with invalid rows to ``n`` (equal shapes share
        compiled code: validation pads every window to the whole slice)."""
        wl = self.workload
        k = n - wl.size
        if k < 0:
            raise ValueError(f"cannot pad {wl.size} requests to {n}")
        if k == 0:
            return self
        fill = {"arrival_s": jnp.inf, "prompt_tokens": 1, "output_tokens": 1,
                "pred_tokens": 1.0, "pred_u": 0.0, "valid": False}
        if wl.priority is not None:  # padding rows come last
            fill["priority"] = jnp.inf
        wl = Workload(**{f: jnp.concatenate([getattr(wl, f), jnp.full(k, v, getattr(
            wl, f).dtype)]) for f, v in fill.items()})
        return dataclasses.replace(self, workload=wl)

    def at_rate(self, rate: float) -> "Scenario":
        """The same requests with the arrival pattern rescaled to mean ``rate`` req/s
        (``math.inf``: every request at once)."""
        from tuner.scenario.rates import scale_workload

        if rate == float("inf"):
            return dataclasses.replace(self, workload=scale_workload(self.workload, 0.0))
        if not float(rate) > 0:
            raise ValueError(f"arrival rate must be > 0 req/s, got {rate!r}")
        if self.pattern is not None:  # all at once: the Poisson pattern at that rate
            wl = self.workload
            t = np.full(wl.size, np.inf)
            t[:len(self.pattern)] = self.pattern / float(rate)
            return dataclasses.replace(self, workload=wl.replace(arrival_s=jnp.where(
                wl.valid, jnp.asarray(t, wl.arrival_s.dtype), jnp.inf)))
        factor = self.nominal_rps / float(rate)
        return dataclasses.replace(self, workload=scale_workload(self.workload, factor))

    def options(self, system: str, record: bool = False) -> SimOptions:
        s = self.spec
        return make_options(system, block=s.block, record=record, **dict(s.options))

    def inputs(self, system: str) -> Inputs:
        """The simulator inputs of ``system`` (its family's own inputs included)."""
        return make_inputs(self.workload, self.cfg, self.options(system), self.history,
                           deployment=self.deployment)


def _predictions(trace: Trace, out, hist_out, spec: ScenarioSpec, sl: slice):
    """(L_hat, u, source, warnings) for the slice ``sl`` of ``trace`` whose realised
    (clipped) outputs are ``out``; ``hist_out`` are those of the requests before it.

    ``spec.pred_quantile`` (predictor only) picks the level of the predictive length
    mixture used as L_hat. ``spec.u_calibration == "rank"`` replaces u by its position
    in the empirical CDF of a calibration set's u (:func:`error_model.rank_calibrate`),
    so that ``u > tau`` routes a share ~1 - tau of requests (ties aside).

    What the papers say of tau: the strategy paper (shared/seeds/odma-strategy.txt,
    section III.B) "Requests with high uncertainty (u > tau) represent risk and are
    routed to a fallback pool. In our implementation (gamma = 0.2, tau = 0.8), this
    policy maintains tight buckets for the majority of traffic while explicitly
    budgeting for uncertainty."; the framework paper (odma-framework.txt) calls it "a
    configurable threshold tau" (section 3.4) on a u that "can be instantiated using
    the entropy or margin of a softmax distribution over coarse length buckets, or by
    the variance of a small ensemble" (section 3.2). Neither says what share tau = 0.8
    routes, and a raw entropy has no scale on which 0.8 means the same across
    predictors; the rank makes tau the share kept in regular buckets (0.8: 80%, "the
    majority of traffic"). Rank-calibrated u also sets the inflation
    ``L_hat * (1 + gamma * u)``.

    The calibration set is the predictions of the requests before the slice (at most
    the last CALIBRATION_MAX) when there are at least CALIBRATION_MIN of them, else
    the slice's own predictions (a warning says so: no realised length is used, but
    the slice's later requests inform the earlier ones' u)."""
    from tuner.workloads import error_model as em

    warnings = []
    n_hist = sl.start
    cal = slice(max(0, n_hist - CALIBRATION_MAX), n_hist)
    use_hist = spec.u_calibration == "rank" and n_hist >= CALIBRATION_MIN
    cal_u = None
    if trace.prompt_text is not None:
        from tuner.workloads import predictor as pr

        path = Path(spec.predictor) if spec.predictor else PREDICTOR_CACHE
        if path.exists():
            model = pr.load(path)
        else:  # train once on CASTILLO's validate split and cache the weights
            from tuner.workloads.presets import traces_dir

            model = pr.train(traces_dir() / "castillo-qwen2.5-7b", seed=0)
            path.parent.mkdir(parents=True, exist_ok=True)
            model.save(path)

        def predict(s: slice):
            ds = list(trace.dataset[s]) if trace.dataset is not None else None
            return model.predict(list(trace.prompt_text[s]), trace.prompt_tokens[s], ds,
                                 quantile=spec.pred_quantile)

        l_hat, u, _ = predict(sl)
        if use_hist:
            cal_u = predict(cal)[1]
        source = "predictor"
    else:
        error_model = em.load_default_error_model()
        if spec.pred_quantile is not None:
            q = error_model.meta.get("predictor_quantile")
            raise ValueError(
                f"pred_quantile applies only to traces with prompt text (the length "
                f"predictor); trace {spec.trace} has none, so its predictions come from "
                f"the error model, which replays recorded (L_hat / L, u) pairs at the "
                f"predictor's own quantile ({q}); leave pred_quantile unset")
        l_hat, u = error_model.sample(out, spec.seed)
        if use_hist:  # the history's own draws, from a stream apart from the slice's
            cal_u = error_model.sample(hist_out[cal], spec.seed + 1)[1]
        source = "error-model"
    l_hat, u = np.asarray(l_hat, np.float64), np.asarray(u, np.float64)
    if spec.u_calibration == "rank":
        if cal_u is None:
            cal_u = u
            warnings.append(
                f"u_calibration rank: only {n_hist} requests before the slice (< "
                f"{CALIBRATION_MIN}), so u is ranked among the slice's own {len(u)} "
                "predictions (no realised length used, but later requests inform "
                "earlier ones)")
        u = em.rank_calibrate(u, cal_u)
    return l_hat, u, source, warnings


def scale_to_max_tokens(prompt, output, max_tokens: int):
    """Each request's prompt + output scaled down proportionally to at most
    ``max_tokens``, by the rule of Vidur's trace request-length generator
    (microsoft/vidur, vidur/request_generator/trace_request_length_generator.py,
    ``TraceRequestLengthGenerator.__init__``; ``--trace_request_length_generator_config_
    max_tokens``): with ``total = p + o`` and ``diff = max(total - max_tokens, 0)``, the
    prompt loses ``ceil(diff * (p / total))`` tokens and the output
    ``ceil(diff * (o / total))`` (the ratio taken first, in float64, as there), then
    each is raised to at least 1. Both deductions round up, so a clipped request may end
    a token short of ``max_tokens``; requests within it are unchanged."""
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2 (one prompt and one output token), "
                         f"got {max_tokens}")
    p = np.asarray(prompt, np.int64)
    o = np.asarray(output, np.int64)
    total = p + o
    diff = np.maximum(total - int(max_tokens), 0)
    ratio_p = p / np.maximum(total, 1)  # total >= 2: trace token counts are >= 1
    ratio_o = o / np.maximum(total, 1)
    p = np.maximum(p - np.ceil(diff * ratio_p).astype(np.int64), 1)
    o = np.maximum(o - np.ceil(diff * ratio_o).astype(np.int64), 1)
    return p, o


def clip_lengths(prompt, output, *, max_len: int, max_position: int,
                 max_tokens: int | None = None):
    """The lengths a request has in the simulation: first the total-token clip
    (:func:`scale_to_max_tokens`, when ``max_tokens`` is set), then vLLM's context rule
    (``max_model_len``: prompt + output <= ``max_position``): a prompt is cut to
    ``max_position - 1`` only if longer, an output to ``min(max_len, max_position -
    prompt)``. Returns (prompt, output) as int64 arrays."""
    p = np.asarray(prompt, np.int64)
    o = np.asarray(output, np.int64)
    if max_tokens is not None:
        p, o = scale_to_max_tokens(p, o, max_tokens)
    p = np.minimum(p, int(max_position) - 1)
    o = np.minimum(o, np.minimum(int(max_len), int(max_position) - p))
    return p, o


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return (isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, bool))


# (field, kind, lowest value or None) of the fields whose type check_spec checks first;
# kinds: "int", "int?" (or None), "real?" (a finite number or None), "str", "str?"
_FIELD_TYPES = (
    ("trace", "str", None), ("hardware", "str", None), ("model", "str", None),
    ("tp", "int?", 1), ("capacity_tokens", "int?", 1), ("rate", "real?", None),
    ("n_requests", "int?", 1), ("offset", "int", 0), ("seed", "int", 0),
    ("max_len", "int?", None), ("n_slots", "int", None), ("max_batch", "int", None),
    ("max_prefill", "int", None), ("admit_window", "int", None), ("block", "int", None),
    ("ttft_slo_s", "real?", None), ("tpot_slo_s", "real?", None),
    ("slo_scale", "real", None), ("predictor", "str?", None),
    ("enforce_eager", "bool", None))


def _check_types(spec: ScenarioSpec) -> None:
    for name, kind, low in _FIELD_TYPES:
        v = getattr(spec, name)
        if kind.endswith("?"):
            if v is None:
                continue
            kind = kind[:-1]
        ok = {"int": _is_int, "real": _is_real, "str": lambda x: isinstance(x, str),
              "bool": lambda x: isinstance(x, (bool, np.bool_))}[kind](v)
        if kind == "real" and ok and not np.isfinite(v):
            ok = False
        if kind == "str" and ok and not v.strip():
            ok = False
        what = {"int": "an integer", "real": "a finite number", "str": "a non-empty string",
                "bool": "true or false"}[kind]
        if low is not None:
            ok = ok and v >= low
            what = "a positive integer" if low == 1 else f"an integer >= {low}"
        if not ok:
            raise ValueError(f"{name} must be {what}, got {v!r}")
    opts = spec.options
    if not isinstance(opts, tuple) or not all(
            isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], str)
            and _is_int(o[1]) for o in opts):
        raise ValueError(f"options must map option names to integers, got "
                         f"{dict(opts) if isinstance(opts, tuple) else opts!r}")


def _one_of(name: str, value, choices: tuple, meaning: str = "") -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}{meaning}, "
                         f"got {value!r}")


def check_spec(spec: ScenarioSpec) -> None:
    """Raise ValueError on settings no scenario can have (those that need the trace or
    the deployment are checked by :func:`build_scenario`). Every field's type is
    checked first (a policy file may hold any JSON value), each error naming it."""
    _check_types(spec)
    if spec.n_slots < 16 or spec.admit_window < 1 or spec.max_batch < 1 or spec.block < 1:
        raise ValueError("n_slots must be >= 16, admit_window, max_batch and block >= 1")
    if spec.max_batch > spec.n_slots:
        raise ValueError(f"max_batch {spec.max_batch} exceeds n_slots {spec.n_slots}: the "
                         "slot table holds every running request (raise --slots)")
    if not spec.max_prefill >= 1:
        raise ValueError(f"max_prefill must be >= 1 token per iteration, got "
                         f"{spec.max_prefill}")
    if spec.rate is not None and not spec.rate > 0:
        raise ValueError(f"rate must be > 0 req/s, got {spec.rate}")
    if spec.max_len is not None and spec.max_len < 1:
        raise ValueError(f"max_len must be >= 1 token, got {spec.max_len}")
    mt = spec.max_tokens
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, (int, np.integer))
                           or mt < 2):
        raise ValueError(f"max_tokens must be an integer >= 2 (one prompt and one output "
                         f"token), got {mt!r}")
    _one_of("scheduler", spec.scheduler, SCHEDULERS, " (v0: vLLM v0's default, chunked "
            "prefill off; chunked: chunked prefill)")
    w = spec.watermark
    if (isinstance(w, bool) or not isinstance(w, (int, float, np.floating))
            or not 0.0 <= w < 0.5):
        raise ValueError(f"watermark must be a share of the KV capacity in [0, 0.5), "
                         f"got {w!r}")
    q = spec.pred_quantile
    if q is not None and (isinstance(q, bool) or not isinstance(
            q, (int, float, np.integer, np.floating)) or not 0.0 < q < 1.0):
        raise ValueError(f"pred_quantile must be a level of the predictive length "
                         f"distribution in (0, 1) (e.g. 0.9), or unset for the "
                         f"predictor's own; got {q!r}")
    g = spec.gpu_memory_utilization
    if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0.0 < g <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be a share in (0, 1], got {g!r}")
    for name in ("max_model_len", "block_size"):
        v = getattr(spec, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))
                              or v < 1):
            raise ValueError(f"{name} must be an integer >= 1 token, got {v!r}")
    _one_of("kv_cache_dtype", spec.kv_cache_dtype, KV_CACHE_DTYPES)
    _one_of("u_calibration", spec.u_calibration, U_CALIBRATIONS, " (raw: u as predicted; "
            "rank: its empirical CDF position, so that u > tau routes a share 1 - tau)")


def _fingerprint_spec(spec: ScenarioSpec) -> dict:
    d = spec.to_dict()
    default = ScenarioSpec()
    for k in _LATER_FIELDS:
        if d[k] == getattr(default, k):
            del d[k]
    return d


def build_scenario(spec: ScenarioSpec) -> Scenario:
    """Resolve the trace, slice it, draw predictions and build the simulator inputs."""
    check_spec(spec)
    trace = resolve_trace(spec.trace, seed=spec.seed)
    n_total = len(trace.output_tokens)
    end = n_total if spec.n_requests is None else spec.offset + spec.n_requests
    if spec.offset < 0 or spec.offset >= n_total or end > n_total or end <= spec.offset:
        raise ValueError(f"trace {spec.trace}: slice [{spec.offset}, {end}) is outside its "
                         f"{n_total} requests")
    sl = slice(spec.offset, end)
    device, calibrated, pm = resolve_hardware(spec.hardware)
    check_profile_model(spec, pm)
    dep = _deployment(spec, device)
    max_pos = int(dep.model.max_position)
    if spec.max_model_len is not None:
        max_pos = min(max_pos, int(spec.max_model_len))
    raw_p, raw_o = trace.prompt_tokens, trace.output_tokens
    if spec.max_tokens is not None:
        scaled_p, scaled_o = scale_to_max_tokens(raw_p, raw_o, spec.max_tokens)
    else:
        scaled_p, scaled_o = raw_p, raw_o
    max_out = int(scaled_o[sl].max())
    max_len = spec.max_len or int(min(max(256, 2 ** int(np.ceil(np.log2(max_out)))), 16384,
                                      max_pos))
    if max_len > max_pos:
        raise ValueError(f"max_len {max_len} exceeds {dep.model.name}'s context "
                         f"{max_pos}")
    # the whole trace, clipped per request: the slice, the history before it and the
    # uncontended latencies of the SLOs all see the same lengths
    all_p, all_o = clip_lengths(raw_p, raw_o, max_len=max_len, max_position=max_pos,
                                max_tokens=spec.max_tokens)
    prompt, out = all_p[sl], all_o[sl]
    n = len(out)
    warnings = []
    n_scaled = int(np.sum((scaled_p[sl] + scaled_o[sl]) < (raw_p[sl] + raw_o[sl])))
    clipped_prompts = int(np.sum(prompt < raw_p[sl]))
    clipped_outputs = int(np.sum(out < raw_o[sl]))
    if n_scaled:
        warnings.append(f"max_tokens {spec.max_tokens}: {n_scaled} of {n} requests' "
                        "prompt + output scaled down proportionally to fit (Vidur's rule)")
    ctx_p = int(np.sum(prompt < scaled_p[sl]))
    ctx_o = int(np.sum(out < scaled_o[sl]))
    if ctx_p:
        warnings.append(f"{ctx_p} of {n} prompts clipped to {max_pos - 1} tokens "
                        f"({dep.model.name}'s context {max_pos} less one output token)")
    if ctx_o:
        warnings.append(f"{ctx_o} of {n} outputs clipped to min(max_len {max_len}, "
                        f"context {max_pos} - prompt)")
    if n < 2:
        raise ValueError(f"trace {spec.trace}: slice [{spec.offset}, {end}) has {n} "
                         "request; a scenario needs at least 2 (--n-requests)")
    # a slice whose requests all arrive at once (a vllm bench serve run at its default
    # request_rate inf) has no time pattern to rescale: it is replayed as it is, and a
    # rate ladder (goodput) places its requests as a seeded Poisson process instead
    pattern = None
    own = None if trace.arrival_s is None else trace.arrival_s[sl] - trace.arrival_s[sl].min()
    at_once = own is not None and float(np.max(own)) <= 0.0
    if at_once and spec.rate is not None:
        arr = arrivals.poisson(n, spec.rate, spec.seed)
        warnings.append(f"trace {spec.trace}: all {n} requests of the slice arrive at "
                        f"t = 0 (no time pattern to rescale): --rate {spec.rate:g} draws "
                        "them as a Poisson process at that rate (seeded)")
    elif at_once:
        arr = own
        pattern = arrivals.poisson(n, 1.0, spec.seed)
        warnings.append(f"trace {spec.trace}: all {n} requests of the slice arrive at "
                        "t = 0 (all at once, e.g. vllm bench serve at request_rate inf) "
                        "and are replayed so; with no time pattern to rescale, a rate "
                        "ladder (goodput) places them as a Poisson process (seeded) at "
                        "each of its rates; pass --rate to replay Poisson arrivals at "
                        "one rate")
    elif own is not None:
        arr = arrivals.replay(own, spec.rate)
    else:
        arr = arrivals.poisson(n, spec.rate or DEFAULT_RATE, spec.seed)
        warnings.append(f"trace {spec.trace} has no arrival times: arrivals are drawn "
                        f"as a Poisson process at {spec.rate or DEFAULT_RATE:g} req/s "
                        "(seeded); pass --rate to choose the rate")
    pred, u, source, notes = _predictions(trace, out, all_o[:spec.offset], spec, sl)
    warnings.extend(notes)
    sliced = Trace(arrival_s=arr, prompt_tokens=prompt, output_tokens=out,
                   source=trace.source, format=trace.format)
    wl = to_workload(sliced, pred_tokens=pred, pred_u=u)
    capacity = (dep.kv_capacity_tokens if spec.capacity_tokens is None
                else spec.capacity_tokens)
    roof = hardware.roofline_params(dep)._replace(**calibrated)
    slo = _slos(spec, roof, all_p, all_o)
    cfg = ServerConfig(
        capacity_tokens=jnp.float32(capacity), max_batch=jnp.int32(spec.max_batch),
        max_prefill=jnp.float32(spec.max_prefill), ttft_slo_s=jnp.float32(slo["ttft_s"]),
        tpot_slo_s=jnp.float32(slo["tpot_s"]), token_scale=jnp.float32(32.0),
        kv_bytes_per_token=jnp.float32(dep.kv_bytes_per_token_per_device),
        watermark_tokens=jnp.float32(np.floor(spec.watermark * capacity)),
        n_slots=spec.n_slots, admit_window=spec.admit_window, max_len=max_len,
        chunked=spec.scheduler == "chunked")
    history = all_o[:spec.offset].astype(np.int32)
    stats = summary(sliced)
    span = float(np.max(arr))
    stats["rate_rps"] = (n - 1) / span if span > 0 else float("inf")  # all at once
    digest = hashlib.sha256()
    for a in (arr, prompt, out, pred, u):
        digest.update(np.ascontiguousarray(np.asarray(a, np.float64)).tobytes())
    digest.update(json.dumps(_fingerprint_spec(spec), sort_keys=True).encode())
    if calibrated:  # a profile file: its values, not its path, define the scenario
        digest.update(json.dumps(calibrated, sort_keys=True).encode())
    if _is_device_file(spec.hardware):  # and a device file's
        digest.update(repr(dep.device).encode())
    if dep.model.config_path:  # likewise a model read from its config.json
        digest.update(repr((dep.model, dep.profile and dep.profile.quantization)).encode())
    return Scenario(spec=spec, workload=wl, cfg=cfg, hw=roof, deployment=dep,
                    history=history, prediction_source=source, summary=stats,
                    fingerprint=digest.hexdigest()[:16], clipped_outputs=clipped_outputs,
                    clipped_prompts=clipped_prompts, slo=slo, warnings=tuple(warnings),
                    pattern=pattern)


def _deployment(spec: ScenarioSpec, device: str) -> hardware.Deployment:
    """The deployment with vLLM's KV capacity for the spec's engine settings (the V0
    engine's memory profile under scheduler "v0", V1's under "chunked")."""
    chunked = spec.scheduler == "chunked"
    model, quantization = resolve_model(spec.model)
    max_model_len = spec.max_model_len
    if max_model_len is None:
        max_model_len = int(model.max_position)
        if not chunked:  # vLLM V0 without chunked prefill needs max_num_batched_tokens
            max_model_len = min(max_model_len, int(spec.max_prefill))  # >= max_model_len
    return hardware.make_deployment(
        device, model, tp=spec.tp, mem_util=spec.gpu_memory_utilization,
        max_batched_tokens=spec.max_prefill, max_num_seqs=spec.max_batch,
        engine="vllm-v1" if chunked else "vllm-v0",
        engine_args={"max_model_len": max_model_len, "block_size": spec.block_size,
                     "kv_cache_dtype": spec.kv_cache_dtype,
                     "quantization": quantization,
                     "enforce_eager": spec.enforce_eager,
                     "enable_chunked_prefill": chunked})


def resolve_model(name: str):
    """``(LLMSpec, weight quantization)`` of a ``--model`` value: a preset name or the
    Hugging Face id of one (no quantization), or a path to a Hugging Face
    ``config.json`` or its folder (:func:`tuner.scenario.model_config.model_from_config`:
    its shapes and the quantization its ``quantization_config`` names)."""
    from tuner.scenario.model_config import is_config_path, model_from_config

    if is_config_path(name):
        cm = model_from_config(name)
        return cm.spec, cm.quantization
    return hardware.get_model(name), None


def resolve_hardware(name: str) -> tuple[str, dict, str | None]:
    """A device preset name, a device profile file from ``tuner.calibrate`` (a ``.json``
    file with a ``format`` field), or a device file (:func:`hardware.load_devices`: one
    device's numbers in a ``.json`` or ``.toml`` file, registered under its ``name``):
    the device name, the calibrated roofline fields ({} for a preset or a device file)
    and the model the profile was calibrated on (None for a preset, a device file or a
    profile that does not record one)."""
    if _is_device_file(name):
        devices = hardware.load_devices(name)
        if len(devices) != 1:
            raise ValueError(f"{name}: a --hardware device file holds one device, found "
                             f"{len(devices)}")
        return devices[0].name, {}, None
    if str(name).endswith(".json"):
        from hardware.profile import load_profile, profile_values

        prof = load_profile(name)
        return prof["device"], profile_values(prof), _model_of(prof)
    return name, {}, None


def _is_device_file(name) -> bool:
    """A ``.toml`` file, or a ``.json`` file whose top level is not a device profile
    (no ``format`` field); unreadable files go to the profile reader's error."""
    n = str(name)
    if n.endswith(".toml"):
        return True
    if not n.endswith(".json"):
        return False
    try:  # read once per version of the file: a command builds many scenarios
        st = Path(n).stat()
        key = (n, st.st_size, st.st_mtime_ns)
        if key not in _DEVICE_FILE:
            d = json.loads(Path(n).read_text())
            _DEVICE_FILE[key] = not (isinstance(d, dict) and "format" in d)
    except (OSError, ValueError):
        return False
    return _DEVICE_FILE[key]


_DEVICE_FILE: dict = {}  # (path, size, mtime) -> whether it is a device file


def _model_of(prof: dict) -> str | None:
    m = prof.get("model")
    return m if isinstance(m, str) and m else None


def profile_model(hardware_name: str) -> str | None:
    """The model a device profile file was calibrated on (its ``model`` field), or None
    for a preset name or a profile that does not record one."""
    if not str(hardware_name).endswith(".json") or _is_device_file(hardware_name):
        return None
    from hardware.profile import load_profile

    return _model_of(load_profile(hardware_name))


def check_profile_model(spec: ScenarioSpec, pm: str | None = None) -> None:
    """A profile's efficiencies are fitted to one model's step times: applying them to
    another model is refused (ValueError naming both), never done silently. ``pm``: the
    profile's model when the caller has loaded it already (else read from the file)."""
    if pm is None:
        pm = profile_model(spec.hardware)
    if pm is None:
        return
    try:
        same = hardware.get_model(pm).name == resolve_model(spec.model)[0].name
    except ValueError:
        same = False
    if not same:
        raise ValueError(f"hardware {spec.hardware}: this device profile was calibrated "
                         f"on model {pm!r}, not {spec.model!r}; give --model {pm} (or a "
                         "device preset, or a profile calibrated on that model)")


@jax.jit
def _uncontended(roof, prompt, output):
    """Mean uncontended TTFT and TPOT (s) of requests of these prompt and output
    lengths (one compiled program where eager operations would compile one each)."""
    ctx = prompt + output / 2.0
    big = jnp.float32(1e9)  # contiguous KV: one chunk
    return (jnp.mean(hardware.iteration_time(roof, prompt, 0.0, 0.0, big)),
            jnp.mean(hardware.iteration_time(roof, 0.0, 1.0, ctx, big)))


def _slos(spec: ScenarioSpec, roof, prompt, output) -> dict:
    """TTFT and TPOT SLOs in seconds: as given, or ``slo_scale`` times the mean
    uncontended latency over the whole trace (each request alone on the server: its
    prompt's prefill iteration for TTFT, one decode step at half its output for TPOT;
    the contiguous KV read of an idle server), as eLLM section 5 defines them."""
    if not (spec.slo_scale > 0 and np.isfinite(spec.slo_scale)):
        raise ValueError(f"slo_scale must be a finite number > 0, got {spec.slo_scale}")
    for name in ("ttft_slo_s", "tpot_slo_s"):
        v = getattr(spec, name)
        if v is not None and not (np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number of seconds > 0, got {v}")
    ttft0, tpot0 = (float(x) for x in _uncontended(
        roof, np.asarray(prompt, np.float32), np.asarray(output, np.float32)))
    derived = f"{spec.slo_scale:g}x the mean uncontended latency (eLLM section 5)"
    return {"ttft_s": spec.ttft_slo_s or spec.slo_scale * ttft0,
            "tpot_s": spec.tpot_slo_s or spec.slo_scale * tpot0,
            "uncontended_ttft_s": ttft0, "uncontended_tpot_s": tpot0,
            "ttft_source": "given" if spec.ttft_slo_s else derived,
            "tpot_source": "given" if spec.tpot_slo_s else derived}
