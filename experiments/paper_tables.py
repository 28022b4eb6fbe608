"""What the four paper-table scripts (``experiments/*_tables.py``) share.

Each of those scripts reproduces one paper's evaluation in a simulator and sets its own
deployment, run grid and claims; this module holds only the scaffolding that is the
same in all of them:

* progress and errors: :func:`log` (one line to stderr), :func:`error` (one ``error:``
  line, exit status 2);
* the claim vocabulary: the verdicts :data:`SUPPORTED`, :data:`CONTRADICTED`,
  :data:`NOT_REPRODUCED`, :data:`NOT_EXERCISED`, :data:`UNTESTABLE`,
  :data:`INCONSISTENT`, the agreement test :func:`within` (sim / paper within a band
  of 1), :func:`band_verdict`, :func:`ratio` and :func:`set_reason` (a claim row's
  ``cause`` or ``note``);
* formatters for the markdown: :func:`fmt`, :func:`pct`, :func:`signed`, :func:`yn`,
  and markdown pieces: :func:`md_head`, :func:`md_row`, :func:`bullets`,
  :func:`footer`;
* outputs: :func:`stamp` (the result and its markdown with provenance,
  ``experiments/results_io.py``), :func:`write_outputs` (JSON + markdown + figures,
  atomically), :func:`pyplot` and :func:`save_figure` (a PNG carrying the provenance);
* the command line: :func:`argument_parser` (``--out`` and ``--quick``),
  :func:`parse_args`, :func:`out_unwritable` and :func:`make_out` (the output folder,
  checked before long work);
* running: :class:`BaseRunner` (start time, run count, progress lines, a scenario
  cache); JAX's persistent compilation cache is
  :func:`tuner.common.compile_cache.enable`.

Nothing here imports JAX or the simulators at import time.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from experiments.results_io import png_metadata, stamp_markdown, stamped
from tuner.common.atomic import (plain, savefig_atomic, unwritable_reason,
                                 write_json_atomic, write_text_atomic)

__all__ = ["CONTRADICTED", "INCONSISTENT", "NOT_EXERCISED", "NOT_REPRODUCED",
           "SUPPORTED", "UNTESTABLE", "BaseRunner",
           "argument_parser", "band_verdict", "bullets",
           "error", "fmt", "footer", "log", "make_out", "md_head", "md_row", "now_utc",
           "out_unwritable", "parse_args", "pct", "pyplot", "ratio", "save_figure",
           "set_reason", "signed", "stamp", "within", "write_outputs", "yn"]


# ----------------------------------------------------------------- progress, errors
def log(msg: str) -> None:
    """One progress line on stderr (flushed: the runs take minutes)."""
    print(msg, file=sys.stderr, flush=True)


def error(msg: str) -> int:
    """One ``error: msg`` line on stderr; returns 2, the scripts' exit status for bad
    arguments or missing inputs (``return error(...)`` in ``main``)."""
    print(f"error: {msg}", file=sys.stderr)
    return 2


def now_utc() -> str:
    """The current UTC time to the second, ISO 8601 (a setup's ``started``)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------- claim vocabulary
SUPPORTED = "supported"            # the simulation agrees with the paper's claim
CONTRADICTED = "contradicted"      # it points the other way
NOT_REPRODUCED = "not reproduced"  # same direction (or no effect), outside the band
NOT_EXERCISED = "not exercised"    # the workload never engaged the claim's mechanism
UNTESTABLE = "untestable here"     # the claim needs what the project does not model
INCONSISTENT = "the paper's figures inconsistent"  # the paper's numbers disagree


def ratio(a, b, positive: bool = False):
    """``a / b``, or None when either is None or not finite or ``b`` is 0 (with
    ``positive``: ``b <= 0``)."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return None
    if (b <= 0) if positive else (b == 0):
        return None
    return a / b


def within(r, band: float) -> bool | None:
    """Whether a ratio sim / paper lies within ``band`` of 1 (None when ``r`` is)."""
    return None if r is None else abs(r - 1.0) <= band


def band_verdict(r, band: float) -> str | None:
    """The verdict of a ratio sim / paper: supported within ``band`` of 1, else not
    reproduced; None when ``r`` is None."""
    if r is None:
        return None
    return SUPPORTED if within(r, band) else NOT_REPRODUCED


def set_reason(row: dict, text: str, agrees) -> dict:
    """A claim row's explanation: ``note`` when the claim agrees, else ``cause`` (the
    other one None); returns ``row``."""
    row["cause"], row["note"] = (None, text) if agrees else (text, None)
    return row


# ----------------------------------------------------------------- formatters
def fmt(x, f: str = ".3g") -> str:
    """``format(x, f)``; an em dash for None and non-finite floats."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return format(x, f)


def pct(x, nd: int = 2) -> str:
    """A share as a percentage with ``nd`` decimals (``0.5505`` -> ``55.05%``)."""
    return "—" if x is None else f"{100.0 * x:.{nd}f}%"


