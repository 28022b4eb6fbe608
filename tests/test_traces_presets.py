"""The built-in default workload, its table, and the named presets."""

import json

import numpy as np
import pytest

from experiments.make_default_workload import main as make_table
from experiments.make_default_workload import provenance, spearman
from tuner.workloads.presets import (
    DEFAULT_TABLE,
    default_trace,
    list_presets,
    load_table,
    resolve_trace,
    traces_dir,
)
from tuner.workloads.traces import load_trace

TRACES = traces_dir()


def test_table_is_valid_and_documents_its_source():
    table = load_table()
    assert table["source"].startswith("Azure/AzurePublicDataset:")
    assert "@" in table["source"] and table["licence"] == "CC-BY-4.0"
    assert table["generated_by"] == "experiments/make_default_workload.py"
    assert table["percentiles"] == list(range(101)) and table["rows"] == 19_366


@pytest.mark.needs_traces("azure-llm-2023-conv.csv")
def test_table_is_reproducible_from_the_trace(tmp_path, capsys):
    out = tmp_path / "table.json"
    assert make_table(["--out", str(out)]) == 0
    assert out.read_text() == DEFAULT_TABLE.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["table.json"]  # no temp files
    trace = load_trace(TRACES / "azure-llm-2023-conv.csv")
    table = json.loads(out.read_text())
    assert table["rate_rps"] == pytest.approx((len(trace) - 1) / trace.arrival_s[-1])
    assert table["output_tokens"][99] == pytest.approx(601, abs=1)  # README: p99 601
    assert "19366 rows" in capsys.readouterr().out


def test_spearman_with_ties():
    x = np.array([1, 2, 2, 3, 5, 4])
    y = np.array([2, 1, 4, 4, 9, 8])
    rank = {1: 1, 2: 2.5, 3: 4, 4: 5, 5: 6}
    rank_y = {1: 1, 2: 2, 4: 3.5, 8: 5, 9: 6}
    want = np.corrcoef([rank[v] for v in x], [rank_y[v] for v in y])[0, 1]
    assert spearman(x, y) == pytest.approx(want)
    assert spearman(np.arange(10), np.arange(10) ** 3) == pytest.approx(1.0)


@pytest.mark.needs_traces("README.md")
def test_provenance_comes_from_the_readme():
    got = provenance(TRACES / "README.md", "mooncake-conversation.jsonl")
    assert got == {"source": "kvcache-ai/Mooncake:FAST25-release/traces/"
                   "conversation_trace.jsonl @3b5a594", "licence": "Apache-2.0"}


def test_default_trace_follows_the_table():
    table = load_table()
    trace = default_trace(n=20_000, seed=1)
    assert trace.format == "default" and len(trace) == 20_000
    for name in ("prompt_tokens", "output_tokens"):
        for q in (10, 25, 50, 75, 90):
            want = table[name][q]
            assert np.percentile(getattr(trace, name), q) == pytest.approx(want,
                                                                           rel=0.05)
        assert getattr(trace, name).min() >= 1
    rho = spearman(trace.prompt_tokens, trace.output_tokens)
    assert rho == pytest.approx(table["spearman_prompt_output"], abs=0.03)
    gaps = np.diff(trace.arrival_s)
    assert 1 / gaps.mean() == pytest.approx(table["rate_rps"], rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(table["interarrival_cv"], rel=0.1)


def test_default_trace_seed_and_rate():
    a, b = default_trace(n=500, seed=3), default_trace(n=500, seed=3)
    np.testing.assert_array_equal(a.prompt_tokens, b.prompt_tokens)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    other = default_trace(n=500, seed=4)
    assert not np.array_equal(a.output_tokens, other.output_tokens)
    fast = default_trace(n=5000, seed=0, rate=50.0)
    assert (len(fast) - 1) / fast.arrival_s[-1] == pytest.approx(50.0, rel=0.1)
    with pytest.raises(ValueError, match="n must be"):
        default_trace(n=0)
    assert len(resolve_trace("default", n=7)) == 7


@pytest.mark.needs_traces("azure-llm-2023-conv.csv", "mooncake-conversation.jsonl",
                          "sharegpt-8k-lengths.csv", "arxiv-summarization-lengths.csv",
                          "castillo-qwen2.5-7b")
@pytest.mark.parametrize("name, rows", [
    ("azure-conv", 19_366), ("mooncake", 12_031), ("sharegpt", 30_731),
    ("arxiv", 28_257), ("castillo-alpaca", 200), ("castillo", 1110)])
def test_presets_resolve(name, rows):
    assert len(resolve_trace(name)) == rows
    first = resolve_trace(name, n=10)
    assert len(first) == 10
    if first.arrival_s is not None:
        assert first.arrival_s[0] == 0 and np.all(np.diff(first.arrival_s) >= 0)


def test_unknown_preset_lists_the_presets():
    assert list_presets()[0] == "default"
    assert set(list_presets()) == {"default", "azure-conv", "mooncake", "sharegpt",
                                   "arxiv", "castillo-alpaca", "castillo"}
    with pytest.raises(ValueError, match="unknown trace 'azure'.*azure-conv"):
        resolve_trace("azure")


def test_traces_dir_honours_the_environment(tmp_path, monkeypatch):
    (tmp_path / "sharegpt-8k-lengths.csv").write_text(
        "num_prefill_tokens,num_decode_tokens\n10,20\n30,40\n")
    monkeypatch.setenv("KVTUNE_TRACES", str(tmp_path))
    assert traces_dir() == tmp_path
    trace = resolve_trace("sharegpt")
    assert trace.source == str(tmp_path / "sharegpt-8k-lengths.csv") and len(trace) == 2
    assert len(resolve_trace(tmp_path / "sharegpt-8k-lengths.csv")) == 2


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.pop("licence"), "missing \\['licence'\\]"),
    (lambda t: t.update(extra=1), "unknown \\['extra'\\]"),
    (lambda t: t.update(output_tokens=t["output_tokens"][::-1]), "non-decreasing"),
    (lambda t: t.update(rate_rps=0), "rate"),
])
def test_load_table_rejects_bad_tables(tmp_path, edit, match):
    table = json.loads(DEFAULT_TABLE.read_text())
    edit(table)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match=match):
        load_table(path)
