"""Exported policy configs: versioned JSON (written with
:func:`tuner.atomic.write_json_atomic`), loaded strictly."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from models import get_system, validate_params
from tuner.atomic import plain
from tuner.scenario import ScenarioSpec, check_spec

__all__ = ["SCHEMA", "make_policy", "load_policy", "package_version"]

SCHEMA = "kvtune.policy/1"
KEYS = ("schema", "system", "hardware", "model", "params", "metrics", "objective",
        "scenario", "workload", "tuner", "version", "seed", "created")
OPTIONAL_KEYS = ("slo", "deployment", "verdict")  # may be missing
METRIC_SETS = ("tuned", "default", "baseline")


def package_version() -> str:
    try:
        return metadata.version("kvtune")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def make_policy(*, system, params, scenario: ScenarioSpec, workload: dict, metrics: dict,
                objective: str, tuner: dict, seed: int, slo: dict | None = None,
                deployment: dict | None = None, verdict: dict | None = None) -> dict:
    """Assemble the policy document (parameters in human units; the SLOs it was tuned
    for, deployment values an engineer applies (``tuner.deployment.describe``) and the
    verdict of the validation, when given)."""
    missing = [k for k in METRIC_SETS if k not in metrics]
    if missing:
        raise ValueError(f"policy metrics lack {missing}")
    extra = {k: v for k, v in (("slo", slo), ("deployment", deployment),
                               ("verdict", verdict)) if v is not None}
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
    try:
        spec = get_system(doc["system"])
    except ValueError as e:
        raise ValueError(f"{path}: field 'system': {e}") from None
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
        if not isinstance(doc["metrics"], dict) or name not in doc["metrics"]:
            raise ValueError(f"{path}: field 'metrics' lacks {name!r}")
    max_len = sc["max_len"] or 16384
    try:
        params = validate_params(spec, doc["params"], max_len)
    except ValueError as e:
        raise ValueError(f"{path}: field 'params': {e}") from None
    doc["params"] = {k: v.tolist() for k, v in params.items()}
    return doc
