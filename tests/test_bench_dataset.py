"""The scenario's requests as a ``vllm bench serve`` dataset (``tuner.bench_dataset``)
and the measurement kit beside an exported policy (``tuner.export.deployment``)."""

import csv
import dataclasses
import json
import math
import shlex

import numpy as np
import pytest

from models.workload import make_workload
from tuner import bench_dataset as bd_cli
from tuner.export import bench_dataset as bd
from tuner.export.deployment import measure, vllm_args, write_measure_kit
from tuner.export.policy import make_policy
from tuner.scenario import ScenarioSpec, build_scenario

SPEC = ScenarioSpec(n_requests=120)  # deepseek-r1-distill-qwen-7b: adds a BOS
PAD = 7


@pytest.fixture(scope="module")
def sc():
    """The scenario padded with invalid rows, as validation pads windows."""
    base = build_scenario(SPEC)
    return base.padded(base.workload.size + PAD)


def _valid(sc):
    wl = sc.workload
    v = np.asarray(wl.valid)
    return (np.asarray(wl.prompt_tokens)[v], np.asarray(wl.output_tokens)[v],
            np.asarray(wl.arrival_s, np.float64)[v])


def _flags(command: str) -> dict:
    """``--flag value`` pairs of a command line (switches map to True)."""
    words = shlex.split(command)
    out, i = {}, 0
    while i < len(words):
        w = words[i]
        if w.startswith("--"):
            if i + 1 < len(words) and not words[i + 1].startswith("--"):
                out[w], i = words[i + 1], i + 2
                continue
            out[w] = True
        i += 1
    return out


