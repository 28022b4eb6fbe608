"""The trace record every loader returns (:class:`Trace`), its error type
(:class:`TraceError`), and the pieces the loaders share: stacking traces
(:func:`concat`) and reading JSON lines (:func:`read_jsonl`).

A module of its own so that the loaders (:mod:`tuner.workloads.traces`,
:mod:`tuner.workloads.bench_results`) and :mod:`tuner.workloads.arrivals` import it
instead of each other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

__all__ = ["Trace", "TraceError", "concat", "read_jsonl"]

_TEXT = ("prompt_text", "dataset")


class TraceError(ValueError):
    """A bad trace file: ``<file>: line <n>: field '<name>': <problem>``."""

    def __init__(self, path, line, field: str, problem: str):
        self.path, self.line, self.field = str(path), line, field
        super().__init__(f"{self.path}: line {line}: field {field!r}: {problem}")


@dataclass(frozen=True, eq=False)
class Trace:
    """N requests, sorted by arrival when there are arrival times. Read-only arrays."""

    arrival_s: np.ndarray | None  # [N] float64 s from the first arrival, or None
    prompt_tokens: np.ndarray  # [N] int64 >= 1
    output_tokens: np.ndarray  # [N] int64 >= 1, realised output length
    prompt_text: tuple[str, ...] | None = None  # [N] prompt texts (CASTILLO)
    dataset: tuple[str, ...] | None = None  # [N] dataset label per request
    output_samples: np.ndarray | None = None  # [N, K] int64 sampled output lengths
    source: str = ""  # path (or description) of the data
    format: str = "plain"  # one of the formats above, 'default', 'drift' or '*-bench'
    notes: tuple[str, ...] = ()  # what the loader changed or assumed, for the user

    def __post_init__(self):
        n = len(self.prompt_tokens)
        for name, value in self._rows().items():
            if name in _TEXT:
                value = tuple(value)
            else:
                value = np.array(value, np.float64 if name == "arrival_s" else np.int64)
                value.setflags(write=False)
            if len(value) != n:
                raise ValueError(f"Trace field {name!r}: {len(value)} rows, not {n}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "notes", tuple(self.notes))

    def _rows(self) -> dict:  # the per-request fields that are present
        return {k: v for k, v in vars(self).items()
                if v is not None and k not in ("source", "format", "notes")}

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def take(self, idx) -> Trace:
        """Rows ``idx`` in that order (give sorted ``idx`` to keep arrivals sorted)."""
        idx = np.asarray(idx, dtype=np.int64)
        return replace(self, **{
            k: tuple(v[i] for i in idx) if k in _TEXT else v[idx]
            for k, v in self._rows().items()})


def read_jsonl(p: Path, text: str):
    recs, lines = [], [ln for ln, r in enumerate(text.splitlines(), 1) if r.strip()]
    for ln, raw in zip(lines, filter(str.strip, text.splitlines())):
        try:
            recs.append(json.loads(raw))
        except json.JSONDecodeError as e:
            raise TraceError(p, ln, "<record>", f"invalid JSON ({e.msg}, column "
                             f"{e.colno})") from None
        if not isinstance(recs[-1], dict):
            raise TraceError(p, ln, "<record>", "expected a JSON object per line")
    return recs, lines


def concat(traces, *, source: str, format: str) -> Trace:
    """Stack the rows of ``traces``, keeping the per-request fields all of them have
    except arrival times (each trace starts at zero: stacking them means nothing), and
    each distinct note."""
    keys = set.intersection(*(set(t._rows()) for t in traces)) - {"arrival_s"}
    notes = tuple(dict.fromkeys(n for t in traces for n in t.notes))
    return Trace(None, **{k: sum((getattr(t, k) for t in traces), ()) if k in _TEXT
                          else np.concatenate([getattr(t, k) for t in traces])
                          for k in keys}, source=source, format=format, notes=notes)
