"""What an exported policy means on a real server, without this package's source.

:func:`describe` turns a scenario, a system and its parameters (human units, as in the
policy JSON) into a JSON-ready dict: the parameters with units, meaning and paper
default; the values the system derives from them on this workload (its family's
``deployment``: e.g. ODMA's bucket bounds in tokens and pool sizes in tokens and bytes);
the server the simulation assumed; the equivalent vLLM engine arguments; and where the
length predictions came from. ``python -m tuner.explain POLICY.json`` prints it.
"""

from __future__ import annotations

import re
import shlex

import jax.numpy as jnp
import numpy as np

import hardware
from models import deployment_values, get_system, validate_params
from tuner.atomic import plain
from tuner.scenario import PREDICTOR_CACHE, Scenario

__all__ = ["FORMAT", "describe", "vllm_args"]

FORMAT = "kvtune.deployment/1"
GIB = 2.0 ** 30
VLLM_BLOCK_SIZE = 16  # vLLM's default --block-size

_PREDICTOR_NOTES = {
    "predictor": "per request a predicted output length L_hat (tokens) and an "
                 "uncertainty u in [0, 1] (normalised entropy of the length-class "
                 "distribution) from the flax predictor on the prompt text",
    "error-model": "the trace has no prompt text: L_hat and u were drawn from the "
                   "calibrated prediction-error model around the realised lengths; "
                   "deploy with a predictor of similar error",
}


def _num(x):
    """A float32 value (scalar or array) as plain ints/floats without float32 noise."""
    v = np.asarray(x, np.float64)
    if v.ndim:
        return [_num(e) for e in v]
    f = float(v)
    return int(f) if f.is_integer() and abs(f) < 2 ** 53 else float(f"{f:.7g}")


def _hf_id(model) -> str:
    """The Hugging Face repository a model preset's numbers come from (its sources
    name ``huggingface.co/ORG/NAME``), else the preset name."""
    for _, text in getattr(model, "sources", ()):
        m = re.search(r"huggingface\.co/([\w.-]+/[\w.-]+)", text)
        if m:
            return m.group(1)
    return model.name


