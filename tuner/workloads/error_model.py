"""Length classes, predictor error statistics and an empirical error model.

For traces without prompt text, :class:`ErrorModel` stands in for the predictor: it
holds (log(L_hat / L), u) pairs of the real predictor on CASTILLO test prompts, grouped
by the class of the true length L, and resamples them per request. Keeping the pairs
together keeps both regression to the mean (short requests over-predicted, long ones
under-predicted) and the way u tracks the size of the error.

``tuner/workloads/data/error_model.json`` is derived from the data and a trained predictor:
``python -m tuner.workloads.predictor error-model --data DIR --out tuner/workloads/data/error_model.json``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from tuner.workloads.features import load_castillo, tokenize

__all__ = [
    "DEFAULT_PATH", "ErrorModel", "class_quantile_table", "fit_error_model",
    "length_class", "load_default_error_model", "mixture_quantile",
    "predict_lengths", "rank_calibrate", "score", "soft_labels", "spearman",
]

DEFAULT_PATH = Path(__file__).parent / "data" / "error_model.json"
FORMAT, VERSION = "kvtune.error_model", 1


def length_class(lengths, edges) -> np.ndarray:
    """Class index of each length: edges[k] <= L < edges[k+1], clipped to [0, K)."""
    k = np.searchsorted(np.asarray(edges), np.asarray(lengths), side="right") - 1
    return np.clip(k, 0, len(edges) - 2)


def soft_labels(lengths, owner, n_prompts: int, edges) -> np.ndarray:
    """[N, K] float32: each prompt's empirical distribution of its lengths' classes."""
    y = np.zeros((n_prompts, len(edges) - 1), np.float64)
    np.add.at(y, (owner, length_class(lengths, edges)), 1.0)
    return (y / y.sum(axis=1, keepdims=True)).astype(np.float32)


def class_quantile_table(lengths, edges, n_q: int = 33) -> np.ndarray:
    """[K, n_q] quantiles of the training lengths within each class (log-uniform
    between the edges for a class with no training lengths)."""
    cls, levels = length_class(lengths, edges), np.linspace(0.0, 1.0, n_q)
    rows = [np.quantile(lengths[cls == k], levels) if np.any(cls == k)
            else np.geomspace(edges[k], edges[k + 1], n_q)
            for k in range(len(edges) - 1)]
    return np.asarray(rows, np.float64)


def mixture_quantile(probs, table, q: float) -> np.ndarray:
    """Quantile q of the mixture sum_k probs[:, k] * (class k's length distribution)."""
    probs = np.asarray(probs, np.float64)
    cum = np.cumsum(probs, axis=1)
    k = np.argmax(cum >= q * cum[:, -1:] - 1e-12, axis=1)
    rows = np.arange(probs.shape[0])
    pk = probs[rows, k]
    frac = np.clip((q * cum[:, -1] - (cum[rows, k] - pk)) / np.maximum(pk, 1e-12), 0, 1)
    pos = frac * (table.shape[1] - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, table.shape[1] - 1)
    w = pos - lo
    return table[k, lo] * (1 - w) + table[k, hi] * w


def rank_calibrate(u, reference) -> np.ndarray:
    """Each ``u`` replaced by its empirical CDF position among ``reference``: the share
    of reference values <= it, in [0, 1]. Over the reference itself ``F(u) > tau``
    holds for a share <= 1 - tau (equal up to ties), so a threshold tau on the
    calibrated u routes that share of requests distributed like the reference."""
    ref = np.sort(np.asarray(reference, np.float64).reshape(-1))
    if ref.size == 0 or not np.all(np.isfinite(ref)):
        raise ValueError("rank calibration needs a non-empty, finite reference set of u")
    u = np.asarray(u, np.float64)
    return np.searchsorted(ref, u, side="right") / ref.size


def spearman(a, b) -> float:
    """Spearman rank correlation with average ranks for ties."""
    def rank(v):
        _, inv, cnt = np.unique(v, return_inverse=True, return_counts=True)
        return (np.cumsum(cnt) - (cnt - 1) / 2.0)[inv]
    ra, rb = rank(np.asarray(a)), rank(np.asarray(b))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _point_scores(lh, lengths, pred_cls, edges) -> dict:
    true_cls = length_class(lengths, edges)
    return {"mae": float(np.mean(np.abs(lh - lengths))),
            "accuracy": float(np.mean(pred_cls == true_cls)),
            "fit_rate": float(np.mean(lengths <= np.asarray(edges)[pred_cls + 1]))}


def score(l_hat, u, probs, recs, edges, train_median: float, n_bins: int = 5) -> dict:
    """Metrics of (L_hat, u, probs) against every realised length in ``recs``."""
    own, lengths = recs.owner, recs.lengths.astype(np.float64)
    lh, us, pc = l_hat[own], u[own], np.argmax(probs, axis=1)[own]
    base_cls = np.full_like(pc, length_class(train_median, edges))
    out = {"n_prompts": recs.n_prompts, "n_samples": int(lengths.size)}
    out.update(_point_scores(lh, lengths, pc, edges))
    out["baseline"] = dict(_point_scores(train_median, lengths, base_cls, edges),
                           train_median=float(train_median))
    modal = np.argmax(soft_labels(recs.lengths, own, recs.n_prompts, edges), axis=1)
    out["oracle_accuracy"] = float(np.mean(modal[own] == length_class(lengths, edges)))
    err = np.abs(np.log(np.maximum(lengths, 1.0) / lh))
    cuts = np.quantile(us, np.linspace(0, 1, n_bins + 1))
    b = np.clip(np.searchsorted(cuts, us, side="right") - 1, 0, n_bins - 1)
    bins = [{"u_lo": float(cuts[i]), "u_hi": float(cuts[i + 1]), "n": int(np.sum(m)),
             "mean_u": float(us[m].mean()), "mean_abs_log_err": float(err[m].mean())}
            for i in range(n_bins) if np.any(m := b == i)]
    per_prompt = np.bincount(own, err, recs.n_prompts) / np.bincount(own)
    out["calibration"] = {"bins": bins, "spearman": spearman(us, err),
                          "spearman_prompt": spearman(u, per_prompt)}
    names = np.asarray(recs.datasets)[own]
    out["per_dataset"] = {}
    for ds in sorted(set(recs.datasets)):
        m = names == ds
        row = _point_scores(lh[m], lengths[m], pc[m], edges)
        base = _point_scores(train_median, lengths[m], base_cls[m], edges)
        row.update({f"baseline_{k}": v for k, v in base.items()},
                   n_prompts=int(np.unique(own[m]).size), mean_u=float(us[m].mean()))
        out["per_dataset"][ds] = row
    return out


@dataclasses.dataclass
class ErrorModel:
    edges: tuple[int, ...]
    log_ratio: list[np.ndarray]  # per true-length class: log(L_hat / L) samples
    u: list[np.ndarray]          # per true-length class: the paired u samples
    meta: dict

    def sample(self, true_lengths, seed: int):
        """Per request draw a (log-ratio, u) pair of its true-length class (nearest
        populated class if empty); return (L_hat float64, u float64)."""
        lengths = np.maximum(np.asarray(true_lengths, np.float64).reshape(-1), 1.0)
        cls = length_class(lengths, self.edges)
        full = np.array([k for k, v in enumerate(self.log_ratio) if v.size > 0])
        if full.size == 0:
            raise ValueError("error model holds no pairs")
        src = full[np.argmin(np.abs(cls[:, None] - full[None, :]), axis=1)]
        draw = np.random.default_rng(seed).random(lengths.size)
        l_hat, u = np.empty_like(lengths), np.empty_like(lengths)
        for k in np.unique(src):
            m = src == k
            idx = np.minimum((draw[m] * self.log_ratio[k].size).astype(int),
                             self.log_ratio[k].size - 1)
            l_hat[m] = lengths[m] * np.exp(self.log_ratio[k][idx])
            u[m] = self.u[k][idx]
        return l_hat, u

    def to_json(self) -> str:
        classes = [{"lo": int(self.edges[k]), "hi": int(self.edges[k + 1]),
                    "log_ratio": np.round(r, 4).tolist(),
                    "u": np.round(v, 4).tolist()}
                   for k, (r, v) in enumerate(zip(self.log_ratio, self.u))]
        return json.dumps({"format": FORMAT, "version": VERSION, "meta": self.meta,
                           "edges": list(self.edges), "classes": classes})

    @classmethod
    def from_json(cls, text: str) -> ErrorModel:
        d = json.loads(text)
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise ValueError("not an error-model JSON of this version")
        edges = tuple(int(e) for e in d["edges"])
        if len(d["classes"]) != len(edges) - 1:
            raise ValueError("error model: one entry per class expected")
        lr = [np.asarray(c["log_ratio"], np.float64) for c in d["classes"]]
        u = [np.asarray(c["u"], np.float64) for c in d["classes"]]
        if any(a.shape != b.shape for a, b in zip(lr, u)):
            raise ValueError("error model: log_ratio and u differ in length")
        return cls(edges, lr, u, dict(d["meta"]))


def fit_error_model(predictor, data_dir, *, split_glob: str = "*-test.jsonl",
                    max_pairs_per_class: int = 1500, seed: int = 0) -> ErrorModel:
    """Collect (true class, log(L_hat/L), u) over every realised length of a split."""
    recs = load_castillo(data_dir, split_glob)
    l_hat, u, _ = predictor.predict(recs.prompt_texts, recs.input_sizes,
                                    recs.datasets, recs.categories)
    lengths = np.maximum(recs.lengths.astype(np.float64), 1.0)
    ratio, us = np.log(l_hat[recs.owner] / lengths), u[recs.owner]
    cls, edges = length_class(lengths, predictor.edges), tuple(predictor.edges)
    rng = np.random.default_rng(seed)
    lr_k, u_k, counts = [], [], []
    for k in range(len(edges) - 1):
        idx = np.flatnonzero(cls == k)
        counts.append(int(idx.size))
        if idx.size > max_pairs_per_class:
            idx = np.sort(rng.choice(idx, max_pairs_per_class, replace=False))
        lr_k.append(ratio[idx])
        u_k.append(us[idx])
    meta = {"source_files": [Path(f).name for f in recs.files],
            "source_dir": Path(data_dir).name, "split_glob": split_glob,
            "pairs_per_class_before_subsampling": counts,
            "max_pairs_per_class": max_pairs_per_class, "subsample_seed": seed,
            "predictor": {k: predictor.info.get(k) for k in
                          ("files", "n_prompts", "seed", "train_config")},
            "predictor_quantile": predictor.quantile}
    return ErrorModel(edges, lr_k, u_k, meta)


def load_default_error_model() -> ErrorModel:
    return ErrorModel.from_json(DEFAULT_PATH.read_text(encoding="utf-8"))


def predict_lengths(trace_like, output_tokens, *, seed: int, predictor=None,
                    input_sizes=None, datasets=None, error_model=None):
    """(L_hat, u, source): the predictor on prompt texts when both are given, else
    the error model sampled around the realised ``output_tokens``."""
    if trace_like is not None and predictor is not None:
        texts = list(trace_like)
        if input_sizes is None:  # no token counts: approximate by regex tokens
            input_sizes = [len(tokenize(t)) for t in texts]
        l_hat, u, _ = predictor.predict(texts, input_sizes, datasets)
        return l_hat, u, "predictor"
    model = error_model or load_default_error_model()
    l_hat, u = model.sample(output_tokens, seed)
    return l_hat, u, "error-model"

