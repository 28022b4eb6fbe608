"""The scenario's length clips, server settings and their CLI flags: per-request
context clip (vLLM's max_model_len rule), Vidur's proportional total-token clip,
``scheduler``/``watermark`` and ``--max-prefill``/``--max-batch``."""

import argparse
import collections
import json

import numpy as np
import pytest

from tuner import evaluate as ev
from tuner import fit as fit_cli
from tuner.common.atomic import write_json_atomic
from tuner.export.deployment import vllm_args
from tuner.export.policy import load_policy, make_policy
from tuner.scenario import (ScenarioSpec, build_scenario, check_spec, clip_lengths,
                            scale_to_max_tokens)
from tuner.workloads.presets import traces_dir
from tuner.workloads.traces import load_trace

VIDUR = traces_dir().parent / "reference" / "vidur-sharegpt-n2000-q0.25.csv"
# Llama-2-70B (4,096-token context) at TP2 on A100-80GB: the peer's (Vidur's) setup
PEER = dict(hardware="a100-80gb", model="llama-2-70b", tp=2)


def _csv(tmp_path, prompts, outputs, name="t.csv"):
    path = tmp_path / name
    rows = [f"{0.5 * i},{p},{o}" for i, (p, o) in enumerate(zip(prompts, outputs))]
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return str(path)


def _lengths(sc):
    wl = sc.workload
    return (np.asarray(wl.prompt_tokens).tolist(), np.asarray(wl.output_tokens).tolist())


def test_context_clip_is_per_request_and_max_len_may_be_the_context(tmp_path):
    prompts, outputs = [4095, 5000, 100, 3000, 200], [10, 10, 5000, 2000, 300]
    p, o = clip_lengths(prompts, outputs, max_len=4096, max_position=4096)
    assert p.tolist() == [4095, 4095, 100, 3000, 200]      # only the too-long prompt
    assert o.tolist() == [1, 1, 3996, 1096, 300]
    assert np.all(p + o <= 4096)
    p, o = clip_lengths(prompts, outputs, max_len=1024, max_position=4096)
    assert p.tolist() == [4095, 4095, 100, 3000, 200]      # max_len clips no prompt
    assert o.tolist() == [1, 1, 1024, 1024, 300]
    # through the scenario, with max_len == the model's context (4,096)
    sc = build_scenario(ScenarioSpec(trace=_csv(tmp_path, prompts, outputs), max_len=4096,
                                     **PEER))
    assert sc.cfg.max_len == sc.deployment.model.max_position == 4096
    assert _lengths(sc) == ([4095, 4095, 100, 3000, 200], [1, 1, 3996, 1096, 300])
    assert (sc.clipped_prompts, sc.clipped_outputs) == (1, 4)
    text = " | ".join(sc.warnings)
    assert "1 of 5 prompts clipped to 4095" in text and "4 of 5 outputs clipped" in text
    with pytest.raises(ValueError, match="exceeds llama-2-70b's context 4096"):
        build_scenario(ScenarioSpec(trace=_csv(tmp_path, prompts, outputs), max_len=4097,
                                    **PEER))
    # the default max_len (next power of two of the longest output) stays within it
    sc = build_scenario(ScenarioSpec(trace=_csv(tmp_path, prompts, outputs), **PEER))
    assert sc.cfg.max_len == 4096


def test_nothing_clipped_leaves_no_warning(tmp_path):
    sc = build_scenario(ScenarioSpec(trace=_csv(tmp_path, [100, 200, 300], [50, 60, 70]),
                                     max_len=4096, **PEER))
    assert (sc.clipped_prompts, sc.clipped_outputs, sc.warnings) == (0, 0, ())


def test_max_tokens_scales_like_vidur_by_hand(tmp_path):
    # max_tokens 100; diff = total - 100, p -= ceil(diff * p/total), o -= ceil(diff *
    # o/total), each at least 1:
    #   (60, 40): total 100, unchanged     (150, 50): diff 100 -> -75, -25 -> (75, 25)
    #   (1, 200): diff 101 -> -1 (0 -> 1), -ceil(100.497) = -101 -> (1, 99)
    #   (70, 33): diff 3 -> -ceil(2.04) = -3, -ceil(0.96) = -1 -> (67, 32), one short
    #   (10, 10): unchanged
    prompts, outputs = [60, 150, 1, 70, 10], [40, 50, 200, 33, 10]
    p, o = scale_to_max_tokens(prompts, outputs, 100)
    assert p.tolist() == [60, 75, 1, 67, 10] and o.tolist() == [40, 25, 99, 32, 10]
    sc = build_scenario(ScenarioSpec(trace=_csv(tmp_path, prompts, outputs),
                                     max_tokens=100, **PEER))
    assert _lengths(sc) == ([60, 75, 1, 67, 10], [40, 25, 99, 32, 10])
    assert (sc.clipped_prompts, sc.clipped_outputs) == (2, 3)
    assert any("max_tokens 100: 3 of 5" in w for w in sc.warnings)
    assert sc.cfg.max_len == 256  # the default max_len follows the scaled outputs
    # the total-token clip comes first, then the context: (4500, 500) fits 5,000 but
    # its prompt does not fit Llama-2's 4,096
    p, o = clip_lengths([4500], [500], max_len=4096, max_position=4096, max_tokens=5000)
    assert (p.tolist(), o.tolist()) == ([4095], [1])
    p, o = clip_lengths([4500], [500], max_len=4096, max_position=4096, max_tokens=4096)
    # diff 904: -ceil(813.6) and -ceil(90.4)
    assert (p.tolist(), o.tolist()) == ([3686], [409])