def vllm_args(sc: Scenario, block_size: int = VLLM_BLOCK_SIZE) -> dict:
    """vLLM engine arguments of a paged deployment of the scenario's model and device.

    Flag names from vLLM's engine-argument reference ("Engine Arguments",
    https://docs.vllm.ai/en/latest/models/engine_args.html; also in the v0.8 pages under
    serving/engine_args.html): ``--tensor-parallel-size``, ``--pipeline-parallel-size``,
    ``--block-size`` (16 by default), ``--gpu-memory-utilization``, ``--max-num-seqs``,
    ``--max-num-batched-tokens``, ``--max-model-len``, ``--enable-chunked-prefill``;
    ``vllm serve MODEL`` takes the model as its first argument.

    ``--max-num-seqs`` and ``--max-num-batched-tokens`` are the scenario's ``max_batch``
    and ``max_prefill``. The scheduler ``chunked`` adds ``--enable-chunked-prefill``; the
    default ``v0`` is vLLM V0's default scheduler, chunked prefill disabled, which vLLM
    V1 no longer offers (its scheduler always mixes decodes and prefill chunks): the
    notes say so. vLLM V0's block manager keeps 1% of the blocks free at admission (the
    scenario's default ``watermark``) and has no engine argument for it: a note says
    when the scenario assumed another share.
    """
    dep, cfg = sc.deployment, sc.cfg
    cap = int(float(cfg.capacity_tokens))
    max_batch, max_prefill = int(cfg.max_batch), int(float(cfg.max_prefill))
    # --max-model-len (prompt + output tokens of one request): build_scenario clips each
    # request to prompt + output <= max_position (tuner.scenario.clip_lengths), so the
    # longest request it simulates fits the model's context. Capped at the KV pool in
    # whole blocks: vLLM refuses to start when one request of max-model-len does not fit
    # in its KV cache.
    max_model_len = min(int(dep.model.max_position), cap // block_size * block_size)
    args = {"--model": _hf_id(dep.model), "--tensor-parallel-size": int(dep.tp)}
    if dep.pp > 1:
        args["--pipeline-parallel-size"] = int(dep.pp)
    args.update({"--block-size": int(block_size),
                 "--gpu-memory-utilization": float(dep.mem_util),
                 "--max-num-seqs": max_batch, "--max-num-batched-tokens": max_prefill,
                 "--max-model-len": max_model_len})
    chunked = bool(cfg.chunked)
    if chunked:
        args["--enable-chunked-prefill"] = True  # a switch: no value on the command line
    cmd = ["vllm", "serve", args["--model"]]
    for k, v in args.items():
        if k == "--model":
            continue
        cmd += [k] if v is True else [k, str(v)]
    if chunked:
        notes = ["scheduler chunked: chunked prefill, vLLM V1's scheduler (decodes and "
                 "prompt chunks share each step's --max-num-batched-tokens); a vLLM V0 "
                 "engine needs --enable-chunked-prefill for it"]
    else:
        notes = ["scheduler v0: vLLM V0's default scheduler, chunked prefill disabled "
                 "(prefill-only iterations, whole prompts within "
                 "--max-num-batched-tokens); vLLM V1 no longer offers it (its scheduler "
                 "always mixes decodes and prefill chunks), so these arguments mean the "
                 "simulated server on a vLLM V0 engine (VLLM_USE_V1=0, where vLLM still "
                 "has it); simulate --scheduler chunked for vLLM V1"]
        if max_prefill < max_model_len:
            notes.append("--max-num-batched-tokens below --max-model-len: vLLM V0 "
                         "refuses to start without chunked prefill; raise --max-prefill "
                         "or simulate --scheduler chunked")
    watermark = float(getattr(sc.spec, "watermark", 0.01))
    if watermark != 0.01:
        notes.append(f"the simulation keeps {watermark:g} of the KV capacity free at "
                     "admission; vLLM V0's block manager keeps 0.01 (1% of the blocks) "
                     "and has no engine argument for it")
    try:  # vLLM sizes its activation reserve by profiling at these batch limits
        profiled = hardware.make_deployment(
            dep.device, dep.model, tp=dep.tp, pp=dep.pp, mem_util=dep.mem_util,
            max_batched_tokens=max_prefill, max_num_seqs=max_batch).kv_capacity_tokens
    except ValueError:
        profiled = None
    if profiled is not None and profiled != cap:
        notes.append(f"KV capacity at these limits is about {profiled} tokens (the "
                     f"simulation assumed {cap})")
    return {"applies_to": "the paged baseline, or any vLLM deployment of this model on "
                          "this device",
            # per request: sampling max_tokens = max_len (outputs were capped there)
            "args": args, "command": shlex.join(cmd), "request_max_tokens": cfg.max_len,
            "kv_capacity_tokens_at_these_args": profiled, "notes": notes}


def describe(sc: Scenario, system: str, params: dict) -> dict:
    """A JSON-ready description of ``system`` with ``params`` (human units, missing
    ones at their defaults) deployed as the scenario simulates it::

        {"format": "kvtune.deployment/1", "system": str,
         "parameters": [{"name", "value", "unit", "meaning", "paper_default"}, ...],
         "derived": {...},    # models.deployment_values: the family's own values
         "server": {"device", "model", "tp", "pp", "n_devices", "gpu_memory_utilization",
                    "weight_bytes_per_device", "activation_bytes_per_device",
                    "kv_capacity_tokens", "kv_capacity_source",
                    "kv_bytes_per_token_per_device", "kv_capacity_gib_per_device",
                    "kv_capacity_gib_per_replica", "max_len", "max_batch",
                    "max_prefill_tokens_per_iteration", "n_slots", "max_position"},
         "vllm": {"applies_to", "args": {"--model", "--tensor-parallel-size", ...},
                  "command", "request_max_tokens",
                  "kv_capacity_tokens_at_these_args", "notes"},
         "predictor": {"source", "path", "note"}}
    """
    spec = get_system(system)
    max_len, dep, cfg = sc.cfg.max_len, sc.deployment, sc.cfg
    p = validate_params(spec, dict(params or {}), max_len, sc.hw)
    defaults = spec.default_params(max_len, sc.hw)
    parameters = [{"name": ps.name, "value": _num(p[ps.name]), "unit": ps.unit,
                   "meaning": ps.doc, "paper_default": _num(defaults[ps.name])}
                  for ps in spec.params]
    derived = deployment_values(sc.inputs(system), {k: jnp.asarray(v) for k, v in p.items()},
                                sc.options(system))
    cap = int(float(cfg.capacity_tokens))
    kv_bytes = float(cfg.kv_bytes_per_token)
    per_device = cap * kv_bytes
    server = {
        "device": dep.device.name, "model": dep.model.name, "tp": int(dep.tp),
        "pp": int(dep.pp), "n_devices": int(dep.n_devices),
        "gpu_memory_utilization": float(dep.mem_util),
        "weight_bytes_per_device": _num(dep.weight_bytes_per_device),
        "activation_bytes_per_device": _num(dep.activation_bytes_per_device),
        "kv_capacity_tokens": cap,
        "kv_capacity_source": "override" if sc.spec.capacity_tokens else "deployment",
        "kv_bytes_per_token_per_device": _num(kv_bytes),
        "kv_capacity_gib_per_device": round(per_device / GIB, 3),
        "kv_capacity_gib_per_replica": round(per_device * dep.tp * dep.pp / GIB, 3),
        "max_len": int(max_len), "max_batch": int(cfg.max_batch),
        "max_prefill_tokens_per_iteration": int(float(cfg.max_prefill)),
        "n_slots": int(cfg.n_slots), "max_position": int(dep.model.max_position),
    }
    block = int(p["block_size"]) if "block_size" in p else VLLM_BLOCK_SIZE
    source = sc.prediction_source
    path = None
    if source == "predictor":
        path = str(sc.spec.predictor or PREDICTOR_CACHE)
    predictor = {"source": source, "path": path,
                 "note": _PREDICTOR_NOTES.get(source, "length predictions: " + source)}
    return plain({"format": FORMAT, "system": system, "parameters": parameters,
                  "derived": derived, "server": server, "vllm": vllm_args(sc, block),
                  "predictor": predictor})