def test_custom_dataset_round_trip(sc, tmp_path):
    p, o, _ = _valid(sc)
    assert sc.workload.size == len(p) + PAD
    bos = bd.bos_tokens("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B")
    assert bos == 1
    path = bd.write_dataset(sc, tmp_path / "d.dataset.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == len(p)  # one record per valid request, padding left out
    recs = [json.loads(line) for line in lines]
    assert all(set(r) == {"prompt", "output_tokens"} for r in recs)
    back = bd.read_dataset(path)
    assert back["format"] == "custom" and back["arrival_s"] is None
    np.testing.assert_array_equal(back["output_tokens"], o)  # exact, arrival order
    np.testing.assert_array_equal(back["prompt_tokens"], np.maximum(p - bos, 1))
    words = set(bd.WORDS)
    assert all(r["prompt"].split()[0] == "the" for r in recs)
    assert all(set(r["prompt"].split()) <= words for r in recs)
    # no two prompts share their first KV block (16 tokens: BOS + 15 words)
    heads = [tuple(r["prompt"].split()[:15]) for r in recs
             if len(r["prompt"].split()) >= 15]
    assert len(set(heads)) == len(heads)
    # without a BOS the word count is the simulated prompt length itself
    back0 = bd.read_dataset(bd.write_dataset(sc, tmp_path / "b0.jsonl", bos=0))
    np.testing.assert_array_equal(back0["prompt_tokens"], p)
    # seeded: the same file again; another seed, other words
    assert bd.write_dataset(sc, tmp_path / "again.jsonl").read_text() == path.read_text()
    other = bd.write_dataset(sc, tmp_path / "s1.jsonl", seed=1).read_text()
    assert other != path.read_text()
    s1 = bd.read_dataset(tmp_path / "s1.jsonl")
    np.testing.assert_array_equal(s1["prompt_tokens"], back["prompt_tokens"])


def test_timed_trace_and_burstgpt_round_trip(sc, tmp_path):
    p, o, t = _valid(sc)
    content = np.maximum(p - 1, 1)
    tpath = bd.write_dataset(sc, tmp_path / "x.trace.jsonl", "timed_trace")
    trace = bd.read_dataset(tpath)
    assert trace["format"] == "timed_trace"
    np.testing.assert_array_equal(trace["prompt_tokens"], content)
    np.testing.assert_array_equal(trace["output_tokens"], o)
    np.testing.assert_allclose(trace["arrival_s"], t - t[0], atol=1e-6)
    assert trace["arrival_s"][0] == 0 and np.all(np.diff(trace["arrival_s"]) >= 0)
    recs = [json.loads(line) for line in tpath.read_text().splitlines()]
    ids = [i for r in recs for i in r["hash_ids"]]
    assert len(ids) == len(set(ids))  # no chunk shared between prompts
    assert all(len(r["hash_ids"]) == math.ceil(r["input_length"] / bd.TIMED_TRACE_CHUNK)
               for r in recs)
    path = bd.write_dataset(sc, tmp_path / "x.burstgpt.csv", "burstgpt")
    rows = list(csv.reader(path.read_text().splitlines()))
    assert tuple(rows[0]) == bd.BURSTGPT_COLUMNS  # vLLM reads columns 2, 3 by position
    assert all(r[1] == "GPT-4" for r in rows[1:]) and len(rows) == len(p) + 1
    back = bd.read_dataset(path)
    assert back["format"] == "burstgpt"
    np.testing.assert_array_equal(back["prompt_tokens"], content)
    np.testing.assert_array_equal(back["output_tokens"], o)
    assert [int(r[2]) for r in rows[1:]] == content.tolist()
    assert [int(r[3]) for r in rows[1:]] == o.tolist()
    with pytest.raises(ValueError, match="unknown dataset format"):
        bd.write_dataset(sc, tmp_path / "x.txt", "sharegpt")


def test_atomic_write_leaves_no_partial_file(sc, tmp_path, monkeypatch):
    blocked = tmp_path / "kit.dataset.jsonl"
    blocked.mkdir()  # a directory in the way
    with pytest.raises(OSError):
        bd.write_dataset(sc, blocked)
    assert blocked.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [blocked.name]  # no temporary
    good = bd.write_dataset(sc, tmp_path / "ok.jsonl")
    before = good.read_text()

    def boom(*a, **k):
        raise RuntimeError("generation failed")

    monkeypatch.setattr(bd, "prompt_texts", boom)
    with pytest.raises(RuntimeError):
        bd.write_dataset(sc, good)
    assert good.read_text() == before  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([blocked.name,
                                                                 good.name])


def test_length_comparison_on_a_hand_made_workload(sc):
    cmp_ = bd.compare_lengths([1, 10, 100, 1000], [5, 1, 7, 3], [2, 10, 100, 1000],
                              [5, 1, 7, 3])
    sim, ds = cmp_["prompt_tokens"]["simulated"], cmp_["prompt_tokens"]["dataset"]
    # linear percentiles of [1, 10, 100, 1000]: positions 1.5, 2.7, 2.97
    assert sim == pytest.approx({"p50": 55.0, "p90": 730.0, "p99": 973.0,
                                 "mean": 277.75, "max": 1000.0})
    assert ds == pytest.approx({**sim, "mean": 278.0})
    assert cmp_["output_tokens"]["simulated"] == cmp_["output_tokens"]["dataset"] \
        == pytest.approx({"p50": 4.0, "p90": 6.4, "p99": 6.94, "mean": 4.0, "max": 7.0})
    assert (cmp_["requests"], cmp_["prompt_differs"], cmp_["prompt_max_abs_error"],
            cmp_["output_differs"]) == (4, 1, 1, 0)
    with pytest.raises(ValueError):
        bd.compare_lengths([1, 2], [1], [1, 2], [1, 2])
    # the same requests through a scenario: measure() reports the file's lengths
    wl = make_workload([0.0, 1.0, 3.0, 4.0], [1, 10, 100, 1000], [5, 1, 7, 3], pad_to=6)
    tiny = dataclasses.replace(sc, workload=wl)
    m = measure(tiny)
    lens = m["lengths"]
    assert lens["prompt_tokens"] == cmp_["prompt_tokens"]
    assert lens["output_tokens"] == cmp_["output_tokens"]
    assert (lens["requests"], lens["prompt_differs"], lens["bos_tokens"],
            lens["over_max_model_len"]) == (4, 1, 1, 0)
    assert m["dataset"]["requests"] == 4
    # gaps 1, 2, 1: CV sqrt(2/9) / (4/3) = 0.3536, burstiness 1 / CV^2 = 8
    assert m["arrivals"]["burstiness"] == 8.0
    assert m["arrivals"]["interarrival_cv"] == pytest.approx(0.3536, abs=1e-4)
    assert m["arrivals"]["request_rate_rps"] == pytest.approx(0.75)  # (n - 1) / span


def test_burstiness_matches_the_interarrival_cv():
    assert bd.burstiness(np.cumsum([0.0] + [1.0, 3.0] * 50)) == {
        "burstiness": 4.0, "interarrival_cv": 0.5}  # gaps 1 and 3: CV 1/2
    assert bd.burstiness(np.arange(10.0))["burstiness"] == 100.0  # even gaps: capped
    rng = np.random.default_rng(0)
    poisson = bd.burstiness(np.cumsum(rng.exponential(1.0, 20000)))
    assert poisson["burstiness"] == pytest.approx(1.0, abs=0.05)


def test_bench_commands_parse_and_name_the_dataset(sc):
    p, _, _ = _valid(sc)
    m = measure(sc, "out/pol.json")
    f = _flags(m["bench"])
    assert shlex.split(m["bench"])[:3] == ["vllm", "bench", "serve"]
    assert f["--dataset-name"] == "custom" and f["--dataset-path"] == "pol.dataset.jsonl"
    assert m["dataset"]["file"] == "pol.dataset.jsonl"
    assert int(f["--num-prompts"]) == len(p) == m["dataset"]["requests"]
    assert f["--custom-output-len"] == "-1"
    for switch in ("--ignore-eos", "--skip-chat-template", "--disable-shuffle",
                   "--no-oversample", "--save-result", "--save-detailed"):
        assert f[switch] is True
    assert f["--result-filename"] == m["result_file"] == "pol.result.json"
    assert float(f["--request-rate"]) == pytest.approx(sc.nominal_rps, rel=1e-5)
    assert float(f["--burstiness"]) == m["arrivals"]["burstiness"]
    assert f["--model"] == vllm_args(sc)["args"]["--model"]
    assert f["--percentile-metrics"] == "ttft,tpot,itl,e2el"
    assert f["--metric-percentiles"] == "50,90,99"
    assert int(f["--seed"]) == SPEC.seed and f["--port"] == "8000"
    alt = m["alternatives"]
    t = _flags(alt["timed_trace"]["bench"])
    assert t["--dataset-name"] == "timed_trace" and t["--self-timed"] is True
    assert t["--dataset-path"] == alt["timed_trace"]["file"] == "pol.trace.jsonl"
    assert "--request-rate" not in t and int(t["--num-prompts"]) == len(p)
    b = _flags(alt["burstgpt"]["bench"])
    assert (b["--dataset-name"], b["--dataset-path"]) == ("burstgpt", "pol.burstgpt.csv")
    assert int(b["--num-prompts"]) == len(p) and b["--ignore-eos"] is True
    c = _flags(m["calibrate"])
    assert shlex.split(m["calibrate"])[:3] == ["python", "-m", "tuner.calibrate"]
    assert c["--measured"] == "pol.result.json" and c["--out"] == "profile.json"
    assert (c["--hardware"], c["--model"], c["--scheduler"]) == (
        SPEC.hardware, SPEC.model, SPEC.scheduler)
    assert int(c["--max-prefill"]) == SPEC.max_prefill
    assert int(c["--max-batch"]) == SPEC.max_batch
    json.dumps(m, allow_nan=False)


def test_serve_command_and_scheduler_notes(sc):
    v0 = measure(sc)  # the default scheduler, vLLM V0's
    assert SPEC.scheduler == "v0"
    assert v0["serve"] == "VLLM_USE_V1=0 " + vllm_args(sc)["command"] + " --port 8000"
    assert any("V0 engine" in n and "chunked prefill" in n for n in v0["notes"])
    assert v0["server_notes"] == vllm_args(sc)["notes"]
    ch = build_scenario(SPEC.replace(scheduler="chunked", n_requests=40))
    mc = measure(ch)
    assert mc["serve"] == vllm_args(ch)["command"] + " --port 8000"
    assert "--enable-chunked-prefill" in shlex.split(mc["serve"])
    assert any("V1 server" in n for n in mc["notes"])
    assert _flags(mc["calibrate"])["--scheduler"] == "chunked"


def test_measure_kit_beside_the_policy(sc, tmp_path, capsys):
    policy = tmp_path / "tuned.json"
    paths = write_measure_kit(sc, policy)
    m = measure(sc, policy)
    names = {"custom": m["dataset"]["file"],
             **{k: a["file"] for k, a in m["alternatives"].items()}}
    assert {k: p.name for k, p in paths.items()} == names
    assert names["custom"] == "tuned.dataset.jsonl"
    assert all(p.parent == tmp_path for p in paths.values())
    n = m["dataset"]["requests"]
    for fmt, path in paths.items():
        assert len(bd.read_dataset(path)["output_tokens"]) == n
    # the CLI writes the same kit for a policy file
    doc = make_policy(system="paged", params={}, scenario=SPEC,
                      workload={"fingerprint": "x"}, objective="tps", tuner={}, seed=0,
                      metrics={k: {} for k in ("tuned", "default", "baseline")})
    cli_policy = tmp_path / "cli" / "p.json"
    cli_policy.parent.mkdir()
    cli_policy.write_text(json.dumps(doc))
    assert bd_cli.main([str(cli_policy), "--format", "custom"]) == 0
    written = cli_policy.parent / "p.dataset.jsonl"
    assert capsys.readouterr().out.strip() == f"wrote {written}"
    unpadded = build_scenario(SPEC)
    assert written.read_text() == \
        bd.write_dataset(unpadded, tmp_path / "ref.jsonl").read_text()
    assert bd_cli.main([str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_prompt_texts_and_bos():
    texts = bd.prompt_texts([1, 3, 20], seed=5)
    assert [len(s.split()) for s in texts] == [1, 3, 20] and texts[0] == "the"
    assert texts == bd.prompt_texts([1, 3, 20], seed=5)
    with pytest.raises(ValueError):
        bd.prompt_texts([2, 0])
    assert len(bd.WORDS) == len(set(bd.WORDS)) == 145 and bd.WORDS[0] == "the"
    assert bd.bos_tokens("Qwen/Qwen2.5-14B") == 0
    assert bd.bos_tokens("meta-llama/Meta-Llama-3-8B") == 1
    assert bd.bos_tokens("facebook/opt-13b") == 1 and bd.bos_tokens("someone/else") == 1