@pytest.mark.skipif(not VIDUR.exists(), reason=f"{VIDUR} not found")
def test_vidur_request_list_needs_no_clip():
    tr = load_trace(VIDUR)
    assert int(np.max(tr.prompt_tokens + tr.output_tokens)) == 4096
    base = ScenarioSpec(trace=str(VIDUR), max_len=4096, max_batch=128, max_prefill=4096,
                        **PEER)
    for spec in (base, base.replace(max_tokens=4096), base.replace(max_len=None)):
        sc = build_scenario(spec)
        assert (sc.clipped_prompts, sc.clipped_outputs, sc.warnings) == (0, 0, ())
        p, o = _lengths(sc)
        assert p == tr.prompt_tokens.tolist() and o == tr.output_tokens.tolist()
        assert sum(o) == 813_259  # the output total Vidur reported


@pytest.mark.needs_traces("sharegpt-8k-lengths.csv")
@pytest.mark.skipif(not VIDUR.exists(), reason=f"{VIDUR} not found")
def test_max_tokens_reproduces_vidurs_request_lengths():
    """The reference request list was drawn by Vidur from the ShareGPT lengths clipped to
    4,096 tokens: every (prompt, output) pair in it is one of ours, the scaled ones too."""
    src = load_trace(traces_dir() / "sharegpt-8k-lengths.csv")
    ref = load_trace(VIDUR)
    p, o = scale_to_max_tokens(src.prompt_tokens, src.output_tokens, 4096)

    def pairs(ps, os_):
        return collections.Counter(zip(np.asarray(ps).tolist(), np.asarray(os_).tolist()))
    ours, raw = pairs(p, o), pairs(src.prompt_tokens, src.output_tokens)
    theirs = pairs(ref.prompt_tokens, ref.output_tokens)
    assert not theirs - ours
    assert sum((theirs - raw).values()) > 100  # many of them were scaled
    assert int(np.max(p + o)) <= 4096 and p.min() >= 1 and o.min() >= 1


@pytest.mark.parametrize("change,needle", [
    ({"scheduler": "v1"}, "scheduler must be one of v0, chunked"),
    ({"scheduler": None}, "scheduler must be one of"),
    ({"watermark": 0.5}, "watermark must be a share"),
    ({"watermark": -0.01}, "watermark must be a share"),
    ({"watermark": float("nan")}, "watermark must be a share"),
    ({"watermark": True}, "watermark must be a share"),
    ({"max_tokens": 1}, "max_tokens must be an integer >= 2"),
    ({"max_tokens": 4096.5}, "max_tokens must be an integer >= 2"),
    ({"max_batch": 300}, "exceeds n_slots 256"),
    ({"max_prefill": 0}, "max_prefill must be >= 1"),
    ({"max_len": -1}, "max_len must be >= 1"),
])
def test_bad_settings_are_rejected(change, needle):
    spec = ScenarioSpec(n_requests=100).replace(**change)
    with pytest.raises(ValueError, match=needle):
        check_spec(spec)
    with pytest.raises(ValueError, match=needle):
        build_scenario(spec)


def test_scheduler_and_watermark_reach_the_server_config():
    sc = build_scenario(ScenarioSpec(n_requests=100))
    cap = float(sc.cfg.capacity_tokens)
    assert sc.cfg.chunked is False
    assert float(sc.cfg.watermark_tokens) == np.floor(0.01 * cap)
    sc = build_scenario(ScenarioSpec(n_requests=100, scheduler="chunked", watermark=0.0))
    assert sc.cfg.chunked is True and float(sc.cfg.watermark_tokens) == 0.0
    sc = build_scenario(ScenarioSpec(n_requests=100, watermark=0.05))
    assert float(sc.cfg.watermark_tokens) == np.floor(0.05 * cap)


def _parse(argv, parser="evaluate"):
    if parser == "fit":
        return fit_cli._args(argv)
    ap = argparse.ArgumentParser()
    ev.add_scenario_args(ap)
    return ap.parse_args(argv)


