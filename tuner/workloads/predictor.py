"""Length predictor: a flax MLP, hashed prompt features -> logits over K log-spaced
length classes, trained (optax adamw) by cross-entropy against each prompt's SOFT label
(the class histogram of its sampled lengths). ``L_hat`` = the quantile of the predictive
length mixture that minimised MAE on held-out training prompts; ``u`` = class entropy /
log K in [0, 1]. CLI: ``python -m tuner.workloads.predictor {train,evaluate} -h``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

from tuner.common.atomic import write_bytes_atomic, write_text_atomic
from tuner.workloads import error_model as em
from tuner.workloads.features import DataError, FeatureConfig, featurize, load_castillo

__all__ = ["EDGES", "LengthMLP", "ModelFileError", "Predictor", "TrainConfig",
           "evaluate", "load", "main", "train"]

EDGES = (1, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FORMAT, VERSION = "kvtune.length_predictor", 1
_QUANTILES = (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7)


class ModelFileError(ValueError):
    """A model file that cannot be read or holds no predictor of this version."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    epochs: int = 20
    hidden: int = 128
    batch: int = 64
    lr: float = 2e-3
    weight_decay: float = 1e-4
    dropout: float = 0.5
    meta_drop: float = 0.1  # share of rows trained with dataset/category -> 'other'
    holdout: float = 0.15   # share of prompts held out to pick the L_hat quantile


class LengthMLP(nn.Module):
    hidden: int
    n_classes: int
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x, *, train: bool = False):
        h = nn.gelu(nn.Dense(self.hidden)(x))
        h = nn.Dropout(self.dropout, deterministic=not train)(h)
        return nn.Dense(self.n_classes)(h)


