"""Exported policy configs: versioned JSON (written with
:func:`tuner.common.atomic.write_json_atomic`), loaded strictly."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from models import get_system, validate_params
from tuner.common.atomic import plain
from tuner.scenario import ScenarioSpec, check_spec

__all__ = ["SCHEMA", "make_policy", "load_policy", "package_version"]

SCHEMA = "kvtune.policy/1"
KEYS = ("schema", "system", "hardware", "model", "params", "metrics", "objective",
        "scenario", "workload", "tuner", "version", "seed", "created")
# may be missing (files written before them lack them): "provenance" is
# tuner.common.provenance.provenance()'s record, "wall_s" the fit's wall time in seconds
OPTIONAL_KEYS = ("slo", "deployment", "verdict", "provenance", "wall_s")
# the verdict outcomes a file may record (tuner.objective.validation.verdict; "undetermined" when
# the held-out comparison cannot decide)
OUTCOMES = ("win", "tie", "loss", "undetermined")
METRIC_SETS = ("tuned", "default", "baseline")


def package_version() -> str:
    try:
        return metadata.version("kvtune")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def make_policy(*, system, params, scenario: ScenarioSpec, workload: dict, metrics: dict,
                objective: str, tuner: dict, seed: int, slo: dict | None = None,
                deployment: dict | None = None, verdict: dict | None = None,
                provenance: dict | None = None, wall_s: float | None = None) -> dict:
    """Assemble the policy document (parameters in human units; the SLOs it was tuned
    for, deployment values an engineer applies (``tuner.export.deployment.describe``) and the
    verdict of the validation, when given)."""
    missing = [k for k in METRIC_SETS if k not in metrics]
    if missing:
        raise ValueError(f"policy metrics lack {missing}")
    extra = {k: v for k, v in (("slo", slo), ("deployment", deployment),
                               ("verdict", verdict), ("provenance", provenance),
                               ("wall_s", wall_s)) if v is not None}
    return plain({**extra,
        "schema": SCHEMA, "system": system, "hardware": scenario.hardware,
        "model": scenario.model, "params": params, "metrics": metrics,
        "objective": objective, "scenario": scenario.to_dict(), "workload": workload,
        "tuner": tuner, "version": package_version(), "seed": seed,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })


def load_policy(path) -> dict:
    """Load and validate a policy file; every error names the file and the field."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object")
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: field 'schema' is {doc.get('schema')!r}, expected {SCHEMA!r}")
    unknown = sorted(set(doc) - set(KEYS) - set(OPTIONAL_KEYS))
    missing = sorted(set(KEYS) - set(doc))
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {unknown}")
    if missing:
        raise ValueError(f"{path}: missing field(s) {missing}")
    _check_fields(path, doc)
    try:
        spec = get_system(doc["system"])
    except ValueError as e:
        raise ValueError(f"{path}: field 'system': {e}") from None
    try:
        from tuner.objective.objectives import parse_objective

        parse_objective(doc["objective"]).check_metrics(doc["system"])
    except ValueError as e:
        raise ValueError(f"{path}: field 'objective': {e}") from None
    opts = doc["scenario"].get("options")
    if opts is not None and not isinstance(opts, dict):
        raise ValueError(f"{path}: field 'scenario': options must be an object of "
                         f"integers, got {opts!r}")
    fields = set(ScenarioSpec.__dataclass_fields__)
    # files written before family options name ODMA's window settings directly; before
    # SLOs were derived they lack slo_scale, and before the total-token clip, scheduler
    # and watermark settings they lack those (the defaults apply: no clip, vLLM v0's
    # scheduler, 1% watermark), and before the prediction settings they lack
    # pred_quantile and u_calibration (the predictor's own quantile, raw u)
    legacy = {"window", "refresh_every", "refresh_check"}
    optional = {"block", "options", "slo_scale", "max_tokens", "scheduler", "watermark",
                "pred_quantile", "u_calibration"}
    sc = doc["scenario"]
    if (not isinstance(sc, dict) or set(sc) - fields - legacy
            or (fields - optional) - set(sc)):
        bad = (sorted((set(sc) - fields - legacy) | ((fields - optional) - set(sc)))
               if isinstance(sc, dict) else "not an object")
        raise ValueError(f"{path}: field 'scenario' has unknown or missing keys: {bad}")
    try:
        scenario = ScenarioSpec.from_dict(sc)
        check_spec(scenario)
        sc = doc["scenario"] = scenario.to_dict()
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: field 'scenario': {e}") from None
    if sc["hardware"] != doc["hardware"] or sc["model"] != doc["model"]:
        raise ValueError(f"{path}: fields 'hardware'/'model' disagree with 'scenario'")
    for name in METRIC_SETS:
        if name not in doc["metrics"]:
            raise ValueError(f"{path}: field 'metrics' lacks {name!r}")
        if not isinstance(doc["metrics"][name], dict):
            raise ValueError(f"{path}: field 'metrics.{name}' must be an object, got "
                             f"{doc['metrics'][name]!r}")
    max_len = sc["max_len"] or 16384
    try:
        params = validate_params(spec, doc["params"], max_len)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: field 'params': {e}") from None
    doc["params"] = {k: v.tolist() for k, v in params.items()}
    return doc


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_fields(path: Path, doc: dict) -> None:
    """The type (and range, and form) of every top-level field; the scenario, params
    and objective are checked in full by :func:`load_policy` after this."""
    def bad(field, want):
        raise ValueError(f"{path}: field {field!r} must be {want}, got "
                         f"{doc[field]!r}"[:300])

    for field in ("system", "hardware", "model", "objective", "version", "created"):
        if not isinstance(doc[field], str) or not doc[field].strip():
            bad(field, "a non-empty string")
    try:
        datetime.fromisoformat(doc["created"])
    except ValueError:
        bad("created", "an ISO 8601 date-time")
    if not _is_int(doc["seed"]) or doc["seed"] < 0:
        bad("seed", "an integer >= 0")
    for field in ("params", "metrics", "scenario", "workload", "tuner"):
        if not isinstance(doc[field], dict):
            bad(field, "a JSON object")
    for field in ("slo", "deployment", "verdict", "provenance"):
        if field in doc and not isinstance(doc[field], dict):
            bad(field, "a JSON object")
    if "wall_s" in doc and not (_is_num(doc["wall_s"]) and doc["wall_s"] >= 0):
        bad("wall_s", "a finite number of seconds >= 0")
    for key in ("ttft_s", "tpot_s"):
        v = doc.get("slo", {}).get(key)
        if key in doc.get("slo", {}) and not (_is_num(v) and v > 0):
            raise ValueError(f"{path}: field 'slo.{key}' must be a finite number of "
                             f"seconds > 0, got {v!r}")
    ver = doc.get("verdict", {})
    if "outcome" in ver and ver["outcome"] not in OUTCOMES:
        raise ValueError(f"{path}: field 'verdict.outcome' must be one of "
                         f"{', '.join(OUTCOMES)}, got {ver['outcome']!r}")
    if "sentence" in ver and not isinstance(ver["sentence"], str):
        raise ValueError(f"{path}: field 'verdict.sentence' must be a string, got "
                         f"{ver['sentence']!r}")
    prov = doc.get("provenance", {})
    # a record reconstructed for a result made before provenance has command null
    if prov.get("command") is not None and not isinstance(prov["command"], str):
        raise ValueError(f"{path}: field 'provenance.command' must be a string (or "
                         f"null), got {prov['command']!r}")
    bases = doc["metrics"].get("baselines")
    if bases is not None and not (isinstance(bases, dict)
                                  and all(isinstance(m, dict) for m in bases.values())):
        raise ValueError(f"{path}: field 'metrics.baselines' must be an object of "
                         "metric objects")
