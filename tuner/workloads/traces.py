"""Request traces: trace files loaded into one in-memory table, :class:`Trace`.

``load_trace`` tells the format (``_FORMATS``) by content: the CSV header or the first
JSON record's keys; a vLLM or SGLang serving-benchmark result file (per-request
``input_lens``/``output_lens``) is read by :mod:`tuner.workloads.bench_results`.
Problems raise :class:`TraceError` naming the file, the 1-based line (a CSV header is
line 1) and the field. Token counts must be integers >= 1 (a request that generates 0
tokens is rejected, not clamped; a benchmark result's failed or empty requests are
dropped with a note)."""

from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path

import numpy as np

from tuner.workloads import bench_results
from tuner.workloads.trace_data import Trace, TraceError, concat, read_jsonl

__all__ = ["Trace", "TraceError", "concat", "load_trace", "summary", "to_workload"]

_FORMATS = {  # format -> (arrival field or None, prompt field, output field)
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),  # CSV, date-times
    "lengths": (None, "num_prefill_tokens", "num_decode_tokens"),  # CSV
    "plain": ("arrival_s", "prompt_tokens", "output_tokens"),  # CSV, s, optional
    "mooncake": ("timestamp", "input_length", "output_length"),  # JSONL, ms
    "castillo": (None, "input_size", "output_sizes"),  # JSONL (+ prompt_text); or a
}  # directory / glob of CASTILLO files. output_sizes holds K sampled generations.


def load_trace(path, *, sample: int = 0, pattern: str = "*.jsonl") -> Trace:
    """Load a trace file, or every CASTILLO file matching ``pattern`` in a directory.
    ``sample`` picks which CASTILLO generation is the realised output length."""
    p = Path(path)
    if not p.exists() and any(c in p.name for c in "*?["):
        p, pattern = p.parent, p.name
    if p.is_dir():
        parts = [load_trace(f, sample=sample) for f in sorted(p.glob(pattern))]
        found = {Path(t.source).name: t.format for t in parts}
        if set(found.values()) != {"castillo"}:  # only CASTILLO files stack
            raise TraceError(p, "-", "<file>", f"want CASTILLO files matching "
                             f"{pattern!r}, found {found or 'none'}")
        return concat(parts, source=str(p / pattern), format="castillo")
    try:
        raw = p.read_bytes()
        text = raw.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:  # e.g. missing file, not UTF-8 text
        raise TraceError(p, "-", "<file>", getattr(e, "strerror", 0) or str(e))
    # a file read before with the same bytes: the same Trace (frozen, read-only
    # arrays); a command builds many windows of one trace and parses it once
    key = (str(p.resolve()), int(sample), hashlib.blake2b(raw, digest_size=16).digest())
    if key not in _LOADED:
        if len(_LOADED) >= 16:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = _parse_file(p, text, sample)
    return _LOADED[key]


_LOADED: dict = {}  # (path, sample, digest of the bytes) -> Trace, the 16 last parsed


def _parse_file(p: Path, text: str, sample: int) -> Trace:
    """One trace file's text as :func:`load_trace` reads it."""
    if bench_results.is_bench_result(text):
        return bench_results.parse_bench_result(p, text).trace
    fmt, recs, lines = _records(p, text)
    t_key, p_key, o_key = _FORMATS[fmt]
    prompt = _column([r.get(p_key) for r in recs], lines, p, p_key, "prompt")
    if fmt == "castillo":
        return _castillo(p, recs, lines, prompt, sample)
    out = _column([r.get(o_key) for r in recs], lines, p, o_key, "output")
    if t_key not in recs[0]:
        return Trace(None, prompt, out, source=str(p), format=fmt)
    kind = "datetime" if fmt == "azure" else "time"
    t = _column([r.get(t_key) for r in recs], lines, p, t_key, kind)
    if fmt == "plain":  # a file written by hand or by a tool: no silent repairs
        if (t < 0).any():
            i = int(np.argmax(t < 0))
            raise TraceError(p, lines[i], t_key, f"negative arrival time {t[i]:g} s")
        if (np.diff(t) < 0).any():
            i = int(np.argmax(np.diff(t) < 0)) + 1
            raise TraceError(p, lines[i], t_key, f"arrival times are not sorted: "
                             f"{t[i]:g} s after {t[i - 1]:g} s")
    order = np.argsort(t, kind="stable")
    t = (t[order] - t.min()) / (1000.0 if fmt == "mooncake" else 1.0)
    return Trace(t, prompt[order], out[order], source=str(p), format=fmt)


def _castillo(p: Path, recs, lines, prompt, sample: int) -> Trace:
    sizes = [r.get("output_sizes") for r in recs]
    k = len(sizes[0]) if isinstance(sizes[0], list) else 0
    for size, rec, ln in zip(sizes, recs, lines):
        if not (isinstance(size, list) and 0 < k == len(size)):
            raise TraceError(p, ln, "output_sizes", f"not a list of {k or 'K'} sizes")
        if not isinstance(rec.get("prompt_text"), str):
            raise TraceError(p, ln, "prompt_text", "missing, or not a string")
    if not 0 <= sample < k:
        raise TraceError(p, lines[0], "output_sizes", f"sample={sample} out of range "
                         f"(each record holds {k} samples)")
    flat, ds = [v for s in sizes for v in s], [str(r.get("dataset", "")) for r in recs]
    samples = _column(flat, np.repeat(lines, k), p, "output_sizes", "output")
    samples = samples.reshape(-1, k)
    return Trace(None, prompt, samples[:, sample], [r["prompt_text"] for r in recs],
                 ds if "dataset" in recs[0] else None, samples, str(p), "castillo")