def signed(x, f: str = ".1f") -> str:
    """A change as a signed percentage (``-0.59`` -> ``-59.0%``)."""
    return "—" if x is None else f"{100 * x:+{f}}%"


def yn(x) -> str:
    """yes / no / an em dash for None."""
    return "—" if x is None else ("yes" if x else "no")


# ----------------------------------------------------------------- markdown
def md_row(cells) -> str:
    """One markdown table row."""
    return "| " + " | ".join(cells) + " |"


def md_head(headers) -> list[str]:
    """A markdown table's header row and separator."""
    return [md_row(headers), "|" + "---|" * len(headers)]


def bullets(heading: str, items, empty: str | None = None) -> list[str]:
    """A heading, a blank line, one ``- item`` per item (``- empty`` when there are
    none and ``empty`` is given) and a blank line."""
    items = list(items)
    if not items and empty is not None:
        items = [empty]
    return [heading, "", *(f"- {t}" for t in items), ""]


def footer(setup: dict, extra: str = "") -> str:
    """The report's last line: runtime and simulator runs (``extra`` before the
    full stop)."""
    return (f"Runtime {setup.get('runtime_s', 0):.0f} s, "
            f"{setup.get('simulator_runs', 0)} simulator runs{extra}.")


# ----------------------------------------------------------------- outputs
def stamp(res: dict, render_markdown) -> tuple[dict, str]:
    """The result with its provenance (``results_io.stamped``) and its markdown,
    ``render_markdown`` of it, with the provenance line last."""
    doc = stamped(res)
    return doc, stamp_markdown(render_markdown(doc), doc["provenance"])


def write_outputs(out: Path, stem: str, doc: dict, md: str, figures=None) -> None:
    """Write ``out/stem.json`` (plain JSON, keys in order) and ``out/stem.md``, then
    each figure: ``figures`` maps a file name to ``render(doc, path)``. Every file is
    written atomically."""
    write_json_atomic(out / f"{stem}.json", plain(doc), sort_keys=False)
    write_text_atomic(out / f"{stem}.md", md)
    for name, render in (figures or {}).items():
        render(doc, out / name)


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, res: dict, dpi: int = 100) -> None:
    """Save ``fig`` as a PNG atomically, with the provenance line of ``res`` in its
    metadata when ``res`` has one, and close it."""
    meta = {"metadata": png_metadata(res["provenance"])} if "provenance" in res else {}
    savefig_atomic(fig, path, dpi=dpi, **meta)
    import matplotlib.pyplot as plt

    plt.close(fig)


# ----------------------------------------------------------------- command line
def argument_parser(module: str, doc: str, files: str, quick_help: str,
                    out_required: bool = True) -> argparse.ArgumentParser:
    """``python -m experiments.<module>``'s parser with ``--out`` ("folder for the
    <files> files") and ``--quick``; the script adds its own options."""
    ap = argparse.ArgumentParser(prog=f"python -m experiments.{module}",
                                 description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, required=out_required, default=None,
                    help=f"folder for the {files} files")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    return ap


def parse_args(ap: argparse.ArgumentParser, argv):
    """``ap.parse_args(argv)``, or argparse's exit status as an int (2 on bad
    arguments, 0 after ``--help``) instead of its SystemExit."""
    try:
        return ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)


def out_unwritable(out: Path) -> str | None:
    """None when the ``--out`` folder is (or can be made) writable, else the error
    message; creates nothing (check before long work)."""
    why = unwritable_reason(out)
    return f"--out {out}: {why}" if why else None


def make_out(out: Path) -> str | None:
    """Create the ``--out`` folder; None, or the error message when it cannot."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"--out {out}: cannot create it ({e})"
    return None


# ----------------------------------------------------------------- running
class BaseRunner:
    """What every table's runner keeps while it walks its run grid: the start time
    (:meth:`elapsed`), the number of simulator runs, progress lines prefixed with the
    elapsed time (:meth:`progress`, through ``say``, default :func:`log`) and a cache
    of built scenarios (:meth:`cached`)."""

    def __init__(self, say=None):
        self.t0 = time.perf_counter()
        self.runs = 0
        self._say = say or log
        self._scenarios: dict = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def progress(self, msg: str) -> None:
        """``[  12.3s] msg``."""
        self._say(f"[{self.elapsed():6.1f}s] {msg}")

    def cached(self, key, build):
        """The scenario under ``key``, built by ``build()`` the first time."""
        if key not in self._scenarios:
            self._scenarios[key] = build()
        return self._scenarios[key]

    def record_runtime(self, setup: dict) -> None:
        """``setup['runtime_s']`` (s, one decimal) and ``setup['simulator_runs']``."""
        setup["runtime_s"] = round(self.elapsed(), 1)
        setup["simulator_runs"] = self.runs
