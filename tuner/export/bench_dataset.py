"""The scenario's requests as a dataset file that vLLM's serving benchmark replays.

:func:`write_dataset` writes the requests the simulation replayed (its valid rows, in
arrival order) in one of three formats :data:`FORMATS` that ``vllm bench serve`` reads
with per-request prompt and output lengths; :func:`bench_command` is the client command
that sends them, saving the result file ``tuner.calibrate --measured`` reads.

Formats, as vLLM's dataset loaders read them (vllm-project/vllm
``vllm/benchmarks/datasets.py`` @ f2e97ddaf590: ``CustomDataset`` with per-request
``output_tokens``, ``BurstGPTDataset``, ``add_dataset_parser``'s flags and
``get_samples``; ``benchmarks/benchmark_dataset.py`` @ 9f13aff21ff4: the
``BurstGPTDataset`` of the old ``benchmarks/benchmark_serving.py``):

- ``custom`` (the default): JSON lines ``{"prompt": TEXT, "output_tokens": N}``.
  ``CustomDataset.sample`` takes ``output_tokens`` as the request's output length when
  ``--custom-output-len -1`` (vLLM PR #31881, merged January 2026). An older vLLM reads
  no ``output_tokens`` and asks for ``max_tokens`` -1, which the server rejects: the
  run fails instead of measuring other lengths. ``--skip-chat-template`` sends the text
  as it is, ``--disable-shuffle`` keeps the file's (arrival) order, ``--no-oversample``
  sends each request once. The client records each prompt's length as the model's
  tokenizer counts it (``len(tokenizer(prompt).input_ids)``, BOS included), so the
  result file holds the true prompt lengths whatever the text below comes to.
- ``timed_trace`` (vLLM >= 0.23, ``--dataset-name timed_trace``; its flags as in
  vLLM's ``vllm bench serve`` reference page, docs.vllm.ai/en/latest/cli/bench/serve/):
  Mooncake-style JSON lines ``{"timestamp": S, "input_length": P, "output_length": N,
  "hash_ids": [...]}``; ``--self-timed`` (its default for this dataset) sends each
  request at its own timestamp, the only way found to replay the simulated arrivals
  exactly, and vLLM makes prompts of the given token length with the model's tokenizer
  (vLLM PR #39795). ``hash_ids`` name the prompt's ``--timed-trace-chunk-hash-size``
  -token chunks (equal ids, equal tokens): every chunk gets its own id, so no two
  prompts share a prefix. Its loader's source was not available to read: how it counts
  the BOS and checks the fields is known only as far as its flag descriptions and the
  PR say.
- ``burstgpt`` (the old ``benchmarks/benchmark_serving.py`` since vLLM 0.8, and every
  ``vllm bench serve``): a CSV with BurstGPT's columns; ``BurstGPTDataset`` keeps rows
  whose ``Model`` is ``GPT-4`` and takes ``Request tokens``/``Response tokens`` (the
  3rd and 4th columns) as the lengths, making each prompt of that many consecutive
  token ids, decoded. The server re-tokenises that text, which can change its length
  (vLLM's own random dataset re-encodes for that reason), and the client records the
  file's count; it samples the rows in a seeded random order, not the file's.

Prompt text (``custom``): we have no tokenizer here. A prompt is ``the`` followed by
words drawn (seeded) from :data:`WORDS`, 145 common lower-case English words, each one
token with or without a leading space in the ``cl100k_base`` vocabulary (which
Llama-3's extends, same pre-tokenizer) and in Qwen's (checked with tiktoken on both
vocabularies: N words encode to exactly N tokens for N up to 8,000); assumed, not
checked, for Llama-2's SentencePiece and OPT's GPT-2 BPE. Random words make every
prompt's first KV block different, so prefix caching finds no shared prefix.

Lengths: every format encodes a prompt's *content*, the simulated prompt tokens less
the BOS token the server's tokenizer adds (:func:`bos_tokens`: 1 for Llama, DeepSeek
and OPT models, 0 for Qwen's), and at least one token; the server then prefills the
simulated count. Outputs are exact: the bench's ``--ignore-eos`` makes the server
generate ``max_tokens`` = the request's output length. Arrivals: ``custom`` and
``burstgpt`` leave them to the client's ``--request-rate R --burstiness B`` (gamma gaps
of mean 1/R and CV 1/sqrt(B), B = 1: Poisson); upstream vLLM has no replay of given
timestamps for them.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tuner.common.atomic import write_text_atomic

__all__ = ["FORMATS", "WORDS", "Format", "Requests", "bench_command", "bos_tokens",
           "burstiness", "compare_lengths", "hf_model_id", "length_stats",
           "prompt_texts", "read_dataset", "requests", "write_dataset"]

# 145 words, each one token with or without a leading space in cl100k_base and Qwen's
# vocabulary (see the module docstring); a prompt starts with WORDS[0]
WORDS = tuple("""
the of and to in is that for it as with was on be at by this had not are but from or
have an they which one you were her all she there would their we him been has when who
will more no if out so said what up its about into than them can only other new some
could time these two may then do first any my now such like our over man me even most
made after also did many before must through back years where much your way well down
should because each just those people how too little state good very make world still
own see men work long get here between both life being under never day same another
know while last might us great old year off come since against go came right used take
three
""".split())
TIMED_TRACE_CHUNK = 16  # tokens per hash id; vLLM's default, its KV block size too
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens",
                    "Total tokens", "Log Type")
# the tokenizers of these Hugging Face organisations' models add one BOS token to a
# completion prompt (Llama-2/3 <s>/<|begin_of_text|>, DeepSeek-R1-Distill's
# <｜begin▁of▁sentence｜>, OPT's </s>); Qwen's add none
_BOS = (("Qwen/", 0), ("meta-llama/", 1), ("deepseek-ai/", 1), ("facebook/opt", 1),
        ("mistralai/", 1))
_PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Format:
    """One dataset format: vLLM's ``--dataset-name``, the file's suffix after the
    policy's stem, the bench flags it needs besides ``--dataset-name/-path``, which
    vLLM reads it so, and whether the client replays the arrivals or draws them."""
    name: str
    suffix: str
    flags: tuple
    requires: str
    arrivals: str  # "replayed" or "drawn"


FORMATS = {
    "custom": Format("custom", ".dataset.jsonl",
                     ("--custom-output-len", "-1", "--skip-chat-template",
                      "--disable-shuffle", "--no-oversample"),
                     "vllm bench serve with per-request output_tokens in custom "
                     "datasets (vLLM PR #31881, January 2026: --help shows "
                     "'Unless it is set to -1' under --custom-output-len)", "drawn"),
    "timed_trace": Format("timed_trace", ".trace.jsonl",
                          ("--self-timed", "--timed-trace-sec-multiplier", "1",
                           "--timed-trace-chunk-hash-size", str(TIMED_TRACE_CHUNK),
                           "--no-oversample"),
                          "vllm bench serve >= 0.23 (--dataset-name timed_trace)",
                          "replayed"),
    "burstgpt": Format("burstgpt", ".burstgpt.csv", (),
                       "any vllm bench serve (vLLM >= 0.10), or vLLM 0.8-0.9's "
                       "python benchmarks/benchmark_serving.py with the same flags",
                       "drawn"),
}


class Requests(NamedTuple):
    """The scenario's valid requests in arrival order (NumPy arrays)."""
    prompt_tokens: np.ndarray  # [n] int64
    output_tokens: np.ndarray  # [n] int64
    arrival_s: np.ndarray      # [n] float64, seconds from the first arrival


