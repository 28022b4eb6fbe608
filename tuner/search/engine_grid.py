"""vLLM's own tuning grid, ``benchmarks/auto_tune``, as settings of the ``vllm-v1`` system.

An operator who tunes vLLM by hand runs ``auto_tune.sh``: ``max_num_seqs`` in (128, 256)
x ``max_num_batched_tokens`` in (512, 1024, 2048, 4096), each started with
``gpu_memory_utilization`` 0.98 and, while the server fails to start, 0.01 lower
(vLLM's ``benchmarks/auto_tune/auto_tune.sh``: ``NUM_SEQS_LIST``,
``NUM_BATCHED_TOKENS_LIST``; the stepping rule as summarised in
``../shared/reference/TUNING-METHODS.md``). Here "fails to start" is the system's
predicted refusal (``SystemSpec.refusal``: vLLM's start-up checks and its memory
profile), so no setting is learned from a crash.

The grid is both a baseline (``experiments/engine_tune``) and where the black-box searches
of ``tuner.fit`` start on a system with these engine arguments: their first generation
is the grid, so the best setting found on the training windows is at least the grid's.
"""

from __future__ import annotations

__all__ = ["AUTO_TUNE_SEQS", "AUTO_TUNE_TOKENS", "AUTO_TUNE_UTIL", "ENGINE_ARGS",
           "GRID_NOTE", "auto_tune_grid", "auto_tune_util", "has_engine_args"]

AUTO_TUNE_SEQS = (128, 256)
AUTO_TUNE_TOKENS = (512, 1024, 2048, 4096)
AUTO_TUNE_UTIL = (0.98, 0.01)  # start, step down
_LOWEST_UTIL = 0.5  # the vllm-v1 system's lower bound of gpu_memory_utilization
ENGINE_ARGS = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization")
GRID_NOTE = "settings of vLLM's auto_tune grid"  # how a search's log names them


def has_engine_args(params: dict) -> bool:
    """Whether a system's parameters include the three arguments auto_tune sets."""
    return all(k in params for k in ENGINE_ARGS)


def auto_tune_util(system, deployment, seqs: int, tokens: int) -> tuple[float, list[str]]:
    """auto_tune's ``gpu_memory_utilization`` for one (``seqs``, ``tokens``): 0.98,
    lowered by 0.01 while ``system`` predicts vLLM would refuse to start; with the
    reasons met on the way down. ``ValueError`` when nothing from 0.98 down to 0.5
    starts (the setting cannot run on this device)."""
    u, step = AUTO_TUNE_UTIL
    met: list[str] = []
    while u >= _LOWEST_UTIL - 1e-9:
        p = {"max_num_seqs": float(seqs), "max_num_batched_tokens": float(tokens),
             "gpu_memory_utilization": round(u, 2), "block_size": 16.0}
        why = system.refusal(deployment, p)
        if why is None:
            return round(u, 2), met
        met.append(why[1])
        u -= step
    raise ValueError(f"auto_tune: no gpu_memory_utilization from {AUTO_TUNE_UTIL[0]} "
                     f"down to {_LOWEST_UTIL} starts max_num_seqs {seqs} / "
                     f"max_num_batched_tokens {tokens}: {met[-1]}")


def auto_tune_grid(system, deployment, default: dict) -> tuple[list[dict], dict]:
    """auto_tune's settings that start, as full parameter dicts (every argument it does
    not set, such as the block size and the long-prefill threshold, at ``default``), and
    the settings whose utilisation had to step down: ``{"seqs/tokens": {"util", "steps",
    "first"}}`` (``first``: the first refusal met; ``util`` None: no utilisation down to
    0.5 starts it, so it is not in the grid, as auto_tune records a failed setting)."""
    grid, stepped = [], {}
    for s in AUTO_TUNE_SEQS:
        for k in AUTO_TUNE_TOKENS:
            try:
                u, met = auto_tune_util(system, deployment, s, k)
            except ValueError as e:
                stepped[f"{s}/{k}"] = {"util": None, "steps": None, "first": str(e)}
                continue
            grid.append({**default, "max_num_seqs": float(s),
                         "max_num_batched_tokens": float(k), "gpu_memory_utilization": u})
            if met:
                stepped[f"{s}/{k}"] = {"util": u, "steps": len(met), "first": met[0]}
    return grid, stepped
