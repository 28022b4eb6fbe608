"""The vLLM memory profile (hardware/memory_profile.py) against real vLLM start-up logs.

``python -m experiments.memory_check --out DIR [--csv PATH]``

For every record of ``../shared/reference/vllm-memory-profiles.csv`` (13 start-up
logs quoted from public vLLM issues, pull requests and the llm-d capacity planner's
v0.19.0 sweep; read in place, never copied) and of ``experiments/data/vllm-memory-
profiles-extra.csv`` (records found for this project in the same columns: GPTQ / AWQ
checkpoints and devices the shared file lacks, ids ``x*``) it builds the profile under the record's
stated settings (a setting the record leaves unstated or "default" takes the version
line's default) and compares it with what vLLM printed: KV tokens (``GPU KV cache
size`` in V1, ``# GPU blocks`` x block size in V0), weights, activation peak,
non-torch memory, KV GiB, concurrency, and whether vLLM refused to start. The aim
(issue 17): KV tokens within 10% of every record of an implemented version line
(V1 0.8-0.19, V0 0.6.4-0.8); older records (0.2-0.4 era) are predicted with the V0
rules for reference only. A diagnostic column recomputes the blocks from the log's
own weights, activation and non-torch figures, which separates an error in those
components from one in the block arithmetic.

Writes ``DIR/memory_check.json`` and ``DIR/memory_check.md`` atomically. Exit 2 on
bad arguments or an unreadable CSV (nothing written).
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from pathlib import Path

from hardware import get_device, get_model, vllm_memory_profile
from hardware.memory_profile import GiB, VERSION_LINES
from tuner.common.atomic import plain, write_json_atomic, write_text_atomic
from experiments.results_io import stamp_markdown, stamped
from tuner.workloads.presets import traces_dir

__all__ = ["CSV_NAME", "TOLERANCE", "check_record", "main", "parse_record",
           "reference_path", "render", "version_line"]

CSV_NAME = "vllm-memory-profiles.csv"
TOLERANCE = 0.10  # the target for KV tokens
# Records whose number fed a preset: the driver-reported total memory of a device
# (hardware/_device_presets.py driver_memory_bytes). No other constant of the model
# comes from a CSV record (see hardware/memory_profile.py for each constant's log).
CALIBRATION = {
    "1": "driver total of a100-40gb (39.50 GiB) taken from this record",
    "10": "driver total of rtx-3090-24gb (23.58 GiB) taken from this record",
    "11": "driver total of rtx-3090-24gb (23.58 GiB) taken from this record",
    "16": "driver total of t4-16gb (14.74 GiB) taken from this record",
    **{r: "driver total of h100-80gb (79.19 GiB) also in these logs (and in the "
          "llm-d accuracy report)" for r in ("19", "20", "24", "26", "27", "32", "x1")},
    "x3": "driver total of v100-32gb (31.74 GiB) also in this log (the preset cites "
          "another V100 log with the same figure)",
}
# Context for records a number cannot explain by itself (keyed by record id).
CONTEXT = {
    "1": "The log's activation peak, 9.37 GiB, is 7x what vLLM's default profiling "
         "run gives for this model (1.26 GiB in the V0 log of the same model on H100, "
         "github.com/vllm-project/vllm/pull/10511) and than every other V0 record; "
         "max_num_batched_tokens, max_num_seqs and any LoRA / speculative settings are "
         "not stated in the issue, so the profiling batch that produced it cannot be "
         "rebuilt. With the log's own activation and non-torch figures the block "
         "arithmetic reproduces the reported blocks (diagnostic column).",
    "10": "vLLM ~0.6.4 counted the CUDA context in non_torch_memory (0.35 GiB here; "
          "0.6.5+ counts only the increase during profiling, 0.16 GiB in the model), "
          "so the prediction leaves ~0.19 GiB more for the KV cache.",
    "11": "As record 10 (0.6.4 non-torch rule). vLLM refused to start (KV < "
          "max_model_len) and so does the prediction.",
    "2": "vLLM of April 2024 (0.4.x): profiling by torch.cuda.max_memory_allocated "
         "before the 0.6.4 rework; outside the implemented lines, predicted with V0 "
         "rules for reference.",
    "3": "As record 2 (0.4.x). Mistral's 4096-token sliding window is not modelled.",
    "x2": "The log does not print the driver total: the L40S preset's is its "
          "datasheet's 48 GiB (nvidia-smi in the same repository shows 46,068 MiB a "
          "GPU, and the driver reports somewhat less than nvidia-smi: 79.19 against "
          "79.65 GiB on an H100), and the TP-2 non-torch constant was read off NVLink "
          "H100 logs (2.07 GiB); these two offset each other here. The weights (AWQ "
          "4-bit, group 128, Marlin) match the log to 0.01 GiB.",
    "8": "vLLM of December 2023 (pre-0.2.5, before PR #2031's peak-memory profiling); "
         "outside the implemented lines, predicted with V0 rules for reference "
         "(after the PR: 7351 blocks).",
}
_NUM = re.compile(r"[-+]?\d[\d,]*\.?\d*")
# a GPTQ / AWQ cell in our form (hardware.memory_profile.weight_quantization)
_INT_QUANT = re.compile(r"(gptq|awq)-\d+bit-g(-1|\d+)(-act)?")
# Records found for this project (GPTQ / AWQ checkpoints, devices the shared CSV does not
# cover), in the shared CSV's columns, each with its source and quoted log lines
EXTRA_CSV = Path(__file__).resolve().parent / "data" / "vllm-memory-profiles-extra.csv"


def reference_path() -> Path:
    """The CSV beside the traces: ``<traces dir>/../reference/``."""
    return traces_dir().parent / "reference" / CSV_NAME


def _number(cell: str | None):
    """The first number in a messy cell ("0.90 (default)", "23648 (from error line)",
    "14.9888 GB (load line)") or None for blank / "not stated" / "default ..."."""
    text = (cell or "").strip()
    if not text or text.lower().startswith(("not stated", "default", "n/a", "none")):
        return None
    m = _NUM.match(text)
    if m is None:
        return None
    v = float(m.group(0).replace(",", ""))
    return int(v) if v.is_integer() and "." not in m.group(0) else v


def version_line(cell: str) -> str:
    """``v1``, ``v0`` or ``outside (0.N)`` for the record's vllm_version cell: the
    engine named in the cell, else by version (V1 is the default engine from 0.8;
    0.6.x-0.7 are V0; the memory_profiling rules start at 0.6.4)."""
    text = cell or ""
    if "V1" in text:
        return "v1"
    if "V0" in text:
        return "v0"
    minors = [int(x) for x in re.findall(r"v?0\.(\d+)", text)]
    if not minors:
        return "outside (unknown)"
    if minors[0] >= 8:
        return "v1"
    if minors[0] >= 6:
        return "v0"
    return f"outside (0.{minors[0]})"


def _device_name(cell: str) -> str:
    c = cell.upper().replace(" ", "").replace("-", "")
    for key, name in (("H100", "h100-80gb"), ("A10040", "a100-40gb"),
                      ("A10080", "a100-80gb"), ("3090", "rtx-3090-24gb"),
                      ("A6000", "rtx-a6000-48gb"), ("T4", "t4-16gb"),
                      ("V100", "v100-32gb"), ("L40S", "l40s-48gb"), ("H200", "h200-141gb"),
                      ("4090", "rtx-4090-24gb"), ("B200", "b200-180gb"),
                      ("MI300X", "mi300x-192gb"), ("L4", "l4-24gb")):
        if key in c:
            return name
    raise ValueError(f"gpu {cell!r}: no device preset matches")


def _model_name(cell: str) -> str:
    name = cell.split("(")[0].strip()
    return get_model(name).name


def parse_record(row: dict) -> dict:
    """The vLLM settings a record states (None: vLLM's default) and what it reported."""
    line = version_line(row["vllm_version"])
    quant = (row.get("quantization") or "").strip().lower()
    quote = (row.get("log_quote") or "") + " " + (row.get("notes") or "")
    eager = (row.get("enforce_eager") or "").strip().lower() == "true"
    block = _number(row.get("block_size")) or 16
    settings = {
        "device": _device_name(row["gpu"]), "model": _model_name(row["model"]),
        "tp": _number(row.get("tp")) or 1, "pp": _number(row.get("pp")) or 1,
        "gpu_memory_utilization": _number(row.get("gpu_memory_utilization")) or 0.9,
        "max_model_len": _number(row.get("max_model_len")),
        "max_num_batched_tokens": _number(row.get("max_num_batched_tokens")),
        "max_num_seqs": _number(row.get("max_num_seqs")),
        "block_size": block,
        "kv_cache_dtype": "fp8" if "fp8" in (row.get("kv_cache_dtype") or "") else
        "auto",
        "quantization": "fp8" if quant.startswith("fp8") else (
            quant if _INT_QUANT.fullmatch(quant) else None),
        "enforce_eager": eager,
        "version": line if line in VERSION_LINES else "v0",
        "usage_context": "llm_class" if ("LLM(" in quote
                                         or "benchmark_throughput" in quote)
        else "openai_server",
    }
    blocks = _number(row.get("gpu_blocks"))
    tokens = _number(row.get("kv_cache_tokens"))
    weights = _number(row.get("weights_gib"))
    act = _number(row.get("activation_peak_gib"))
    peak = re.search(r"peak_torch_memory=([\d.]+)GiB", row.get("activation_peak_gib")
                     or "")
    if act is None and peak and weights is not None:  # V0 0.6.4: peak incl. weights
        act = float(peak.group(1)) - weights
    reported = {
        "kv_cache_tokens": tokens if tokens is not None else
        (None if blocks is None else blocks * block),
        "gpu_blocks": blocks, "weights_gib": weights, "activation_gib": act,
        "non_torch_gib": _number(row.get("non_torch_gib")),
        "kv_cache_gib": _number(row.get("kv_cache_gib")),
        "cuda_graph_gib": _number(row.get("cuda_graph_gib")),
        "max_concurrency": _number(row.get("max_concurrency")),
        "total_gpu_memory_gib": _number(row.get("total_gpu_memory_gib")),
        "refused": "refused to start" in (row.get("notes") or ""),
    }
    return {"id": row["id"].strip(), "version_line": line,
            "vllm_version": row["vllm_version"], "gpu": row["gpu"],
            "model_cell": row["model"], "source": row["source"],
            "confidence": row.get("confidence"), "settings": settings,
            "reported": reported}


def _rel(pred, rep):
    if pred is None or rep in (None, 0):
        return None
    return pred / rep - 1.0


def check_record(rec: dict) -> dict:
    """Profile the record's deployment and compare it with the log."""
    s, rep = rec["settings"], rec["reported"]
    prof = vllm_memory_profile(strict=False, **s)
    d = prof.as_dict()
    pred = {"kv_cache_tokens": prof.kv_cache_tokens,
            "gpu_blocks": prof.kv_cache_blocks, "weights_gib": prof.weights_gib,
            "activation_gib": prof.activation_gib, "non_torch_gib": prof.non_torch_gib,
            "kv_cache_gib": prof.kv_cache_gib, "cuda_graph_gib": prof.cuda_graph_gib,
            "max_concurrency": prof.max_concurrency,
            "total_gpu_memory_gib": prof.total_gib,
            "refused": prof.refusal is not None}
    errors = {k: _rel(pred[k], rep[k]) for k in pred if k != "refused"}
    # Diagnostic: the block arithmetic on the log's own components.
    from_log = None
    parts = (rep["weights_gib"], rep["activation_gib"], rep["non_torch_gib"])
    if all(p is not None for p in parts) and rep["total_gpu_memory_gib"]:
        avail = (rep["total_gpu_memory_gib"] * prof.gpu_memory_utilization
                 - sum(parts)) * GiB
        page = prof.kv_bytes_per_token * prof.block_size
        blocks = max(int(avail // page), 0)
        from_log = blocks * prof.block_size
    implemented = rec["version_line"] in VERSION_LINES
    err = errors["kv_cache_tokens"]
    return {**rec, "predicted": pred, "errors": errors,
            "kv_tokens_from_log_components": from_log,
            "kv_tokens_from_log_components_error": _rel(from_log,
                                                        rep["kv_cache_tokens"]),
            "resolved_settings": {k: d[k] for k in (
                "max_model_len", "max_num_batched_tokens", "max_num_seqs",
                "enable_chunked_prefill")},
            "implemented_line": implemented,
            "within_tolerance": None if err is None else bool(abs(err) <= TOLERANCE),
            "refusal": d["refusal"], "notes": d["notes"],
            "calibration": CALIBRATION.get(rec["id"]),
            "context": CONTEXT.get(rec["id"])}


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def _pct(v):
    return "-" if v is None else f"{100 * v:+.1f}%"


def render(res: dict) -> str:
    rows = res["records"]
    L = ["# vLLM memory profile vs real start-up logs", "",
         f"Reference: `../shared/reference/{CSV_NAME}` and "
         f"`experiments/data/{EXTRA_CSV.name}` (records `x*`: GPTQ / AWQ checkpoints "
         f"and devices the shared file lacks, with sources; {len(rows)} records). "
         "Prediction: `hardware/memory_profile.py` under each record's stated settings "
         "(unstated = the version line's default). Target: KV tokens within "
         f"{TOLERANCE:.0%} for every record of an implemented version line "
         f"({'; '.join(f'`{k}`: {v}' for k, v in VERSION_LINES.items())}).", "",
         f"Coverage: {sum(r['predicted']['kv_cache_tokens'] is not None for r in rows)} "
         f"of {len(rows)} records predicted (every model and device known, as a preset "
         "or from its config).", "",
         f"**{res['summary']['within']} of {res['summary']['implemented']} records of "
         f"the implemented lines are within {TOLERANCE:.0%}** (median |error| "
         f"{100 * res['summary']['median_abs_error']:.2f}%); outside: "
         f"{', '.join(res['summary']['outside_tolerance']) or 'none'}.", "",
         "## KV cache tokens", "",
         "| record | model | GPU | tp | vLLM | line | reported | predicted | error | "
         f"within {TOLERANCE:.0%} | from log's components | refused (log / model) |",
         "|---|---|---|--:|---|---|--:|--:|--:|:-:|--:|:-:|"]
    for r in rows:
        rep, pred = r["reported"], r["predicted"]
        within = "-" if r["within_tolerance"] is None else (
            "yes" if r["within_tolerance"] else "**no**")
        if not r["implemented_line"]:
            within = f"({within}; not counted)"
        fl = r["kv_tokens_from_log_components"]
        fl_err = _pct(r["kv_tokens_from_log_components_error"])
        L.append(
            f"| {r['id']} | {r['settings']['model']} | {r['settings']['device']} | "
            f"{r['settings']['tp']} | {r['vllm_version'].split('(')[0].strip()} | "
            f"{r['version_line']} | {_f(rep['kv_cache_tokens'], '{:,}')} | "
            f"{pred['kv_cache_tokens']:,} | {_pct(r['errors']['kv_cache_tokens'])} | "
            f"{within} | {_f(fl, '{:,}')} ({fl_err}) | "
            f"{'yes' if rep['refused'] else 'no'} / "
            f"{'yes' if pred['refused'] else 'no'} |")
    L += ["", "## Components (GiB; reported / predicted)", "",
          "| record | total | weights | activation | non-torch | KV cache | "
          "CUDA graphs | concurrency | max_num_batched_tokens / seqs used |",
          "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        rep, pred, rs = r["reported"], r["predicted"], r["resolved_settings"]

        def pair(k, fmt="{:.2f}"):
            return f"{_f(rep[k], fmt)} / {_f(pred[k], fmt)}"

        L.append(f"| {r['id']} | {pair('total_gpu_memory_gib')} | "
                 f"{pair('weights_gib')} | {pair('activation_gib')} | "
                 f"{pair('non_torch_gib')} | "
                 f"{pair('kv_cache_gib')} | {pair('cuda_graph_gib')} | "
                 f"{pair('max_concurrency')} | {rs['max_num_batched_tokens']:,} / "
                 f"{rs['max_num_seqs']:,} |")
    L += ["", "Weights, activation and non-torch memory are what vLLM subtracts from "
          "total x gpu_memory_utilization; the rest, rounded down to whole blocks, is "
          "the KV cache. CUDA graphs are captured after the KV cache is allocated and "
          "sit outside that budget in every implemented line (the v0.19 logs say "
          "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS was off), so their size (a single "
          "logged average per line, not a model of capture sizes) does not enter the "
          "KV prediction; record 16's 0.15 GiB for a 0.5B model shows how crude it is.",
          "", "## Records outside the target, and why", ""]
    for r in rows:
        err = r["errors"]["kv_cache_tokens"]
        if r["within_tolerance"] is False or not r["implemented_line"]:
            tag = ("outside the implemented lines" if not r["implemented_line"]
                   else f"{_pct(err)} on KV tokens")
            L.append(f"- **Record {r['id']}** ({r['settings']['model']}, "
                     f"{r['settings']['device']}, {r['version_line']}; {tag}): "
                     f"{r['context'] or 'no further context'}")
    L += ["", "## Records within the target with a note", ""]
    for r in rows:
        if r["within_tolerance"] and r["implemented_line"] and r["context"]:
            L.append(f"- Record {r['id']} ({_pct(r['errors']['kv_cache_tokens'])}): "
                     f"{r['context']}")
    L += ["", "## Which records supplied numbers", ""]
    L += [f"- Record {r['id']}: {r['calibration']}" for r in rows if r["calibration"]]
    L += ["- Every other constant (non-torch memory, the sampler's workspace and fp32 "
          "copies, CUDA graph sizes) comes from logs that are not records of this CSV; "
          "each is cited where it is defined, in `hardware/memory_profile.py`. The "
          "activation formula's forward term has no fitted constant; records 10/11 "
          "(V0, 20,000 / 29,000 tokens) test it.", ""]
    return "\n".join(L)


SGLANG_CSV = Path(__file__).resolve().parent / "data" / "sglang-memory-profiles.csv"


def _sglang_model(value: str):
    """(LLMSpec, weight quantization) of a record's model: a ``.json`` value is a
    ``config.json`` relative to the CSV's folder, anything else a preset name."""
    if value.endswith(".json"):
        from tuner.scenario.model_config import model_from_config

        cm = model_from_config(SGLANG_CSV.parent / value)
        return cm.spec, cm.quantization
    return get_model(value), None


def check_sglang(rows: list[dict]) -> dict:
    """Each SGLang start-up record: the pool from the log's own two free-memory readings
    (the arithmetic) and predicted from the device and model
    (``tuner.scenario.sglang_memory``). A record's model is a preset name or a
    ``config.json`` under ``experiments/data`` (``tuner.scenario.model_config``: its
    shapes and weight quantization); a record with no model is counted as not
    predicted."""
    from tuner.scenario.sglang_memory import sglang_kv_tokens, sglang_memory_profile

    out = []
    for r in rows:
        logged = int(r["logged_tokens"])
        rec = {"id": r["id"], "source": r["source"], "model": r["model"] or None,
               "device": r["device"], "tp": int(r["tp"]),
               "mem_fraction_static": float(r["mem_fraction_static"]),
               "logged_tokens": logged, "note": r["note"], "from_log": None,
               "predicted": None}
        if r["model"]:
            m, quant = _sglang_model(r["model"])
            tp, f = rec["tp"], rec["mem_fraction_static"]
            if r["free_before_weights_gib"]:
                n = sglang_kv_tokens(m, tp=tp, mem_fraction_static=f,
                                     total_gib=float(r["free_before_weights_gib"]),
                                     available_gib=float(r["free_after_weights_gib"]))
                rec["from_log"] = {"tokens": n, "error": _rel(n, logged)}
            n = sglang_memory_profile(r["device"], m, tp=tp, mem_fraction_static=f,
                                      quantization=quant).max_total_num_tokens
            err = _rel(n, logged)
            rec["predicted"] = {"tokens": n, "error": err,
                                "within": abs(err) <= TOLERANCE}
        out.append(rec)
    pred = [r for r in out if r["predicted"]]
    return {"csv": str(SGLANG_CSV.relative_to(SGLANG_CSV.parents[2])), "records": out,
            "predicted": len(pred), "total": len(out),
            "within": sum(r["predicted"]["within"] for r in pred)}


def _model_label(model: str | None) -> str:
    if not model:
        return "no model"
    return f"`{model}`" if model.endswith(".json") else model


def render_sglang(sg: dict) -> str:
    L = ["## SGLang's token pool vs start-up logs", "",
         f"Records: `{sg['csv']}` ({sg['total']}, each with its source). Prediction: "
         "`tuner/scenario/sglang_memory.py` from the device and the model; 'from the "
         "log': the same arithmetic on the log's own free-memory readings. **Coverage: "
         f"{sg['predicted']} of {sg['total']} records predicted, {sg['within']} within "
         f"{TOLERANCE:.0%}.** The context constant (memory not free before the weights) "
         "is read off the first record, so only the others check it; it is a TP-1 "
         "reading (what tensor-parallel communication takes before the weights is not "
         "modelled). A model given as a `.json` is its config.json's shapes and weight "
         "quantization (`tuner/scenario/model_config.py`).", "",
         "| record | model | device | tp | mem_fraction_static | logged tokens | from "
         "the log | predicted | error |", "|---|---|---|--:|--:|--:|--:|--:|--:|"]
    for r in sg["records"]:
        fl, pr = r["from_log"], r["predicted"]
        L.append(f"| {r['id']} | {_model_label(r['model'])} | {r['device']} | "
                 f"{r['tp']} | {r['mem_fraction_static']:g} | {r['logged_tokens']:,} | "
                 + (f"{fl['tokens']:,} ({_pct(fl['error'])})" if fl else "-") + " | "
                 + (f"{pr['tokens']:,} | {_pct(pr['error'])}" if pr
                    else "not predicted | -") + " |")
    return "\n".join(L + [""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.memory_check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="results directory")
    ap.add_argument("--csv", type=Path, default=None,
                    help=f"the reference CSV (default ../shared/reference/{CSV_NAME})")
    args = ap.parse_args(argv)
    path = args.csv or reference_path()
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            raise ValueError(f"{path}: no records")
        with open(EXTRA_CSV, newline="", encoding="utf-8") as f:
            rows += list(csv.DictReader(f))
        records = [check_record(parse_record(r)) for r in rows]
        with open(SGLANG_CSV, newline="", encoding="utf-8") as f:
            sglang = check_sglang(list(csv.DictReader(f)))
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    counted = [r for r in records if r["implemented_line"]
               and r["within_tolerance"] is not None]
    errs = sorted(abs(r["errors"]["kv_cache_tokens"]) for r in counted)
    summary = {
        "implemented": len(counted),
        "within": sum(r["within_tolerance"] for r in counted),
        "outside_tolerance": [r["id"] for r in counted if not r["within_tolerance"]],
        "not_counted": [r["id"] for r in records if not r["implemented_line"]],
        "median_abs_error": errs[len(errs) // 2] if errs else math.nan,
    }
    shown = (f"../shared/reference/{CSV_NAME}" if args.csv is None else str(path))
    devices = sorted({r["settings"]["device"] for r in records})
    res = plain({"csv": shown, "tolerance": TOLERANCE,
                 "version_lines": VERSION_LINES, "summary": summary,
                 "records": records, "sglang": sglang,
                 "driver_memory_sources": {
                     d: get_device(d).source("driver_memory_bytes") for d in devices}})
    args.out.mkdir(parents=True, exist_ok=True)
    res = stamped(res)
    write_json_atomic(args.out / "memory_check.json", res)
    write_text_atomic(args.out / "memory_check.md",
                      stamp_markdown(render(res) + "\n" + render_sglang(res["sglang"]),
                                     res["provenance"]))
    print(f"memory_check: {summary['within']} of {summary['implemented']} records "
          f"within {TOLERANCE:.0%}; wrote {args.out}/memory_check.json and .md",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
