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
    ttft_slo_s: float = 5.0
    tpot_slo_s: float = 0.15
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
    if trace.arrival_s is not None:
        arr = arrivals.replay(trace.arrival_s[sl] - trace.arrival_s[sl].min(), spec.rate)
    else:
        arr = arrivals.poisson(n, spec.rate or DEFAULT_RATE, spec.seed)
    pred, u, source = _predictions(trace, out, spec, sl)
    sliced = Trace(arrival_s=arr, prompt_tokens=prompt, output_tokens=out,
                   source=trace.source, format=trace.format)
    wl = to_workload(sliced, pred_tokens=pred, pred_u=u)
    capacity = spec.capacity_tokens or dep.kv_capacity_tokens
    cfg = ServerConfig(
        capacity_tokens=jnp.float32(capacity), max_batch=jnp.int32(spec.max_batch),
        max_prefill=jnp.float32(spec.max_prefill), ttft_slo_s=jnp.float32(spec.ttft_slo_s),
        tpot_slo_s=jnp.float32(spec.tpot_slo_s), token_scale=jnp.float32(32.0),
        kv_bytes_per_token=jnp.float32(dep.kv_bytes_per_token_per_device),
        n_slots=spec.n_slots, admit_window=spec.admit_window, max_len=max_len)
    history = np.minimum(trace.output_tokens[:spec.offset], max_len).astype(np.int32)
    stats = summary(sliced)
    digest = hashlib.sha256()
    for a in (arr, prompt, out, pred, u):
        digest.update(np.ascontiguousarray(np.asarray(a, np.float64)).tobytes())
    digest.update(json.dumps(spec.to_dict(), sort_keys=True).encode())
    return Scenario(spec=spec, workload=wl, cfg=cfg, hw=hardware.roofline_params(dep),
                    deployment=dep, history=history, prediction_source=source, summary=stats,
                    fingerprint=digest.hexdigest()[:16],
                    clipped_outputs=int(np.sum(trace.output_tokens[sl] > max_len)))
