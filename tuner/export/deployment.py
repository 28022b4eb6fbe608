"""What an exported policy means on a real server, without this package's source.

:func:`describe` turns a scenario, a system and its parameters (human units, as in the
policy JSON) into a JSON-ready dict: the parameters with units, meaning and paper
default; the values the system derives from them on this workload (its family's
``deployment``: e.g. ODMA's bucket bounds in tokens and pool sizes in tokens and bytes);
the server the simulation assumed; the equivalent vLLM engine arguments; where the
length predictions came from; and how to close the loop (:func:`measure`): the
``vllm serve`` and ``vllm bench serve`` commands that measure the paged baseline on the
scenario's own requests (written beside the policy by :func:`write_measure_kit`, see
:mod:`tuner.bench_dataset`), how close the dataset's lengths come to the simulated ones,
and the ``python -m tuner.calibrate`` command that fits the step-time model to the
result. ``python -m tuner.explain POLICY.json`` prints it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import hardware
from models import deployment_values, get_system, validate_params
from tuner.export import bench_dataset as bd
from tuner.common.atomic import plain
from tuner.scenario import PREDICTOR_CACHE, Scenario

__all__ = ["FORMAT", "describe", "engine_scenario", "measure", "vllm_args",
           "write_measure_kit"]

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
    profile = getattr(dep, "profile", None)  # the vLLM memory profile of the capacity
    args = {"--model": bd.hf_model_id(dep.model), "--tensor-parallel-size": int(dep.tp)}
    if dep.pp > 1:
        args["--pipeline-parallel-size"] = int(dep.pp)
    args.update({"--block-size": int(block_size),
                 "--gpu-memory-utilization": float(dep.mem_util),
                 "--max-num-seqs": max_batch, "--max-num-batched-tokens": max_prefill,
                 "--max-model-len": max_model_len})
    chunked = bool(cfg.chunked)
    cap_p = getattr(cfg, "prefill_cap", None)
    if chunked and cap_p is not None and int(float(cap_p)) < max_prefill:
        # vLLM V1's per-request cap on a step's prefill tokens (at or above the budget
        # it never binds: the flag is left at vLLM's default, 0)
        args["--long-prefill-token-threshold"] = int(float(cap_p))
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
    if profile is not None:  # the scenario's capacity is vLLM's at these batch limits
        profiled = int(dep.kv_capacity_tokens)  # (max_model_len does not change it)
    else:
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


def _stem(policy_path) -> str:
    return Path(policy_path).stem if policy_path is not None else "policy"


def measure(sc: Scenario, policy_path=None, *, host: str = "127.0.0.1",
            port: int = 8000) -> dict:
    """How to measure the paged baseline on a real vLLM server with the scenario's own
    requests and feed the result back into ``tuner.calibrate``: the ``vllm serve`` and
    ``vllm bench serve`` commands, the dataset file they expect beside the policy
    (``<stem>.dataset.jsonl``, written by :func:`write_measure_kit`), the length
    comparison of that file with the simulated requests, the arrivals the client draws,
    the calibration command, and the other formats (exact arrival replay on vLLM
    >= 0.23, any vLLM's BurstGPT CSV). File names are relative to the policy's folder:
    run the commands there. ``policy_path`` names the files (default stem ``policy``)."""
    stem = _stem(policy_path)
    v, spec, dep = vllm_args(sc), sc.spec, sc.deployment
    req = bd.requests(sc)
    n = len(req.prompt_tokens)
    model = v["args"]["--model"]
    bos = bd.bos_tokens(model)
    result = f"{stem}.result.json"
    arr = bd.burstiness(req.arrival_s)
    span = float(req.arrival_s[-1])  # the scenario's own rate, (n - 1) / span
    rate = (n - 1) / span if n > 1 and span > 0 else float(sc.nominal_rps)

    def bench(fmt):
        return bd.bench_command(fmt, model=model,
                                dataset_path=stem + bd.FORMATS[fmt].suffix,
                                num_prompts=n, request_rate=rate,
                                burstiness=arr["burstiness"], seed=int(spec.seed),
                                result_path=result, host=host, port=port)

    chunked = bool(sc.cfg.chunked)
    serve = (("" if chunked else "VLLM_USE_V1=0 ") + v["command"]
             + f" --port {int(port)}")
    dataset_prompt = bd.content_tokens(req.prompt_tokens, bos) + bos
    lengths = bd.compare_lengths(req.prompt_tokens, req.output_tokens, dataset_prompt,
                                 req.output_tokens)
    max_model_len = int(v["args"]["--max-model-len"])
    lengths.update({
        "bos_tokens": bos,
        "over_max_model_len": int(np.sum(dataset_prompt + req.output_tokens
                                         > max_model_len)),
        "assumption": "dataset prompt tokens = the file's words + the BOS the server's "
                      "tokenizer adds, each word one token (so for the 145 words in "
                      "tuner.bench_dataset.WORDS with the cl100k_base vocabulary "
                      "Llama-3 extends and Qwen's; assumed for Llama-2's and OPT's)",
        "note": "prompts: 0 tokens off per request where that holds (a prompt of "
                "fewer tokens than the BOS + 1 gets one word), 1 off where the BOS "
                "rule is wrong for the model; no chat template (--skip-chat-template). "
                "The result file's input_lens are the client's own count with the "
                "model's tokenizer (BOS included), so the calibration sees the true "
                "prompt lengths either way. Outputs: exact, the server generates "
                "max_tokens = output_tokens with --ignore-eos. Percentiles: NumPy's "
                "linear ones over the requests"})
    calibrate = shlex.join([
        "python", "-m", "tuner.calibrate", "--measured", result,
        "--hardware", str(spec.hardware), "--model", str(spec.model),
        "--tp", str(int(dep.tp)), "--slots", str(int(spec.n_slots)),
        "--max-batch", str(int(spec.max_batch)),
        "--max-prefill", str(int(spec.max_prefill)), "--scheduler", str(spec.scheduler),
        "--out", "profile.json"])
    notes = [
        "run the commands in the policy's folder: the dataset and result files are "
        "named relative to it; the client (any machine with vLLM installed, possibly "
        "a newer vLLM than the server's: it only speaks HTTP) loads the model's "
        "tokenizer by --model",
        "the dataset's prompts are random common words, different from their first "
        "KV block on, so vLLM's prefix caching (on by default in V1) finds nothing to "
        "share; the simulation models no prefix caching either",
        f"arrivals: the client draws gamma gaps at {rate:.6g} req/s (the scenario's "
        f"rate) with burstiness {arr['burstiness']:g}, which matches the scenario's "
        f"inter-arrival CV {arr['interarrival_cv']:g} (1.0 would be Poisson); upstream "
        "vllm bench serve replays given timestamps only for its timed_trace dataset "
        "(vLLM >= 0.23): see alternatives",
    ]
    if chunked:
        notes.append("scheduler chunked: a vLLM V1 server (the default from vLLM 0.8, "
                     "the only engine from 0.11) always runs chunked prefill")
    else:
        notes.append("scheduler v0: vLLM V0's default scheduler exists only on a V0 "
                     "engine (VLLM_USE_V1=0, vLLM <= 0.10); a V1 server (the "
                     "default from vLLM 0.8, the only engine from 0.11) always uses "
                     "chunked prefill, so measuring there means simulating --scheduler "
                     "chunked (and calibrating with it)")
    return {
        "applies_to": "the paged baseline (vLLM) on this device and model, measured "
                      "with the scenario's own requests to calibrate the step-time "
                      "model",
        "serve": serve,
        "bench": bench("custom"),
        "dataset": {"format": "custom", "file": stem + bd.FORMATS["custom"].suffix,
                    "requests": n, "requires": bd.FORMATS["custom"].requires,
                    "written_by": "tuner.export.deployment.write_measure_kit, or python -m "
                                  "tuner.bench_dataset POLICY.json"},
        "result_file": result,
        "calibrate": calibrate,
        "lengths": lengths,
        "arrivals": {"request_rate_rps": rate, **arr, "replayed": False},
        "alternatives": {fmt: {"file": stem + f.suffix, "bench": bench(fmt),
                               "requires": f.requires,
                               "arrivals": "replayed from the file's timestamps"
                               if f.arrivals == "replayed" else "drawn by the client"}
                         for fmt, f in bd.FORMATS.items() if fmt != "custom"},
        "server_notes": v["notes"],
        "notes": notes,
    }


def write_measure_kit(sc: Scenario, policy_path,
                      formats=tuple(bd.FORMATS)) -> dict:
    """Write the dataset files of :func:`measure` beside ``policy_path``
    (``<stem>.dataset.jsonl``, ``<stem>.trace.jsonl``, ``<stem>.burstgpt.csv`` for the
    default ``formats``), each atomically; ``{format: path}``. All or nothing: when
    one fails, those already written are removed before the error is raised."""
    policy_path = Path(policy_path)
    stem = _stem(policy_path)
    done: dict = {}
    try:
        for fmt in formats:
            done[fmt] = bd.write_dataset(
                sc, policy_path.with_name(stem + bd.FORMATS[fmt].suffix), fmt)
    except BaseException:
        for path in done.values():
            Path(path).unlink(missing_ok=True)
        raise
    return done


def engine_scenario(sc: Scenario, params: dict) -> Scenario:
    """The scenario as the engine system (``vllm-v1``) with ``params`` configures it:
    the deployment and server config vLLM's memory profile gives at those engine
    arguments (host side, float64), so the exported ``vllm serve`` arguments and KV
    capacity are the tuned ones. Raises :class:`hardware.VllmRefusal` naming vLLM's
    reason where it would not start."""
    import dataclasses

    prof = sc.deployment.profile
    seqs = int(params["max_num_seqs"])
    tokens = int(params["max_num_batched_tokens"])
    util = float(f"{float(params['gpu_memory_utilization']):.7g}")  # float32's digits
    block = int(params.get("block_size", prof.block_size))
    dep = hardware.make_deployment(
        prof.device, prof.model, tp=prof.tp, pp=prof.pp, mem_util=util,
        n_devices=sc.deployment.n_devices, max_batched_tokens=tokens, max_num_seqs=seqs,
        engine="vllm-v1",
        engine_args={"max_model_len": prof.max_model_len, "block_size": block,
                      "kv_cache_dtype": prof.kv_cache_dtype,
                      "quantization": prof.quantization,
                      "enforce_eager": prof.enforce_eager, "enable_chunked_prefill": True})
    cap = float(dep.kv_capacity_tokens)
    watermark = float(getattr(sc.spec, "watermark", 0.01))
    thr = params.get("long_prefill_token_threshold")
    cfg = sc.cfg.replace(capacity_tokens=jnp.float32(cap), max_batch=jnp.int32(seqs),
                         max_prefill=jnp.float32(tokens),
                         watermark_tokens=jnp.float32(np.floor(watermark * cap)),
                         prefill_cap=None if thr is None else jnp.float32(int(thr)))
    # the spec the measurement kit's commands repeat (its slot table holds max_num_seqs)
    spec = dataclasses.replace(sc.spec, max_batch=seqs, max_prefill=tokens,
                               gpu_memory_utilization=util, block_size=block,
                               n_slots=max(int(sc.spec.n_slots), seqs))
    return dataclasses.replace(sc, spec=spec, deployment=dep, cfg=cfg)


def describe(sc: Scenario, system: str, params: dict, *, policy_path=None) -> dict:
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
         "predictor": {"source", "path", "note"},
         "measure": {...}}    # measure(sc, policy_path): the loop back to calibrate

    ``policy_path``: the policy file the description goes into, naming the dataset
    and result files of ``measure`` (:func:`write_measure_kit` writes the datasets).
    """
    spec = get_system(system)
    max_len = sc.cfg.max_len
    p = validate_params(spec, dict(params or {}), max_len, sc.hw, sc.deployment)
    defaults = spec.default_params(max_len, sc.hw, sc.deployment)
    sc_run = sc
    if spec.refusal is not None:  # an engine system: the server its arguments configure
        why = spec.refusal(sc.deployment, {k: float(v) for k, v in p.items()})
        if why is not None:
            raise ValueError(f"{system}: vLLM would refuse to start with these engine "
                             f"arguments ({why[1]})")
        sc = engine_scenario(sc, {k: float(v) for k, v in p.items()})
    dep, cfg = sc.deployment, sc.cfg
    vllm = vllm_args(sc, int(p["block_size"]) if "block_size" in p else VLLM_BLOCK_SIZE)
    if spec.refusal is not None:
        vllm["applies_to"] = f"the tuned {system} engine arguments"
        seqs = int(vllm["args"]["--max-num-seqs"])
        if seqs > int(sc_run.cfg.n_slots):
            vllm["notes"].append(
                f"--max-num-seqs {seqs} exceeds the simulated slot table "
                f"({int(sc_run.cfg.n_slots)}): the simulation ran at most that many "
                "requests at once; simulate with --slots >= it to model the rest")
    parameters = [{"name": ps.name, "value": _num(p[ps.name]), "unit": ps.unit,
                   "meaning": ps.doc, "paper_default": _num(defaults[ps.name])}
                  for ps in spec.params]
    derived = deployment_values(sc_run.inputs(system),
                                {k: jnp.asarray(v) for k, v in p.items()},
                                sc_run.options(system))
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
    source = sc.prediction_source
    path = None
    if source == "predictor":
        path = str(sc.spec.predictor or PREDICTOR_CACHE)
    predictor = {"source": source, "path": path,
                 "note": _PREDICTOR_NOTES.get(source, "length predictions: " + source)}
    return plain({"format": FORMAT, "system": system, "parameters": parameters,
                  "derived": derived, "server": server, "vllm": vllm,
                  "predictor": predictor, "measure": measure(sc, policy_path)})
