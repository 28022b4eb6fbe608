"""Serving-benchmark result files as traces, with what the benchmark measured.

Two clients' files are read, told apart by content:

- vLLM's serving benchmark (``benchmarks/benchmark_serving.py``, now ``vllm bench
  serve``) with ``--save-result --save-detailed``: one JSON object (``--append-result``:
  one per line). Field names as written by vllm-project/vllm
  ``benchmarks/benchmark_serving.py`` @ 0049e29c (``benchmark()``'s result dict,
  ``main()``) and ``vllm/benchmarks/serve.py`` @ 009e6d4a: per request ``input_lens``,
  ``output_lens`` (0 for a failed request), ``ttfts`` (s), ``itls`` (a list of s per
  request), ``generated_texts``, ``errors`` ('' when it succeeded), and in serve.py also
  ``latencies`` (s) and ``start_times`` (s, ``time.perf_counter``); per run
  ``request_rate`` (a number or ``"inf"``), ``burstiness``, ``model_id`` and the summary
  ``{mean,median,std}_{ttft,tpot,itl,e2el}_ms`` plus ``p{N}_..._ms`` for each
  ``--metric-percentiles``. The seed is not written (``--seed``, default 0).
- SGLang's ``python -m sglang.bench_serving --output-file X.jsonl --output-details``:
  one JSON line appended per run. Names as written by sgl-project/sglang
  ``python/sglang/bench_serving.py`` @ 0033168f (``benchmark()``'s ``result`` and
  ``result_details``): the same six per-request arrays as vLLM's first list, the summary
  ``{mean,median,std,p99}_{ttft,tpot}_ms``, ``..._itl_ms`` with ``p95`` and ``max``,
  ``{mean,median,std,p99}_e2e_latency_ms``; no seed, no burstiness (its gaps are
  exponential), no model.

Arrivals: ``request_timestamps`` (send times, s; written by patched clients such as the
one behind ``../shared/reference/vllm-bench``), else ``start_times``, else re-drawn as
the client draws them (vLLM's ``get_request``: gaps ``np.random.gamma(shape=burstiness,
scale=1 / (request_rate * burstiness))``, mean ``1 / rate``, the first request at 0, all
at 0 for rate ``inf``) with :func:`tuner.workloads.arrivals.gamma`, seeded from the
file's ``seed`` (or the ``--seed`` of the manifest's client command, else 0). The client
drew from NumPy's global legacy generator after sampling its dataset, so the times are
not the run's own: a warning says so. (``vllm bench serve`` also rescales its delays so
the last is ``N / rate``; that is not done here.)

TPOT per request is vLLM's and SGLang's definition, ``(latency - ttft) / (output_len -
1)`` for ``output_len > 1`` (NaN otherwise, as both leave those out of the TPOT
percentiles), with the latency from ``latencies`` or else ``ttft + sum(itls)``.

Bad input raises :class:`tuner.workloads.traces.TraceError` naming the file, the JSONL
line (``-`` for a JSON document) and the field. Requests the file marks as failed
(non-empty ``errors``) and requests with 0 output tokens are dropped, with their
measurements, and a warning says how many.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.workloads.arrivals import gamma
from tuner.workloads.trace_data import Trace, TraceError, read_jsonl

__all__ = ["Measured", "is_bench_result", "load_bench_result", "parse_bench_result"]

_REQUIRED = ("input_lens", "output_lens", "ttfts")
_PER_REQUEST = _REQUIRED + ("itls", "latencies", "start_times", "request_timestamps",
                            "errors", "generated_texts")
_MARKERS = frozenset(_REQUIRED + ("mean_ttft_ms", "median_ttft_ms"))
_SGLANG_ONLY = frozenset(("total_output_tokens_retokenized", "mean_e2e_latency_ms",
                          "median_e2e_latency_ms", "sharegpt_output_len",
                          "random_input_len"))
_METRIC = re.compile(r"(mean|median|std|max|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el|"
                     r"e2e_latency)_ms")
_RENAME = {"median": "p50", "e2el": "e2e", "e2e_latency": "e2e"}
_RUN = {"duration": "duration_s", "completed": "completed",
        "request_throughput": "request_throughput_rps",
        "output_throughput": "output_throughput_tps",
        "total_token_throughput": "total_token_throughput_tps"}
_MANIFEST = ("model", "hardware", "tp", "versions")


@dataclass(frozen=True, eq=False)
class Measured:
    """A benchmark run: its requests as a trace and what the client measured, per
    request in the trace's (arrival) order. Read-only arrays."""

    trace: Trace  # format 'vllm-bench' / 'sglang-bench', notes = warnings
    ttft_s: np.ndarray  # [N] float64 time to first token, s
    tpot_s: np.ndarray | None  # [N] (e2e - ttft) / (output - 1); NaN for 1 token
    e2e_s: np.ndarray | None  # [N] send to last token, s; None without itls/latencies
    summary: dict  # the file's own aggregates in s: 'ttft_p50_s', 'itl_p99_s', ...
    rate: float | None  # request_rate, req/s (math.inf for 'inf'); None: not recorded
    burstiness: float | None  # as recorded (None: not recorded)
    seed: int | None  # as recorded in the file or its manifest's client command
    arrivals: str  # 'request_timestamps', 'start_times' or 'redrawn (...)'
    engine: dict  # server arguments + model, hardware, tp, versions from the manifest
    model_id: str | None
    warnings: tuple[str, ...]
    dropped: int  # failed or 0-output requests left out

    def __post_init__(self):
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, name)
            if value is not None:
                value = np.array(value, np.float64)
                value.setflags(write=False)
                object.__setattr__(self, name, value)