def requests(sc) -> Requests:
    """The requests the simulation of ``sc`` replayed: its workload's valid rows,
    sorted by arrival (stable), arrivals shifted to start at 0."""
    wl = sc.workload
    valid = np.asarray(wl.valid, bool)
    t = np.asarray(wl.arrival_s, np.float64)[valid]
    order = np.argsort(t, kind="stable")
    p = np.asarray(wl.prompt_tokens, np.int64)[valid][order]
    o = np.asarray(wl.output_tokens, np.int64)[valid][order]
    t = t[order]
    if len(t) == 0:
        raise ValueError("the scenario has no valid requests")
    return Requests(p, o, t - t[0])


def hf_model_id(model) -> str:
    """The Hugging Face repository a model preset's numbers come from (its sources
    name ``huggingface.co/ORG/NAME``), the checkpoint folder of a model read from its
    ``config.json`` (what ``vllm serve`` takes), else the preset name."""
    if getattr(model, "config_path", None):  # tuner.scenario.model_config's models
        return str(Path(model.config_path).parent)
    for _, text in getattr(model, "sources", ()):
        m = re.search(r"huggingface\.co/([\w.-]+/[\w.-]+)", text)
        if m:
            return m.group(1)
    return model.name


def bos_tokens(model_id: str) -> int:
    """Special tokens the model's tokenizer adds to a completion prompt (its BOS): 0
    for Qwen's models, 1 for Llama, DeepSeek, OPT and Mistral ones, else 1 (assumed)."""
    for prefix, n in _BOS:
        if model_id.startswith(prefix):
            return n
    return 1