def _records(p: Path, text: str):
    """(format, data records as dicts, their 1-based line numbers in the file)."""
    jsonl = text.lstrip()[:1] == "{"
    recs, lines = (read_jsonl if jsonl else _read_csv)(p, text)
    if not recs:
        raise TraceError(p, 1, "<file>", "empty file: no header and no data rows")
    head, line = recs[0], lines[0]  # a CSV header maps each name to itself
    table = {f: tuple(filter(None, v)) for f, v in _FORMATS.items()
             if (f in ("mooncake", "castillo")) == jsonl}
    fmt = max(table, key=lambda f: sum(c in head for c in table[f]))
    if not any(c in head for c in table[fmt]):
        raise TraceError(p, line, "<header>", f"unknown trace format: saw "
                         f"{sorted(head)}, expected the fields of one of {table}")
    for key in table[fmt][fmt == "plain":]:  # plain: arrival_s is optional
        if key not in head:
            raise TraceError(p, line, key, f"missing for the {fmt} format "
                             f"(saw {sorted(head)})")
    if len(recs) == 1 and not jsonl:
        raise TraceError(p, line + 1, "<data>", "no data rows after the header")
    return (fmt, recs, lines) if jsonl else (fmt, recs[1:], lines[1:])


def _read_csv(p: Path, text: str):
    reader, rows, lines, header = csv.reader(io.StringIO(text)), [], [], None
    try:
        for row in filter(lambda r: any(c.strip() for c in r), reader):
            header = header or [h.strip() for h in row]  # short rows: _column
            rows.append(dict(zip(header, (c.strip() for c in row))))
            lines.append(reader.line_num)
    except csv.Error as e:  # e.g. a field over the csv module's size limit
        raise TraceError(p, reader.line_num, "<record>", f"bad CSV ({e})") from None
    return rows, lines


def _column(values, lines, p: Path, field: str, kind: str) -> np.ndarray:
    """float64 column of ``kind`` 'time'/'datetime' (finite seconds) or
    'prompt'/'output' (integer token counts >= 1); the first bad line raises."""
    dtype = "datetime64[ns]" if kind == "datetime" else np.float64
    x = _parse(values, dtype)
    for v, ln in zip(values, lines) if x is None else ():
        if v is None or _parse([v], dtype) is None:
            what = "a date-time" if kind == "datetime" else "a number"
            raise TraceError(p, ln, field, "missing value" if v is None else
                             f"not {what}: {v!r}")
    if kind == "datetime":  # seconds since the earliest; NaT becomes NaN
        t, ok, x = x, ~np.isnat(x), np.full(len(x), np.nan)
        x[ok] = (t[ok] - t[ok].min()).astype(np.int64) * 1e-9 if ok.any() else 0.0
    checks = [(~np.isfinite(x), "not a finite number: {}")]
    if kind in ("prompt", "output"):
        with np.errstate(invalid="ignore"):
            checks += [(x < 0, "negative token count {}"),
                       (x != np.floor(x), "non-integer token count {}"),
                       (x == 0, f"zero {kind} tokens (need >= 1)")]
    bad = np.logical_or.reduce([m for m, _ in checks])
    if bad.any():
        i = int(np.argmax(bad))
        problem = next(msg for m, msg in checks if m[i])
        raise TraceError(p, lines[i], field, problem.format(values[i]))
    return x


def _parse(values, dtype) -> np.ndarray | None:  # None where numpy cannot
    try:
        x = np.array(values, dtype=dtype)
    except (ValueError, TypeError):
        return None
    return x if x.ndim == 1 and not any(v is None for v in values) else None


def summary(trace: Trace) -> dict:
    """Request count, span, inter-arrival CV and token-length statistics, JSON-ready
    (``duration_s`` and ``interarrival_cv`` are None without arrival times; ``notes``
    only when the loader left some)."""
    a = trace.arrival_s
    gaps = np.diff(a) if a is not None else np.zeros(0)
    duration = float(a.max() - a.min()) if a is not None else None
    cv = float(gaps.std() / gaps.mean()) if gaps.size > 1 and gaps.mean() else None
    stats = {k: {"mean": float(x.mean()), "p50": float(np.percentile(x, 50)),
                 "p99": float(np.percentile(x, 99)), "max": int(x.max())}
             for k, x in (("prompt_tokens", trace.prompt_tokens),
                          ("output_tokens", trace.output_tokens))}
    notes = {"notes": list(trace.notes)} if trace.notes else {}
    return {"requests": len(trace), "duration_s": duration, "interarrival_cv": cv,
            **stats, "format": trace.format, "source": trace.source, **notes}


def to_workload(trace: Trace, *, arrival_s=None, pred_tokens=None, pred_u=None,
                max_output: int | None = None, pad_to: int | None = None):
    """The simulators' ``models.workload.Workload``. ``arrival_s`` overrides the
    trace's arrival times (needed when it has none: see :mod:`tuner.workloads.arrivals`);
    ``max_output`` clips output lengths (e.g. to the model's context limit)."""
    from models.workload import make_workload  # imports jax: keep the CLI fast

    arrival = trace.arrival_s if arrival_s is None else arrival_s
    if arrival is None:
        raise ValueError(f"trace {trace.source} has no arrival times: pass arrival_s "
                         "(e.g. tuner.workloads.arrivals.gamma(len(trace), rate, cv, seed))")
    if max_output is not None and max_output < 1:
        raise ValueError(f"max_output must be >= 1, got {max_output}")
    output = np.minimum(trace.output_tokens, max_output or trace.output_tokens.max())
    return make_workload(arrival, trace.prompt_tokens, output, pred_tokens, pred_u,
                         pad_to=pad_to)