def is_bench_result(text: str) -> bool:
    """Whether a file's text is a benchmark result: a JSON object, or a first JSON
    line, holding per-request arrays or the TTFT summary."""
    head = text.lstrip()
    if head[:1] != "{":
        return False
    try:
        rec = json.loads(head)
    except json.JSONDecodeError:  # JSONL: parse the first line only
        try:
            rec = json.loads(head.split("\n", 1)[0])
        except json.JSONDecodeError:
            return False
    return isinstance(rec, dict) and not _MARKERS.isdisjoint(rec)


def load_bench_result(path) -> Measured:
    """Read a vLLM result JSON or SGLang JSONL file (see the module docstring) and the
    ``<stem>.manifest.json`` beside it when there is one."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(p, "-", "<file>", getattr(e, "strerror", 0) or str(e))
    return parse_bench_result(p, text)


def parse_bench_result(path, text: str) -> Measured:
    """:func:`load_bench_result` on text already read from ``path``."""
    p = Path(path)
    rec, line, warnings = _pick_record(p, text)
    sglang = not _SGLANG_ONLY.isdisjoint(rec)
    flag = "--output-details" if sglang else "--save-detailed"
    for key in _REQUIRED:
        if not isinstance(rec.get(key), list):
            what = "missing" if key not in rec else "not a list"
            raise TraceError(p, line, key, f"{what}: the file has no per-request "
                             f"arrays (was it saved with {flag}?)")
    cols = {k: rec[k] for k in _PER_REQUEST if rec.get(k) is not None}
    n = len(cols["input_lens"])
    for key, values in cols.items():
        if not isinstance(values, list):
            raise TraceError(p, line, key, f"not a list of per-request values, got "
                             f"{type(values).__name__}")
        if len(values) != n:
            raise TraceError(p, line, key, f"{len(values)} value(s), but "
                             f"'input_lens' has {n}")
    if n == 0:
        raise TraceError(p, line, "input_lens", "no requests (empty arrays)")

    def column(key, **kw):
        return _numbers(p, line, key, cols[key], **kw) if key in cols else None

    prompt = column("input_lens", integer=True, low=1)
    out = column("output_lens", integer=True, low=0)
    ttft = column("ttfts")
    e2e = column("latencies")
    if e2e is None and "itls" in cols:
        for i, row in enumerate(cols["itls"]):
            if not isinstance(row, list):
                raise TraceError(p, line, "itls", f"request {i}: not a list of gaps "
                                 f"(s), got {row!r}")
        gaps = [_numbers(p, line, "itls", row, where=f"request {i}, gap ")
                for i, row in enumerate(cols["itls"])]
        e2e = ttft + np.array([g.sum() for g in gaps])
    stamps = column("request_timestamps")
    starts = column("start_times") if stamps is None else None

    failed = np.array([bool(e) for e in cols.get("errors", [""] * n)])
    empty = (out == 0) & ~failed
    for count, what in ((int(failed.sum()), "failed (a non-empty 'errors' entry)"),
                        (int(empty.sum()), "have 0 output tokens (failed or empty "
                         "generations)")):
        if count:
            warnings.append(f"{p}: {count} of {n} requests {what}: dropped")
    keep = ~(failed | empty)
    if not keep.any():
        raise TraceError(p, line, "output_lens", f"none of the {n} requests is left: "
                         "all failed or generated 0 tokens")

    engine, command = _manifest(p)
    seed = rec.get("seed", _flag(command, "--seed"))
    seed = int(seed) if isinstance(seed, (int, float, str)) and _is_int(seed) else None
    rate = _rate(rec.get("request_rate"))
    burst = rec.get("burstiness")
    burst = float(burst) if _is_number(burst) else None
    if stamps is not None or starts is not None:
        arrivals = "request_timestamps" if stamps is not None else "start_times"
        t = (stamps if stamps is not None else starts)[keep]
    else:
        t, how = _redraw(p, line, n, rate, burst, seed, sglang)
        t, arrivals = t[keep], f"redrawn ({how})"
        warnings.append(f"{p}: no request_timestamps or start_times: arrivals "
                        f"re-drawn ({how})")
    order = np.argsort(t, kind="stable")
    t = t[order] - t.min()

    def rows(x):
        return None if x is None else x[keep][order]

    tpot = None
    if e2e is not None:
        o = out.astype(np.float64)
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(o - 1, 1), np.nan)
    trace = Trace(t, rows(prompt), rows(out), source=str(p),
                  format="sglang-bench" if sglang else "vllm-bench", notes=warnings)
    model = rec.get("model_id", rec.get("model", engine.get("model")))
    model = None if model is None else str(model)
    return Measured(trace, rows(ttft), rows(tpot), rows(e2e), _summary(rec), rate,
                    burst, seed, arrivals, engine, model, tuple(warnings),
                    int(n - keep.sum()))


def _pick_record(p: Path, text: str):
    """(the run's record, its line or '-', warnings): a JSON document, or the last
    line of a JSONL file that has per-request arrays (else its last line)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        return doc, "-", []
    if doc is not None:
        raise TraceError(p, "-", "<file>", f"expected a JSON object (a benchmark "
                         f"result), got a JSON {type(doc).__name__}")
    recs, lines = read_jsonl(p, text)
    if not recs:
        raise TraceError(p, 1, "<file>", "empty file")
    detailed = [i for i, r in enumerate(recs) if isinstance(r.get("input_lens"), list)]
    i = detailed[-1] if detailed else len(recs) - 1
    warnings = []
    if len(recs) > 1 and detailed:
        warnings.append(f"{p}: {len(recs)} runs (JSON lines); using line {lines[i]}, "
                        f"the last with per-request arrays")
    return recs[i], lines[i], warnings


def _numbers(p, line, field, values, *, integer=False, low=0.0, where="request "):
    """float64 array of ``values``: real numbers (not bools or strings), finite, >=
    ``low``, whole when ``integer``; the first bad one raises."""
    for i, v in enumerate(values):
        if not _is_number(v):
            raise TraceError(p, line, field, f"{where}{i}: not a number: {v!r}")
    x = np.array(values, np.float64).reshape(-1)
    checks = [(~np.isfinite(x), "NaN or infinite: {}")]
    with np.errstate(invalid="ignore"):
        if integer:
            checks.append((x != np.floor(x), "non-integer token count {}"))
        checks.append((x < low, "negative: {}" if low == 0 else
                       f"token count {{}} (need >= {low:g})"))
    bad = np.logical_or.reduce([m for m, _ in checks])
    if bad.any():
        i = int(np.argmax(bad))
        problem = next(msg for m, msg in checks if m[i])
        raise TraceError(p, line, field, f"{where}{i}: " + problem.format(values[i]))
    return x


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v) -> bool:
    try:
        return float(v) == int(float(v))
    except (TypeError, ValueError, OverflowError):
        return False