def _bos(sc, bos):
    return bos_tokens(hf_model_id(sc.deployment.model)) if bos is None else int(bos)


def content_tokens(prompt_tokens, bos: int) -> np.ndarray:
    """Prompt tokens a file encodes: the simulated count less the BOS, at least 1."""
    return np.maximum(np.asarray(prompt_tokens, np.int64) - int(bos), 1)


def prompt_texts(n_words, seed: int = 0) -> list[str]:
    """One text of ``n`` words (``n >= 1``) per entry of ``n_words``: ``the`` and then
    words drawn from :data:`WORDS` with ``numpy.random.default_rng(seed)``."""
    n = np.asarray(n_words, np.int64)
    if n.size and n.min() < 1:
        raise ValueError("every prompt needs at least one word")
    rng = np.random.default_rng(seed)
    words = np.asarray(WORDS)
    drawn = words[rng.integers(0, len(WORDS), int(n.sum() - n.size))]
    ends = np.cumsum(n - 1)
    return [" ".join((WORDS[0], *drawn[e - k:e])) for e, k in zip(ends, n - 1)]


def _custom(req, bos, seed) -> str:
    texts = prompt_texts(content_tokens(req.prompt_tokens, bos), seed)
    return "".join(json.dumps({"prompt": s, "output_tokens": int(o)}) + "\n"
                   for s, o in zip(texts, req.output_tokens))


