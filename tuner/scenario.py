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
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import hardware
from models import Inputs, ServerConfig, SimOptions, Workload, make_inputs, make_options
from tuner.workloads import arrivals
from tuner.workloads.presets import resolve_trace
from tuner.workloads.traces import Trace, summary, to_workload

__all__ = ["ScenarioSpec", "Scenario", "build_scenario", "DEFAULT_RATE"]

DEFAULT_RATE = 5.0  # req/s for traces without timestamps (Azure conv. averages 5.53)
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
    max_len: int | None = None           # None: next power of two >= max output
    n_slots: int = 256
    max_batch: int = 256
    max_prefill: int = 8192
    admit_window: int = 32
    ttft_slo_s: float | None = None      # None: slo_scale x the uncontended TTFT
    tpot_slo_s: float | None = None      # None: slo_scale x the uncontended TPOT
    slo_scale: float = 25.0              # eLLM section 5 (after DistServe): 25x
    block: int = 16                      # iterations per scanned block
    # family options as (name, value) pairs, e.g. (("window", 10000),) for ODMA's window;
    # empty: the family's defaults
    options: tuple = ()
    predictor: str | None = None         # model file for traces with prompt text

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
    clipped_outputs: int
    slo: dict = dataclasses.field(default_factory=dict)  # ttft_s, tpot_s, source
    warnings: tuple = ()     # silent assumptions and overload, for the CLI to print

    @property
    def nominal_rps(self) -> float:
        """The slice's own mean arrival rate, ``(n - 1) / span`` req/s."""
        return float(self.summary["rate_rps"])

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
        wl = Workload(**{f: jnp.concatenate([getattr(wl, f), jnp.full(k, v, getattr(
            wl, f).dtype)]) for f, v in fill.items()})
        return dataclasses.replace(self, workload=wl)

    def at_rate(self, rate: float) -> "Scenario":
        """The same requests with the arrival pattern rescaled to mean ``rate`` req/s
        (``math.inf``: every request at once)."""
        from tuner.capacity import scale_workload

        factor = 0.0 if rate == float("inf") else self.nominal_rps / float(rate)
        return dataclasses.replace(self, workload=scale_workload(self.workload, factor))

    def options(self, system: str, record: bool = False) -> SimOptions:
        s = self.spec
        return make_options(system, block=s.block, record=record, **dict(s.options))

    def inputs(self, system: str) -> Inputs:
        """The simulator inputs of ``system`` (its family's own inputs included)."""
        return make_inputs(self.workload, self.cfg, self.options(system), self.history)


def _predictions(trace: Trace, out, spec: ScenarioSpec, sl: slice):
    from tuner.workloads.error_model import load_default_error_model

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
        texts = list(trace.prompt_text[sl])
        ds = list(trace.dataset[sl]) if trace.dataset is not None else None
        l_hat, u, _ = model.predict(texts, trace.prompt_tokens[sl], ds)
        return np.asarray(l_hat, np.float64), np.asarray(u, np.float64), "predictor"
    l_hat, u = load_default_error_model().sample(out, spec.seed)
    return l_hat, u, "error-model"