def _rate(value) -> float | None:
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    return float(value) if _is_number(value) else None


def _redraw(p, line, n: int, rate, burst, seed, sglang: bool):
    """(arrival times [n], how) drawn as the benchmark client draws them."""
    client = "SGLang" if sglang else "vLLM"
    if rate is None or not rate > 0:
        raise TraceError(p, line, "request_rate", "missing or not a rate > 0 (or "
                         "'inf'): with no request_timestamps or start_times there is "
                         "nothing to place the arrivals by")
    if rate == math.inf:
        return np.zeros(n), (f"rate inf: every request at time 0, as the {client} "
                             "client sends them all at once")
    shape = 1.0 if burst is None else burst
    if not shape > 0:
        raise TraceError(p, line, "burstiness", f"not a number > 0: {burst!r}")
    seed_used = 0 if seed is None else seed
    if shape == math.inf:  # vllm bench serve: constant gaps of 1 / rate
        t = np.arange(n) / rate
    else:  # gamma() has shape 1 / cv**2
        t = gamma(n, rate, 1.0 / math.sqrt(shape), seed_used)
    note = "" if burst is not None else " (not recorded: Poisson)"
    seed_note = "" if seed is not None else " (not recorded)"
    return t, (f"gamma, rate {rate:g}, burstiness {shape:g}{note}, seed {seed_used}"
               f"{seed_note}: {client}'s client draws are not reproducible here")