def _timed_trace(req, bos, seed) -> str:
    lines, next_id = [], 0
    for t, p, o in zip(req.arrival_s, content_tokens(req.prompt_tokens, bos),
                       req.output_tokens):
        k = -(-int(p) // TIMED_TRACE_CHUNK)
        lines.append(json.dumps({"timestamp": round(float(t), 6), "input_length": int(p),
                                 "output_length": int(o),
                                 "hash_ids": list(range(next_id, next_id + k))}))
        next_id += k
    return "\n".join(lines) + "\n"


def _burstgpt(req, bos, seed) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(BURSTGPT_COLUMNS)
    for t, p, o in zip(req.arrival_s, content_tokens(req.prompt_tokens, bos),
                       req.output_tokens):
        w.writerow([f"{float(t):.6f}", "GPT-4", int(p), int(o), int(p + o),
                    "Conversation log"])
    return buf.getvalue()


_WRITERS = {"custom": _custom, "timed_trace": _timed_trace, "burstgpt": _burstgpt}


def _format(fmt: str) -> Format:
    if fmt not in FORMATS:
        raise ValueError(f"unknown dataset format {fmt!r}; known: {', '.join(FORMATS)}")
    return FORMATS[fmt]


def write_dataset(sc, path, fmt: str = "custom", *, bos: int | None = None,
                  seed: int | None = None) -> Path:
    """Write the requests of ``sc`` (:func:`requests`) to ``path`` in format ``fmt``
    (a key of :data:`FORMATS`), atomically. ``bos``: the BOS tokens the server adds
    (default :func:`bos_tokens` of the model); ``seed``: of the prompt words (default
    the scenario's seed). Returns the path."""
    _format(fmt)
    req = requests(sc)
    seed = int(sc.spec.seed) if seed is None else int(seed)
    return write_text_atomic(path, _WRITERS[fmt](req, _bos(sc, bos), seed))


def read_dataset(path, fmt: str | None = None) -> dict:
    """A dataset file back as ``{"format", "prompt_tokens", "output_tokens",
    "arrival_s"}`` (arrays, file order): the prompt's content tokens (``custom``: its
    word count), the output tokens, and the arrivals where the file has them (else
    None). ``fmt`` defaults to what the file holds."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if fmt is None:
        fmt = "burstgpt" if text.startswith(BURSTGPT_COLUMNS[0] + ",") else (
            "custom" if '"prompt"' in text.split("\n", 1)[0] else "timed_trace")
    _format(fmt)
    if fmt == "burstgpt":
        rows = [r for r in csv.DictReader(io.StringIO(text)) if r["Model"] == "GPT-4"]
        p = [int(r["Request tokens"]) for r in rows]
        o = [int(r["Response tokens"]) for r in rows]
        t = [float(r["Timestamp"]) for r in rows]
    else:
        recs = [json.loads(line) for line in text.splitlines() if line.strip()]
        if fmt == "custom":
            p = [len(r["prompt"].split()) for r in recs]
            o = [int(r["output_tokens"]) for r in recs]
            t = None
        else:
            p = [int(r["input_length"]) for r in recs]
            o = [int(r["output_length"]) for r in recs]
            t = [float(r["timestamp"]) for r in recs]
    return {"format": fmt, "prompt_tokens": np.asarray(p, np.int64),
            "output_tokens": np.asarray(o, np.int64),
            "arrival_s": None if t is None else np.asarray(t, np.float64)}


def length_stats(x) -> dict:
    """``{"p50", "p90", "p99", "mean", "max"}`` of token counts (NumPy's linear
    percentiles)."""
    x = np.asarray(x, np.float64)
    out = {f"p{q}": float(np.percentile(x, q)) for q in _PERCENTILES}
    out.update(mean=float(x.mean()), max=float(x.max()))
    return out


def compare_lengths(prompt, output, dataset_prompt, dataset_output) -> dict:
    """Simulated vs dataset lengths per request, both in the server's tokens:
    ``{"prompt_tokens": {"simulated": stats, "dataset": stats}, "output_tokens": ...,
    "requests", "prompt_differs", "prompt_max_abs_error", "output_differs"}``."""
    p, o = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
    dp, do = np.asarray(dataset_prompt, np.int64), np.asarray(dataset_output, np.int64)
    if not p.shape == o.shape == dp.shape == do.shape:
        raise ValueError("lengths of different request counts")
    return {"requests": int(p.size),
            "prompt_tokens": {"simulated": length_stats(p), "dataset": length_stats(dp)},
            "output_tokens": {"simulated": length_stats(o), "dataset": length_stats(do)},
            "prompt_differs": int(np.sum(p != dp)),
            "prompt_max_abs_error": int(np.max(np.abs(p - dp))),
            "output_differs": int(np.sum(o != do))}


def burstiness(arrival_s) -> dict:
    """vLLM's ``--burstiness`` matching the inter-arrival CV of ``arrival_s``: its gaps
    are gamma with shape B (CV 1/sqrt(B)), so B = 1/CV^2, rounded to 3 digits and kept
    in [0.01, 100]. ``{"burstiness", "interarrival_cv"}``."""
    gaps = np.diff(np.sort(np.asarray(arrival_s, np.float64)))
    cv = float(gaps.std() / gaps.mean()) if gaps.size and gaps.mean() > 0 else 1.0
    b = 100.0 if cv < 0.1 else min(max(1.0 / cv ** 2, 0.01), 100.0)
    return {"burstiness": float(f"{b:.3g}"), "interarrival_cv": round(cv, 4)}


def bench_command(fmt: str, *, model: str, dataset_path, num_prompts: int,
                  request_rate: float, burstiness: float, seed: int, result_path,
                  host: str = "127.0.0.1", port: int = 8000) -> str:
    """The ``vllm bench serve`` command line sending a dataset file of format ``fmt``
    to a server at ``host:port`` (completions endpoint) and saving the result with
    every request's lengths and latencies to ``result_path``."""
    f = _format(fmt)
    cmd = ["vllm", "bench", "serve", "--backend", "vllm", "--host", host,
           "--port", str(int(port)), "--endpoint", "/v1/completions", "--model", model,
           "--dataset-name", f.name, "--dataset-path", str(dataset_path), *f.flags,
           "--num-prompts", str(int(num_prompts)), "--ignore-eos"]
    if f.arrivals == "drawn":
        cmd += ["--request-rate", f"{float(request_rate):.6g}",
                "--burstiness", f"{float(burstiness):.3g}"]
    cmd += ["--seed", str(int(seed)), "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,90,99", "--save-result", "--save-detailed",
            "--result-filename", str(result_path)]
    return shlex.join(cmd)