def build_scenario(spec: ScenarioSpec) -> Scenario:
    """Resolve the trace, slice it, draw predictions and build the simulator inputs."""
    if spec.n_slots < 16 or spec.admit_window < 1 or spec.max_batch < 1 or spec.block < 1:
        raise ValueError("n_slots must be >= 16, admit_window, max_batch and block >= 1")
    if spec.rate is not None and not spec.rate > 0:
        raise ValueError(f"rate must be > 0 req/s, got {spec.rate}")
    trace = resolve_trace(spec.trace, seed=spec.seed)
    n_total = len(trace.output_tokens)
    end = n_total if spec.n_requests is None else spec.offset + spec.n_requests
    if spec.offset < 0 or spec.offset >= n_total or end > n_total or end <= spec.offset:
        raise ValueError(f"trace {spec.trace}: slice [{spec.offset}, {end}) is outside its "
                         f"{n_total} requests")
    sl = slice(spec.offset, end)
    dep = hardware.make_deployment(spec.hardware, spec.model, tp=spec.tp)
    max_out = int(trace.output_tokens[sl].max())
    max_len = spec.max_len or int(min(max(256, 2 ** int(np.ceil(np.log2(max_out)))), 16384))
    if max_len > dep.model.max_position:
        raise ValueError(f"max_len {max_len} exceeds {dep.model.name}'s context "
                         f"{dep.model.max_position}")
    out = np.minimum(trace.output_tokens[sl], max_len)
    prompt = np.minimum(trace.prompt_tokens[sl], dep.model.max_position - max_len)
    n = len(out)
    warnings = []
    if trace.arrival_s is not None:
        arr = arrivals.replay(trace.arrival_s[sl] - trace.arrival_s[sl].min(), spec.rate)
    else:
        arr = arrivals.poisson(n, spec.rate or DEFAULT_RATE, spec.seed)
        warnings.append(f"trace {spec.trace} has no arrival times: arrivals are drawn "
                        f"as a Poisson process at {spec.rate or DEFAULT_RATE:g} req/s "
                        "(seeded); pass --rate to choose the rate")
    if n < 2 or float(np.max(arr)) <= 0.0:
        raise ValueError(f"trace {spec.trace}: slice [{spec.offset}, {end}) has "
                         f"{n} request(s) spanning no time; it has no arrival rate")
    pred, u, source = _predictions(trace, out, spec, sl)
    sliced = Trace(arrival_s=arr, prompt_tokens=prompt, output_tokens=out,
                   source=trace.source, format=trace.format)
    wl = to_workload(sliced, pred_tokens=pred, pred_u=u)
    capacity = spec.capacity_tokens or dep.kv_capacity_tokens
    roof = hardware.roofline_params(dep)
    slo = _slos(spec, roof, np.minimum(trace.prompt_tokens, dep.model.max_position - max_len),
                np.minimum(trace.output_tokens, max_len))
    cfg = ServerConfig(
        capacity_tokens=jnp.float32(capacity), max_batch=jnp.int32(spec.max_batch),
        max_prefill=jnp.float32(spec.max_prefill), ttft_slo_s=jnp.float32(slo["ttft_s"]),
        tpot_slo_s=jnp.float32(slo["tpot_s"]), token_scale=jnp.float32(32.0),
        kv_bytes_per_token=jnp.float32(dep.kv_bytes_per_token_per_device),
        watermark_tokens=jnp.float32(np.floor(0.01 * capacity)),
        n_slots=spec.n_slots, admit_window=spec.admit_window, max_len=max_len)
    history = np.minimum(trace.output_tokens[:spec.offset], max_len).astype(np.int32)
    stats = summary(sliced)
    stats["rate_rps"] = (n - 1) / float(np.max(arr))
    digest = hashlib.sha256()
    for a in (arr, prompt, out, pred, u):
        digest.update(np.ascontiguousarray(np.asarray(a, np.float64)).tobytes())
    digest.update(json.dumps(spec.to_dict(), sort_keys=True).encode())
    return Scenario(spec=spec, workload=wl, cfg=cfg, hw=roof,
                    deployment=dep, history=history, prediction_source=source, summary=stats,
                    fingerprint=digest.hexdigest()[:16],
                    clipped_outputs=int(np.sum(trace.output_tokens[sl] > max_len)),
                    slo=slo, warnings=tuple(warnings))


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
    p = jnp.asarray(prompt, jnp.float32)
    ctx = p + jnp.asarray(output, jnp.float32) / 2.0
    big = jnp.float32(1e9)  # contiguous KV: one chunk
    ttft0 = float(jnp.mean(hardware.iteration_time(roof, p, 0.0, 0.0, big)))
    tpot0 = float(jnp.mean(hardware.iteration_time(roof, 0.0, 1.0, ctx, big)))
    derived = f"{spec.slo_scale:g}x the mean uncontended latency (eLLM section 5)"
    return {"ttft_s": spec.ttft_slo_s or spec.slo_scale * ttft0,
            "tpot_s": spec.tpot_slo_s or spec.slo_scale * tpot0,
            "uncontended_ttft_s": ttft0, "uncontended_tpot_s": tpot0,
            "ttft_source": "given" if spec.ttft_slo_s else derived,
            "tpot_source": "given" if spec.tpot_slo_s else derived}