def _manifest(p: Path):
    """(engine dict, client command list) from ``<stem>.manifest.json`` beside ``p``,
    or ({}, [])."""
    m = p.with_name(p.stem + ".manifest.json")
    if not m.is_file():
        return {}, []
    try:
        doc = json.loads(m.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(m, "-", "<file>", f"unreadable manifest ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("server", {}), dict):
        raise TraceError(m, "-", "server", "expected a JSON object with a 'server' "
                         "object of engine arguments")
    engine = {**doc.get("server", {}), **{k: doc[k] for k in _MANIFEST if k in doc}}
    command = doc.get("client_command")
    return engine, [str(c) for c in command] if isinstance(command, list) else []


def _flag(command: list, name: str):
    """The value after ``name`` (or in ``name=value``) in a command, or None."""
    for i, arg in enumerate(command):
        if arg == name and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _summary(rec: dict) -> dict:
    """The file's aggregates: latency statistics in s (``ttft_p50_s``, ``tpot_mean_s``,
    ``itl_p99_s``, ``e2e_std_s``, ...) and the run's totals and throughputs."""
    out = {}
    for key, value in rec.items():
        m = _METRIC.fullmatch(key)
        if m and _is_number(value) and math.isfinite(value):
            stat, metric = m.groups()
            name = f"{_RENAME.get(metric, metric)}_{_RENAME.get(stat, stat)}_s"
            out[name] = value / 1000.0
    out.update({name: rec[key] for key, name in _RUN.items()
                if _is_number(rec.get(key))})
    return out
