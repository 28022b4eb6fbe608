"""Named workloads: the built-in default and presets for the shared real traces.

The default workload is synthetic but fitted to the Azure LLM conversation trace
(``experiments/make_default_workload.py`` writes ``tuner/workloads/data/default_workload.json``):
token lengths by inverse-CDF sampling between its 101 stored percentiles, tied together
by a Gaussian copula with the trace's rank correlation, and Gamma arrivals with its
mean rate and inter-arrival CV. It needs no trace files.

The other presets name files under the shared traces directory: ``$KVTUNE_TRACES``
when set, else ``<repo root>/../shared/traces``. The files are read in place, never
copied into the repository.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from tuner.workloads.arrivals import gamma
from tuner.workloads.traces import Trace, load_trace

__all__ = ["DEFAULT_TABLE", "PRESETS", "SCHEMA_VERSION", "default_trace",
           "fixed_trace", "list_presets", "load_table", "resolve_trace", "traces_dir"]

SCHEMA_VERSION = 1
DEFAULT_TABLE = Path(__file__).resolve().parent / "data" / "default_workload.json"

# name -> (path under the traces directory or None for built-in, glob, description)
PRESETS: dict[str, tuple[str | None, str | None, str]] = {
    "default": (None, None, "synthetic, fitted to the Azure conversation trace"),
    "azure-conv": ("azure-llm-2023-conv.csv", None,
                   "Azure LLM inference 2023, conversation: 1 h of real arrivals"),
    "mooncake": ("mooncake-conversation.jsonl", None,
                 "Mooncake conversation: bursty arrivals, long prompts"),
    "sharegpt": ("sharegpt-8k-lengths.csv", None, "ShareGPT chat lengths, no times"),
    "arxiv": ("arxiv-summarization-lengths.csv", None,
              "arXiv summarisation lengths (long prompts), no times"),
    "castillo-alpaca": ("castillo-qwen2.5-7b/alpaca-test.jsonl", None,
                        "CASTILLO Alpaca test prompts, Qwen2.5-7B output lengths"),
    "castillo": ("castillo-qwen2.5-7b", "*-test.jsonl",
                 "CASTILLO test split, all seven datasets, Qwen2.5-7B"),
}
_TABLE_KEYS = {"schema_version", "source", "licence", "generated_by", "input",
               "input_sha256", "rows", "duration_s", "rate_rps", "interarrival_cv",
               "spearman_prompt_output", "percentiles", "prompt_tokens",
               "output_tokens"}


def traces_dir() -> Path:
    """The shared traces directory: ``$KVTUNE_TRACES``, else beside the repo."""
    env = os.environ.get("KVTUNE_TRACES")
    root = Path(__file__).resolve().parents[2]
    return Path(env) if env else root.parent / "shared" / "traces"


def fixed_trace(spec: str) -> Trace:
    """``fixed:<prompt>:<output>[:<n>]``: ``n`` (default 1000) requests of fixed
    lengths and no arrival times (the eLLM paper's synthetic 2k-2k and 32k-2k
    workloads; arrivals are drawn at ``--rate``)."""
    parts = spec.split(":")[1:]
    try:
        vals = [int(x) for x in parts]
    except ValueError:
        vals = []
    if len(vals) not in (2, 3) or min(vals) < 1:
        raise ValueError(f"trace {spec!r}: expected fixed:<prompt tokens>:<output tokens>"
                         "[:<requests>] with integers >= 1")
    n = vals[2] if len(vals) == 3 else 1000
    return Trace(arrival_s=None, prompt_tokens=np.full(n, vals[0], np.int64),
                 output_tokens=np.full(n, vals[1], np.int64), source=spec,
                 format="fixed")


def list_presets() -> list[str]:
    """Preset names, ``default`` first."""
    return list(PRESETS)


def load_table(path: Path | str = DEFAULT_TABLE) -> dict:
    """The default-workload table, checked: known fields only, 101 non-decreasing
    percentiles per length, a correlation in [-1, 1], a positive rate and CV."""
    table = json.loads(Path(path).read_text(encoding="utf-8"))
    keys = set(table) if isinstance(table, dict) else set()
    if keys != _TABLE_KEYS or table["schema_version"] != SCHEMA_VERSION:
        raise ValueError(f"{path}: expected schema {SCHEMA_VERSION} with fields "
                         f"{sorted(_TABLE_KEYS)}; missing {sorted(_TABLE_KEYS - keys)}"
                         f", unknown {sorted(keys - _TABLE_KEYS)}")
    for name in ("prompt_tokens", "output_tokens"):
        q = np.asarray(table[name], dtype=np.float64)
        if q.shape != (101,) or np.any(np.diff(q) < 0) or q[0] < 1:
            raise ValueError(f"{path}: field {name!r}: need 101 non-decreasing "
                             "percentiles >= 1")
    if not (-1 <= table["spearman_prompt_output"] <= 1 and table["rate_rps"] > 0
            and table["interarrival_cv"] > 0):
        raise ValueError(f"{path}: correlation, rate or CV out of range")
    return table


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf, otypes=[float])(z / math.sqrt(2.0)))


def default_trace(n: int = 2000, seed: int = 0, rate: float | None = None,
                  *, table: dict | None = None) -> Trace:
    """``n`` synthetic requests shaped like the Azure conversation trace.

    Lengths: a Gaussian copula with Pearson correlation ``2 sin(pi rho_s / 6)`` (the
    value whose Spearman correlation is the stored ``rho_s``), mapped through each
    length's inverse CDF by linear interpolation between the stored percentiles and
    rounded to whole tokens. Arrivals: Gamma gaps with the stored CV and mean rate,
    or ``rate`` req/s when given.
    """
    table = load_table() if table is None else table
    length_seed, arrival_seed = np.random.SeedSequence(seed).spawn(2)
    arrival = gamma(n, table["rate_rps"] if rate is None else rate,
                    table["interarrival_cv"], arrival_seed)  # also checks n, rate
    rho = 2.0 * math.sin(math.pi * table["spearman_prompt_output"] / 6.0)
    z = np.random.default_rng(length_seed).standard_normal((2, n))
    z[1] = rho * z[0] + math.sqrt(1.0 - rho**2) * z[1]
    u = _normal_cdf(z) * 100.0  # copula draws as percentile ranks in [0, 100]

    prompt, output = (np.maximum(1, np.rint(np.interp(row, table["percentiles"],
                                                      table[name])))
                      for row, name in zip(u, ("prompt_tokens", "output_tokens")))
    return Trace(arrival, prompt, output, source=str(DEFAULT_TABLE), format="default")


def resolve_trace(spec, *, seed: int = 0, n: int | None = None,
                  sample: int = 0) -> Trace:
    """A preset name or a path (file, CASTILLO directory or glob) as a trace.

    ``n`` limits the result to its first ``n`` requests (by arrival, or in file order)
    and sets the size of ``default`` (2000 without it). ``seed`` only affects
    ``default``; ``sample`` picks the CASTILLO generation used as output length.
    """
    if n is not None and (isinstance(n, bool) or int(n) != n or n < 1):
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    spec = str(spec)
    if spec == "default":
        return default_trace(2000 if n is None else int(n), seed)
    if spec.startswith("fixed:"):
        trace = fixed_trace(spec)
    elif spec in PRESETS:
        rel, pattern, _ = PRESETS[spec]
        trace = load_trace(traces_dir() / rel, sample=sample,
                           **({"pattern": pattern} if pattern else {}))
    elif Path(spec).exists() or any(c in Path(spec).name for c in "*?["):
        trace = load_trace(spec, sample=sample)
    else:
        raise ValueError(f"unknown trace {spec!r}: not an existing path nor a preset "
                         f"({', '.join(list_presets())})")
    return trace if n is None or n >= len(trace) else trace.take(np.arange(n))
