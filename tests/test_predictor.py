"""Generation-length predictor, its features, its error model and its CLI, on the
shared CASTILLO files (a fast training config on a subset of the validate split)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tuner.workloads import error_model as em
from tuner.workloads import predictor as pr
from tuner.workloads.features import DataError, FeatureConfig, featurize, load_castillo

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("KVTUNE_TRACES", ROOT.parent / "shared" / "traces"))
CASTILLO = TRACES / "castillo-qwen2.5-7b"
needs_castillo = pytest.mark.needs_traces("castillo-qwen2.5-7b")
FAST = pr.TrainConfig(epochs=10)


def _subset(src_glob: str, dst: Path, per_file: int, suffix="-validate.jsonl"):
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(CASTILLO.glob(src_glob)):
        lines = f.read_text().splitlines()[:per_file]
        (dst / f.name.replace("-validate.jsonl", suffix)).write_text(
            "\n".join(lines) + "\n")
    return dst


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    data = _subset("*-validate.jsonl", tmp_path_factory.mktemp("train"), 150)
    return pr.train(data, seed=0, config=FAST)


@pytest.fixture(scope="module")
def test_recs():
    return load_castillo(CASTILLO, "*-test.jsonl")


@needs_castillo
def test_features_deterministic_and_blind_to_outputs(tmp_path):
    rows = [json.loads(line) for line in
            (CASTILLO / "dollydataset-test.jsonl").read_text().splitlines()[:20]]
    a = tmp_path / "a-test.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for r in rows:  # every output column changed, nothing else
        r["output_sizes"] = [int(v) * 7 + 3 for v in r["output_sizes"]]
        r["output_mean"], r["output_std"] = 1e6, 0.0
    b = tmp_path / "b" / "a-test.jsonl"
    b.parent.mkdir()
    b.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ra, rb = load_castillo(tmp_path, "a-test.jsonl"), load_castillo(b.parent, "*")
    assert not np.array_equal(ra.lengths, rb.lengths)
    fa = featurize(ra.prompt_texts, ra.input_sizes, ra.datasets, ra.categories)
    fb = featurize(rb.prompt_texts, rb.input_sizes, rb.datasets, rb.categories)
    np.testing.assert_array_equal(fa, fb)
    cfg = FeatureConfig()
    assert fa.shape == (20, cfg.n_features) and fa.dtype == np.float32
    meta = fa[:, cfg.meta_slice]
    assert np.all(meta.sum(axis=1) == 2.0)  # one dataset + one category one-hot
    # crc32 hashing: identical in a fresh process with another PYTHONHASHSEED
    code = ("import sys, json, numpy as np; from tuner.workloads.features import featurize;"
            "t = json.load(sys.stdin); x = featurize(t, [5] * len(t));"
            "print(json.dumps(np.flatnonzero(x[:, :2**14]).tolist()))")
    env = dict(os.environ, PYTHONHASHSEED="123", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(
        ra.prompt_texts), capture_output=True, text=True, env=env, check=True)
    here = featurize(ra.prompt_texts, [5] * 20)
    assert json.loads(out.stdout) == np.flatnonzero(here[:, :2**14]).tolist()


def test_unknown_dataset_maps_to_other():
    cfg = FeatureConfig()
    x = featurize(["hi", "hi", "hi"], [1, 1, 1], ["ShArEgPt", "nope", None],
                  ["open_qa", None, "new_cat"])
    ds = x[:, cfg.meta_slice][:, :len(cfg.dataset_vocab)]
    assert [cfg.dataset_vocab[i] for i in ds.argmax(1)] == ["ShareGPT", "other",
                                                            "other"]


@needs_castillo
def test_predict_outputs_and_round_trip(trained, test_recs, tmp_path):
    texts, sizes = test_recs.prompt_texts[:200], test_recs.input_sizes[:200]
    l_hat, u, probs = trained.predict(texts, sizes, test_recs.datasets[:200])
    assert probs.shape == (200, len(pr.EDGES) - 1)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert np.all((u >= 0) & (u <= 1)) and np.all(np.isfinite(l_hat) & (l_hat > 0))
    l2, u2, _ = trained.predict(texts, sizes)  # without dataset tags: still valid
    assert np.all((u2 >= 0) & (u2 <= 1)) and np.all(l2 > 0)
    path = tmp_path / "m.msgpack"
    trained.save(path)
    again = pr.Predictor.load(path)
    for x, y in zip(trained.predict(texts, sizes, test_recs.datasets[:200]),
                    again.predict(texts, sizes, test_recs.datasets[:200])):
        np.testing.assert_array_equal(x, y)
    assert [p.name for p in tmp_path.iterdir()] == ["m.msgpack"]  # no temp left


@needs_castillo
def test_beats_training_median_on_test_split(trained):
    r = pr.evaluate(trained, CASTILLO)
    assert r["n_prompts"] == 1110 and r["n_samples"] == 11100
    assert r["mae"] < r["baseline"]["mae"]
    assert r["accuracy"] > r["baseline"]["accuracy"]
    assert r["calibration"]["spearman"] > 0.2  # higher u, larger errors
    assert set(r["per_dataset"]) == {"Alpaca", "Apps", "BigCodeBench", "DS1000",
                                     "DollyDataset", "Mbpp", "ShareGPT"}


@pytest.fixture(scope="module")
def fitted(trained):
    return em.fit_error_model(trained, CASTILLO, max_pairs_per_class=800)


@needs_castillo
def test_error_model_reproduces_log_ratio_quantiles(fitted, test_recs):
    lengths = test_recs.lengths
    cls = em.length_class(lengths, fitted.edges)
    l_hat, u = fitted.sample(np.tile(lengths, 20), seed=3)
    ratio, cls20 = np.log(l_hat / np.tile(lengths, 20)), np.tile(cls, 20)
    assert np.all((u >= 0) & (u <= 1))
    qs = [0.25, 0.5, 0.75]
    for k in range(len(fitted.edges) - 1):
        if fitted.log_ratio[k].size < 300:
            continue
        drawn, pairs = np.sort(ratio[cls20 == k]), np.sort(fitted.log_ratio[k])
        np.testing.assert_allclose(np.quantile(drawn, qs), np.quantile(pairs, qs),
                                   atol=0.05, err_msg=f"class {k}")
        grid = np.r_[drawn, pairs]  # two-sample Kolmogorov-Smirnov distance
        ks = np.abs(np.searchsorted(drawn, grid, "right") / drawn.size
                    - np.searchsorted(pairs, grid, "right") / pairs.size).max()
        assert ks < 0.03, (k, ks)
    # regression to the mean: short requests over-, long ones under-predicted
    assert np.median(fitted.log_ratio[1]) > 0.3 > -0.3 > np.median(
        fitted.log_ratio[6])


@needs_castillo
def test_error_model_deterministic_fallback_and_json(fitted):
    lengths = np.array([5, 100, 400, 3000, 9000, 15001])
    a, b = fitted.sample(lengths, seed=7), fitted.sample(lengths, seed=7)
    c = fitted.sample(np.tile(lengths, 50), seed=8)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(np.tile(a[0], 50), c[0])
    sparse = em.ErrorModel(fitted.edges, [np.zeros(0)] * 10, [np.zeros(0)] * 10, {})
    sparse.log_ratio[4], sparse.u[4] = np.array([0.5]), np.array([0.25])
    l_hat, u = sparse.sample([3, 300, 12000], seed=0)  # all fall back to class 4
    np.testing.assert_allclose(l_hat, np.array([3, 300, 12000]) * np.exp(0.5))
    np.testing.assert_allclose(u, 0.25)
    back = em.ErrorModel.from_json(fitted.to_json())
    for x, y in zip(back.log_ratio, fitted.log_ratio):
        np.testing.assert_allclose(x, y, atol=5e-5)


@needs_castillo
def test_default_error_model_and_predict_lengths(trained):
    assert em.DEFAULT_PATH.stat().st_size < 300_000
    model = em.load_default_error_model()
    assert model.meta["source_files"] and model.meta["predictor"]["train_config"]
    l_hat, u, src = em.predict_lengths(None, [10, 300, 2000], seed=0)
    assert src == "error-model" and l_hat.shape == (3,) and np.all(l_hat > 0)
    l_hat, u, src = em.predict_lengths(["Write a poem."], [300], seed=0,
                                       predictor=trained)
    assert src == "predictor" and 0 <= u[0] <= 1


def _bad_dirs(tmp: Path):
    row = json.loads((CASTILLO / "mbpp-test.jsonl").read_text().splitlines()[0])
    cases = {"missing": tmp / "nope", "empty": tmp / "empty"}
    cases["empty"].mkdir()
    neg = dict(row, output_sizes=[5, -1] + row["output_sizes"][2:])
    nofield = {k: v for k, v in row.items() if k != "input_size"}
    for name, line in [("malformed", json.dumps(row)[:-5]), ("negative",
                       json.dumps(neg)), ("nofield", json.dumps(nofield))]:
        (tmp / name).mkdir()
        (tmp / name / "x-validate.jsonl").write_text(json.dumps(row) + "\n" + line)
    return cases | {k: tmp / k for k in ("malformed", "negative", "nofield")}


@needs_castillo
@pytest.mark.parametrize("case, words", [
    ("missing", "not a directory"), ("empty", "no files match"),
    ("malformed", "x-validate.jsonl:2"), ("negative", "'output_sizes'"),
    ("nofield", "'input_size'")])
def test_cli_train_bad_input(tmp_path, capsys, case, words):
    data = _bad_dirs(tmp_path)[case]
    out = tmp_path / "model.msgpack"
    assert pr.main(["train", "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr()
    assert err.out == "" and len(err.err.strip().splitlines()) == 1
    assert words in err.err and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model")]


def test_cli_evaluate_bad_model(tmp_path, capsys):
    garbage = tmp_path / "garbage.msgpack"
    garbage.write_bytes(b"\x00not msgpack at all")
    # a garbage file, no file, a directory (the CLI's exit code and stderr as a process:
    # test_cli_train_then_evaluate)
    for path in (garbage, tmp_path / "absent.msgpack", tmp_path):
        code = pr.main(["evaluate", "--model", str(path), "--data", str(CASTILLO)])
        err = capsys.readouterr()
        assert code == 2 and err.out == "" and len(err.err.strip().splitlines()) == 1
        assert str(path) in err.err


@needs_castillo
def test_cli_train_then_evaluate(tmp_path):
    data = _subset("*-validate.jsonl", tmp_path / "d", 20)
    out = tmp_path / "m.msgpack"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = [sys.executable, "-m", "tuner.workloads.predictor"]
    subprocess.run(run + ["train", "--data", str(data), "--out", str(out),
                          "--epochs", "2"], check=True, env=env, capture_output=True)
    res = subprocess.run(run + ["evaluate", "--model", str(out), "--data", str(data),
                                "--split", "*-validate.jsonl", "--json"],
                         check=True, env=env, capture_output=True, text=True)
    r = json.loads(res.stdout)
    assert r["n_prompts"] == 140 and {"mae", "accuracy", "fit_rate", "calibration",
                                      "baseline", "per_dataset"} <= set(r)
    # a bad --model exits 2 with one line: test_cli_evaluate_bad_model (in process,
    # the directory case included; main()'s return value is the exit code, as above)
    with pytest.raises(DataError):
        load_castillo(tmp_path / "nowhere")