@pytest.mark.parametrize("parser", ["evaluate", "fit"])
def test_cli_flags_reach_the_server_config(parser):
    argv = ["--n-requests", "100", "--slots", "64", "--max-batch", "48", "--max-prefill",
            "4096", "--max-tokens", "2048", "--scheduler", "chunked", "--watermark", "0.02"]
    spec = ev.spec_from_args(_parse(argv, parser))
    assert (spec.n_slots, spec.max_batch, spec.max_prefill, spec.max_tokens,
            spec.scheduler, spec.watermark) == (64, 48, 4096, 2048, "chunked", 0.02)
    sc = build_scenario(spec)
    cfg = sc.cfg
    assert (cfg.n_slots, int(cfg.max_batch), float(cfg.max_prefill), cfg.chunked) == (
        64, 48, 4096.0, True)
    assert float(cfg.watermark_tokens) == np.floor(0.02 * float(cfg.capacity_tokens))
    wl = sc.workload
    assert int(np.max(np.asarray(wl.prompt_tokens) + np.asarray(wl.output_tokens))) <= 2048
    # --slots alone still sets the batch cap; the defaults stay
    spec = ev.spec_from_args(_parse(["--slots", "32"], parser))
    assert (spec.n_slots, spec.max_batch, spec.max_prefill, spec.scheduler,
            spec.watermark, spec.max_tokens) == (32, 32, 8192, "v0", 0.01, None)


@pytest.mark.parametrize("argv,needle", [
    (["--scheduler", "v1"], "scheduler must be one of v0, chunked"),
    (["--watermark", "0.6"], "watermark must be a share"),
    (["--max-batch", "64"], "exceeds n_slots 32"),
    (["--max-tokens", "1"], "max_tokens must be an integer >= 2"),
    (["--max-prefill", "0"], "max_prefill must be >= 1"),
])
def test_cli_bad_values_give_one_error(argv, needle, tmp_path, capsys):
    small = ["--n-requests", "100", "--slots", "32"]
    assert ev.main(["--system", "paged", *small, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
    out = tmp_path / "p.json"
    assert fit_cli.main(["--quiet", "--out", str(out), *small, *argv]) == 2
    err = [e for e in capsys.readouterr().err.strip().splitlines()
           if not e.startswith("tuner.fit:")]
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
    assert not out.exists()


def _policy(scenario: ScenarioSpec):
    m = {"objective": 1.0, "tps": 1.0}
    return make_policy(system="paged", params={}, scenario=scenario,
                       workload={"fingerprint": "x"},
                       metrics={"tuned": m, "default": m, "baseline": m},
                       objective="tps", tuner={}, seed=0)


def test_old_policy_files_without_the_new_keys_load(tmp_path):
    doc = _policy(ScenarioSpec(n_requests=120, n_slots=32, max_batch=32))
    for key in ("max_tokens", "scheduler", "watermark"):
        del doc["scenario"][key]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    sc = load_policy(path)["scenario"]
    assert (sc["max_tokens"], sc["scheduler"], sc["watermark"]) == (None, "v0", 0.01)
    assert ScenarioSpec.from_dict(sc) == ScenarioSpec(n_requests=120, n_slots=32,
                                                      max_batch=32)
    # new files keep the settings; a bad one names the file and the field
    spec = ScenarioSpec(n_requests=120, n_slots=32, max_batch=16, max_prefill=2048,
                        max_tokens=1000, scheduler="chunked", watermark=0.0)
    write_json_atomic(path, _policy(spec))
    assert ScenarioSpec.from_dict(load_policy(path)["scenario"]) == spec
    doc = _policy(spec)
    doc["scenario"]["scheduler"] = "v2"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="field 'scenario': scheduler must be one of"):
        load_policy(path)


def test_vllm_args_follow_the_scheduler_and_limits():
    spec = ScenarioSpec(n_requests=100, n_slots=64, max_batch=48, max_prefill=4096)
    v = vllm_args(build_scenario(spec))
    a = v["args"]
    assert (a["--max-num-seqs"], a["--max-num-batched-tokens"]) == (48, 4096)
    assert "--enable-chunked-prefill" not in a
    assert "--enable-chunked-prefill" not in v["command"]
    assert any("V1 no longer offers it" in n for n in v["notes"])
    # the model's context (131,072) is above 4,096 tokens per step: vLLM V0 would refuse
    assert any("refuses to start without chunked prefill" in n for n in v["notes"])
    v = vllm_args(build_scenario(spec.replace(scheduler="chunked", watermark=0.0)))
    assert v["args"]["--enable-chunked-prefill"] is True
    words = v["command"].split()
    i = words.index("--enable-chunked-prefill")
    assert i == len(words) - 1 or words[i + 1].startswith("--")  # a switch, no value
    assert not any("refuses to start" in n for n in v["notes"])
    assert any("keeps 0 of the KV capacity free" in n for n in v["notes"])
