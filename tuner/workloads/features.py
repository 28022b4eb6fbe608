"""Cheap, deterministic prompt features for the generation-length predictor.

Features come from the request side only (prompt text, prompt length, dataset and
category tags); realised output lengths are never an input. The layout of one row is

    [ D hashed unigram+bigram buckets | 2 length features | dataset | category ]

Hashing uses ``zlib.crc32`` (stable across processes, unlike ``hash()``). The hashed
block holds ``log1p(count)`` per bucket, L2-normalised per prompt.

The validated CASTILLO JSONL reader lives here too, shared by the predictor, the error
model and the tests; it returns realised outputs apart from the fields
:func:`featurize` consumes.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import zlib
from pathlib import Path

import numpy as np

__all__ = [
    "CATEGORY_VOCAB",
    "DATASET_VOCAB",
    "DataError",
    "FeatureConfig",
    "PromptRecords",
    "featurize",
    "load_castillo",
    "tokenize",
]

DATASET_VOCAB = (
    "Alpaca", "Apps", "BigCodeBench", "DollyDataset", "DS1000", "Mbpp", "ShareGPT",
    "other",
)
CATEGORY_VOCAB = (
    "undefined", "open_qa", "general_qa", "classification", "closed_qa",
    "brainstorming", "information_extraction", "summarization", "creative_writing",
    "other",
)
_ALIASES = {"dolly": "DollyDataset"}
_TOKEN_RE = re.compile(r"[a-z0-9_]+|[^\sa-z0-9_]")
_MAX_TOKENS = 4096  # tokens hashed per prompt; the rest only count towards length


class DataError(ValueError):
    """Bad input data; the message names the file, line and field."""


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    hash_dim: int = 2**14
    dataset_vocab: tuple[str, ...] = DATASET_VOCAB
    category_vocab: tuple[str, ...] = CATEGORY_VOCAB
    version: int = 1

    @property
    def n_features(self) -> int:
        return self.hash_dim + 2 + len(self.dataset_vocab) + len(self.category_vocab)

    @property
    def meta_slice(self) -> slice:
        """Columns of the dataset and category one-hots."""
        return slice(self.hash_dim + 2, self.n_features)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> FeatureConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        if set(d) != names:
            raise ValueError(f"feature config keys {sorted(d)} != {sorted(names)}")
        return cls(
            hash_dim=int(d["hash_dim"]),
            dataset_vocab=tuple(d["dataset_vocab"]),
            category_vocab=tuple(d["category_vocab"]),
            version=int(d["version"]),
        )


def tokenize(text: str) -> list[str]:
    """Lowercase regex tokens: runs of [a-z0-9_] and single other non-space chars."""
    return _TOKEN_RE.findall(text.lower())


def _bucket(s: str, dim: int, cache: dict[str, int]) -> int:
    b = cache.get(s)
    if b is None:
        b = cache[s] = zlib.crc32(s.encode("utf-8")) % dim
    return b


def _onehot_index(value, vocab: tuple[str, ...]) -> int:
    if value is None:
        return vocab.index("other")
    lower = {v.lower(): i for i, v in enumerate(vocab)}
    name = _ALIASES.get(str(value).lower(), str(value)).lower()
    return lower.get(name, vocab.index("other"))


def featurize(
    prompt_texts, input_sizes, datasets=None, categories=None,
    config: FeatureConfig = FeatureConfig(),
) -> np.ndarray:
    """Feature matrix [N, config.n_features] float32 from request-side fields only."""
    texts = list(prompt_texts)
    n = len(texts)
    sizes = np.asarray(input_sizes, dtype=np.float64).reshape(-1)
    if sizes.shape[0] != n:
        raise ValueError(f"input_sizes has {sizes.shape[0]} rows, texts {n}")
    datasets = [None] * n if datasets is None else list(datasets)
    categories = [None] * n if categories is None else list(categories)
    if len(datasets) != n or len(categories) != n:
        raise ValueError("datasets/categories must match prompt_texts in length")
    dim = config.hash_dim
    x = np.zeros((n, config.n_features), np.float32)
    cache: dict[str, int] = {}
    for i, text in enumerate(texts):
        toks = tokenize(text)
        kept = toks[:_MAX_TOKENS]
        keys = ["u " + t for t in kept]
        keys += ["b " + a + " " + b for a, b in itertools.pairwise(kept)]
        idx = np.fromiter((_bucket(k, dim, cache) for k in keys), np.int64, len(keys))
        counts = np.bincount(idx, minlength=dim).astype(np.float32)
        row = np.log1p(counts)
        norm = float(np.sqrt(np.sum(row * row)))
        x[i, :dim] = row / norm if norm > 0 else row
        x[i, dim] = np.log1p(max(sizes[i], 0.0)) / 8.0
        x[i, dim + 1] = np.log1p(len(toks)) / 8.0
    off = dim + 2
    nd = len(config.dataset_vocab)
    for i in range(n):
        x[i, off + _onehot_index(datasets[i], config.dataset_vocab)] = 1.0
        x[i, off + nd + _onehot_index(categories[i], config.category_vocab)] = 1.0
    return x


@dataclasses.dataclass
class PromptRecords:
    """Prompts from CASTILLO-format JSONL; outputs are ragged (flat + owner index)."""

    prompt_texts: list[str]
    input_sizes: np.ndarray     # [N] int64
    datasets: list[str]
    categories: list[str | None]
    lengths: np.ndarray         # [S] int64 realised output lengths, all prompts
    owner: np.ndarray           # [S] int64 prompt index of each realised length
    files: list[str]

    @property
    def n_prompts(self) -> int:
        return len(self.prompt_texts)


def _field(rec: dict, name: str, where: str):
    if name not in rec:
        raise DataError(f"{where}: missing field '{name}'")
    return rec[name]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_line(line: str, where: str):
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: malformed JSON ({e.msg})") from None
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object")
    text = _field(rec, "prompt_text", where)
    if not isinstance(text, str):
        raise DataError(f"{where}: field 'prompt_text' must be a string")
    size = _field(rec, "input_size", where)
    if not _is_int(size) or size < 0:
        raise DataError(f"{where}: field 'input_size' must be an int >= 0")
    outs = _field(rec, "output_sizes", where)
    if not isinstance(outs, list) or not outs or not all(_is_int(v) for v in outs):
        raise DataError(f"{where}: field 'output_sizes' must be a non-empty int list")
    if min(outs) < 0:
        raise DataError(f"{where}: field 'output_sizes' has a negative length")
    dataset = _field(rec, "dataset", where)
    if not isinstance(dataset, str):
        raise DataError(f"{where}: field 'dataset' must be a string")
    category = rec.get("category")
    return text, size, dataset, category if isinstance(category, str) else None, outs


def load_castillo(data_dir, split_glob: str = "*-validate.jsonl") -> PromptRecords:
    """Read every ``split_glob`` file under ``data_dir``; raise DataError when bad."""
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"{root}: not a directory")
    files = sorted(root.glob(split_glob))
    if not files:
        raise DataError(f"{root}: no files match '{split_glob}'")
    texts, sizes, dsets, cats, lengths, owner = [], [], [], [], [], []
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"{path}: unreadable ({e})") from None
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            text, size, ds, cat, outs = _parse_line(line, f"{path}:{lineno}")
            owner.extend([len(texts)] * len(outs))
            lengths.extend(outs)
            texts.append(text)
            sizes.append(size)
            dsets.append(ds)
            cats.append(cat)
    if not texts:
        raise DataError(f"{root}: files matching '{split_glob}' hold no records")
    return PromptRecords(
        texts, np.asarray(sizes, np.int64), dsets, cats,
        np.asarray(lengths, np.int64), np.asarray(owner, np.int64),
        [str(f) for f in files],
    )
