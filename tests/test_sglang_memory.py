"""tuner.scenario.sglang_memory: SGLang's token-pool arithmetic against the start-up logs recorded
in experiments/data/sglang-memory-profiles.csv, its predictions, and the CLI."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hardware import get_model
from tuner.scenario.sglang_memory import (default_mem_fraction_static, sglang_kv_tokens,
                                 sglang_memory_profile)

RECORDS = Path(__file__).resolve().parents[1] / "experiments" / "data" / \
    "sglang-memory-profiles.csv"


def _records():
    with RECORDS.open() as f:
        return list(csv.DictReader(f))


def test_every_record_names_its_source_and_logged_tokens():
    rows = _records()
    assert len(rows) >= 3 and len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["source"] and int(r["logged_tokens"]) > 0


def test_the_arithmetic_reproduces_each_logged_pool():
    """From the two free-memory readings a log prints, the pool to the rounding of its
    two-decimal GiB figures (under 0.01%)."""
    checked = 0
    for r in _records():
        if not (r["model"] and r["free_before_weights_gib"]):
            continue
        n = sglang_kv_tokens(get_model(r["model"]), tp=int(r["tp"]),
                             mem_fraction_static=float(r["mem_fraction_static"]),
                             total_gib=float(r["free_before_weights_gib"]),
                             available_gib=float(r["free_after_weights_gib"]))
        assert abs(n / int(r["logged_tokens"]) - 1) < 1e-4, (r["id"], n)
        checked += 1
    assert checked == 2


def test_predictions_within_one_percent_of_the_logs():
    """From the device and the model alone (the context constant is read off the first
    record, so that record is not an independent check; the second is)."""
    for r in _records():
        if not r["free_before_weights_gib"]:  # no readings to compare the weights with
            continue
        p = sglang_memory_profile(r["device"], r["model"], tp=int(r["tp"]),
                                  mem_fraction_static=float(r["mem_fraction_static"]))
        assert abs(p.max_total_num_tokens / int(r["logged_tokens"]) - 1) < 0.01, r["id"]
        # the weights as vLLM loads them, against what SGLang's log says they took
        took = float(r["free_before_weights_gib"]) - float(r["free_after_weights_gib"])
        assert abs(p.weights_gib - took) < 0.2


def test_a_record_of_a_config_json_model_at_tp4():
    """Qwen3-235B-A22B-FP8 at TP 4 from its config.json: the cell the log's K size
    implies (one KV head per GPU), its parameter count as published, and a prediction
    from the device alone (the context constant is a TP-1 reading) within 10%."""
    from experiments.memory_check import _sglang_model

    r = next(x for x in _records() if x["id"] == "vllm-issue-21348")
    m, quant = _sglang_model(r["model"])
    assert quant == "fp8" and round(m.n_params / 1e9) == 235
    assert round(m.n_active_params / 1e9) == 22
    p = sglang_memory_profile(r["device"], m, tp=int(r["tp"]), quantization=quant,
                              mem_fraction_static=float(r["mem_fraction_static"]))
    logged = int(r["logged_tokens"])
    assert p.cell_bytes == 128 * 94 * 2 * 2
    assert round(logged * p.cell_bytes / 2 / 2**30, 2) == 8.23  # the log's K size
    assert abs(p.max_total_num_tokens / logged - 1) < 0.10
    # fp8 weights: about a byte per parameter, a quarter on each GPU
    assert 0.9 < p.weights_gib * 2**30 * 4 / m.n_params < 1.1


def test_defaults_pages_and_kv_dtype():
    assert [default_mem_fraction_static(t) for t in (1, 2, 4, 8, 16)] == \
        [0.88, 0.87, 0.85, 0.81, 0.79]
    m = get_model("llama-3.1-8b")
    kw = dict(tp=1, mem_fraction_static=0.88, total_gib=78.59, available_gib=63.48)
    full = sglang_kv_tokens(m, **kw)
    assert sglang_kv_tokens(m, **kw, page_size=64) == full // 64 * 64
    assert sglang_kv_tokens(m, **kw, kv_cache_dtype="fp8_e4m3") in (2 * full, 2 * full + 1)
    tp2 = sglang_memory_profile("h100-80gb", "llama-3.1-8b", tp=2)
    assert tp2.mem_fraction_static == 0.87 and tp2.cell_bytes == 131072 / 2


@pytest.mark.parametrize("kw, field", [
    (dict(mem_fraction_static=1.2), "'mem_fraction_static' must be in"),
    (dict(mem_fraction_static=0.1), "leaves no KV pool"),
    (dict(kv_cache_dtype="int3"), "'kv_cache_dtype'"),
    (dict(tp=0), "'tp'"),
    (dict(page_size=0), "'page_size'"),
    (dict(context_gib=-1.0), "'context_gib'"),
])
def test_bad_arguments_name_their_field(kw, field):
    with pytest.raises(ValueError, match=field):
        sglang_memory_profile("h100-80gb", "llama-3.1-8b", **kw)


def test_cli():
    def run(*a):
        return subprocess.run([sys.executable, "-m", "tuner.memory", "--hardware",
                               "h100-80gb", "--model", "llama-3.1-8b", "--engine",
                               "sglang", *a], capture_output=True, text=True)
    p = run("--json")
    assert p.returncode == 0
    d = json.loads(p.stdout)
    assert d["max_total_num_tokens"] == sglang_memory_profile(
        "h100-80gb", "llama-3.1-8b").max_total_num_tokens
    p = run("--mem-fraction-static", "2")
    assert p.returncode == 2 and p.stderr.startswith("error: ") and \
        "Traceback" not in p.stderr and p.stdout == ""