def _fit(x, y, cfg: TrainConfig, fcfg: FeatureConfig, seed: int):
    """Train LengthMLP on features x [N, F] and soft labels y [N, K]; return params."""
    model = LengthMLP(cfg.hidden, y.shape[1], cfg.dropout)
    key, init_key = jax.random.split(jax.random.key(seed))
    params = model.init(init_key, jnp.zeros((1, x.shape[1]), jnp.float32))
    n_batches = -(-x.shape[0] // cfg.batch)
    sched = optax.cosine_decay_schedule(cfg.lr, cfg.epochs * n_batches)
    opt = optax.adamw(sched, weight_decay=cfg.weight_decay)
    other = featurize([""], [0], config=fcfg)  # [1, F]: dataset, category 'other'
    is_meta = np.arange(x.shape[1])[None, :] >= fcfg.meta_slice.start
    pad = ((0, n_batches * cfg.batch - x.shape[0]), (0, 0))
    xs, ys = jnp.asarray(np.pad(x, pad)), jnp.asarray(np.pad(y, pad))
    ws = jnp.asarray(np.pad(np.ones(x.shape[0], np.float32), pad[0]))

    def loss_fn(p, xb, yb, wb, k):
        k_drop, k_meta = jax.random.split(k)
        drop = jax.random.bernoulli(k_meta, cfg.meta_drop, (xb.shape[0], 1))
        xb = jnp.where(drop & is_meta, other, xb)
        logits = model.apply(p, xb, train=True, rngs={"dropout": k_drop})
        return jnp.sum(wb * optax.softmax_cross_entropy(logits, yb)) / jnp.sum(wb)

    @jax.jit
    def epoch(carry, xs, ys, ws):  # data as arguments, not baked-in constants
        def step(c, idx):
            p, s, k = c
            k, sub = jax.random.split(k)
            g = jax.grad(loss_fn)(p, xs[idx], ys[idx], ws[idx], sub)
            upd, s = opt.update(g, s, p)
            return (optax.apply_updates(p, upd), s, k), None

        k, sub = jax.random.split(carry[2])
        perm = jax.random.permutation(sub, xs.shape[0]).reshape(n_batches, -1)
        return jax.lax.scan(step, (carry[0], carry[1], k), perm)[0]

    carry = (params, opt.init(params), key)
    for _ in range(cfg.epochs):
        carry = epoch(carry, xs, ys, ws)
    return jax.tree.map(np.asarray, carry[0])


@dataclasses.dataclass
class Predictor:
    params: dict
    feature_config: FeatureConfig
    edges: tuple[int, ...]
    hidden: int
    class_quantiles: np.ndarray  # [K, Q] within-class length quantiles (training)
    quantile: float              # level of the predictive distribution used as L_hat
    train_median: float          # median training length: the trivial baseline
    info: dict                   # provenance: data files, seed, config, timings

    def predict(self, prompt_texts, input_sizes, datasets=None, categories=None,
                chunk: int = 1024, quantile: float | None = None):
        """Return (L_hat [N] float, u [N] float in [0, 1], probs [N, K]); L_hat is the
        ``quantile`` level of the predictive length mixture (None: ``self.quantile``)."""
        cols = [list(prompt_texts), np.asarray(input_sizes).reshape(-1)]
        cols += [[None] * len(cols[0]) if v is None else list(v)
                 for v in (datasets, categories)]
        parts = [self.predict_features(featurize(  # chunks bound the feature memory
            *(c[i:i + chunk] for c in cols), self.feature_config), quantile)
            for i in range(0, max(len(cols[0]), 1), chunk)]
        return tuple(np.concatenate(p) for p in zip(*parts))

    def predict_features(self, x, quantile: float | None = None):
        q = self.quantile if quantile is None else float(quantile)
        if not 0.0 < q < 1.0:
            raise ValueError(f"predictor quantile must be in (0, 1), got {q}")
        logits = LengthMLP(self.hidden, len(self.edges) - 1).apply(self.params, x)
        probs = np.asarray(jax.nn.softmax(logits), np.float64)
        ent = -np.sum(probs * np.log(np.clip(probs, 1e-12, None)), axis=1)
        u = np.clip(ent / np.log(probs.shape[1]), 0.0, 1.0)
        return em.mixture_quantile(probs, self.class_quantiles, q), u, probs

    def save(self, path) -> None:
        """Write params (msgpack) and JSON metadata to one file, atomically."""
        meta = {k: getattr(self, k) for k in
                ("edges", "hidden", "quantile", "train_median", "info")}
        meta.update(feature_config=self.feature_config.to_dict(),
                    class_quantiles=self.class_quantiles.tolist())
        write_bytes_atomic(path, serialization.msgpack_serialize({
            "format": FORMAT, "version": VERSION, "metadata": json.dumps(meta),
            "params": serialization.to_state_dict(self.params)}))

    @staticmethod
    def load(path) -> Predictor:
        """Read a file written by :meth:`save`; raise ModelFileError if bad."""
        try:
            raw = serialization.msgpack_restore(Path(path).read_bytes())
            if raw.get("format") != FORMAT or raw.get("version") != VERSION:
                raise ValueError("not a length-predictor file of this version")
            meta = json.loads(raw["metadata"])
            fcfg = FeatureConfig.from_dict(meta["feature_config"])
            edges, hidden = tuple(int(e) for e in meta["edges"]), int(meta["hidden"])
            ref = jax.eval_shape(LengthMLP(hidden, len(edges) - 1).init,
                                 jax.random.key(0), jnp.zeros((1, fcfg.n_features)))
            params = serialization.from_state_dict(ref, raw["params"])
            if jax.tree.map(np.shape, params) != jax.tree.map(np.shape, ref):
                raise ValueError("parameter shapes do not match the metadata")
            return Predictor(params, fcfg, edges, hidden,
                             np.asarray(meta["class_quantiles"], np.float64),
                             float(meta["quantile"]), float(meta["train_median"]),
                             dict(meta["info"]))
        except Exception as e:  # noqa: BLE001 - any failure means a bad model file
            raise ModelFileError(f"{path}: unreadable model file ({e})") from None


load = Predictor.load


def train(data_dir, *, seed: int = 0, epochs: int | None = None,
          split_glob: str = "*-validate.jsonl",
          config: TrainConfig | None = None) -> Predictor:
    """Fit on a held-in share, pick the L_hat quantile by MAE on the held-out
    prompts, then refit on every prompt of the split."""
    t0 = time.perf_counter()
    cfg = config or TrainConfig()
    cfg = cfg if epochs is None else dataclasses.replace(cfg, epochs=int(epochs))
    recs, fcfg = load_castillo(data_dir, split_glob), FeatureConfig()
    if (n := recs.n_prompts) < 2:
        raise DataError(f"{data_dir}: training needs at least 2 prompts")
    x = featurize(recs.prompt_texts, recs.input_sizes, recs.datasets,
                  recs.categories, fcfg)
    y = em.soft_labels(recs.lengths, recs.owner, n, EDGES)
    cq = em.class_quantile_table(recs.lengths, EDGES)
    n_hold = min(max(1, round(cfg.holdout * n)), n - 1)
    hold = np.random.default_rng(seed).permutation(n) < n_hold
    pred = Predictor(_fit(x[~hold], y[~hold], cfg, fcfg, seed), fcfg, EDGES,
                     cfg.hidden, cq, 0.5, float(np.median(recs.lengths)), {})
    probs = pred.predict_features(x[hold])[2]
    m = hold[recs.owner]
    row = np.searchsorted(np.flatnonzero(hold), recs.owner[m])
    maes = {q: float(np.mean(np.abs(em.mixture_quantile(probs, cq, q)[row]
                                    - recs.lengths[m]))) for q in _QUANTILES}
    pred.quantile = min(maes, key=maes.get)
    pred.params = _fit(x, y, cfg, fcfg, seed)
    pred.info = {"data_dir": str(data_dir), "split_glob": split_glob, "seed": seed,
                 "files": [Path(f).name for f in recs.files], "n_prompts": n,
                 "train_config": dataclasses.asdict(cfg), "holdout_mae": maes,
                 "train_seconds": round(time.perf_counter() - t0, 2)}
    return pred


def evaluate(predictor: Predictor, data_dir, split_glob: str = "*-test.jsonl"):
    """Score against every realised length of a split (see error_model.score)."""
    recs = load_castillo(data_dir, split_glob)
    l_hat, u, probs = predictor.predict(recs.prompt_texts, recs.input_sizes,
                                        recs.datasets, recs.categories)
    return em.score(l_hat, u, probs, recs, predictor.edges, predictor.train_median)


def _summary(r: dict) -> str:
    keys = ("mae", "accuracy", "fit_rate")
    rows = [("all", r, r["baseline"])] + [(k, v, {m: v[f"baseline_{m}"] for m in keys})
                                          for k, v in r["per_dataset"].items()]
    return "\n".join([f"{k:<13} " + "  ".join(f"{m} {v[m]:.3f} (baseline {b[m]:.3f})"
                       for m in keys) for k, v, b in rows] + [
        f"spearman(u, |log L/L_hat|) {r['calibration']['spearman']:.3f}"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner.workloads.predictor")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train on DIR/*-validate.jsonl, write FILE")
    e = sub.add_parser("evaluate", help="score FILE on DIR/*-test.jsonl")
    m = sub.add_parser("error-model", help="fit the error model (what the simulator "
                       "draws predictions from) on DIR, write its JSON to FILE")
    m.add_argument("--data", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--model", help="a trained predictor (default: train one on DIR)")
    m.add_argument("--seed", type=int, default=0)
    for p, names in ((t, ("--data", "--out")), (e, ("--model", "--data"))):
        for name in names:
            p.add_argument(name, required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--epochs", type=int)
    e.add_argument("--split", default="*-test.jsonl")
    e.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "train":
            if args.epochs is not None and args.epochs < 1:
                raise DataError(f"--epochs: must be >= 1, got {args.epochs}")
            pred = train(args.data, seed=args.seed, epochs=args.epochs)
            pred.save(args.out)
            print(f"wrote {args.out}: {pred.info['n_prompts']} prompts, quantile "
                  f"{pred.quantile}, {pred.info['train_seconds']} s")
        elif args.cmd == "error-model":
            model = load(args.model) if args.model else train(args.data, seed=args.seed)
            text = em.fit_error_model(model, args.data, seed=args.seed).to_json()
            write_text_atomic(args.out, text)
            print(f"wrote {args.out} ({len(text)} bytes)")
        else:
            res = evaluate(load(args.model), args.data, args.split)
            print(json.dumps(res, indent=2) if args.json else _summary(res))
    except (DataError, ModelFileError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
