"""tuner/search/engine_grid.py: vLLM's auto_tune grid with its memory-utilisation rule
(0.98, stepped down while the server would not start), and tuner.fit's use of it as a
black-box search's first generation on a system with vLLM's engine arguments."""

import hardware
from models import get_system
from tuner import fit as fit_cli
from tuner.scenario import ScenarioSpec, build_scenario
from tuner.search.engine_grid import (AUTO_TUNE_SEQS, AUTO_TUNE_TOKENS, auto_tune_grid,
                                      auto_tune_util)


def test_auto_tune_util_steps_down_from_098_until_the_server_starts():
    spec = get_system("vllm-v1")
    h100 = hardware.make_deployment("h100-80gb", "qwen3-8b", tp=1, engine="vllm-v1")
    assert auto_tune_util(spec, h100, 128, 512) == (0.98, [])
    # an A100 40GB keeps 0.8 GiB beside 0.98 of its memory: less than the ~1 GiB of
    # CUDA graphs vLLM captures after the KV cache, so auto_tune steps to 0.97
    a100 = hardware.make_deployment("a100-40gb", "qwen3-8b", tp=1, engine="vllm-v1",
                                    engine_args={"max_model_len": 8192})
    u, met = auto_tune_util(spec, a100, 128, 512)
    assert u == 0.97 and len(met) == 1 and "CUDA graphs" in met[0]
    p = {"max_num_seqs": 128.0, "max_num_batched_tokens": 512.0, "block_size": 16.0}
    assert spec.refusal(a100, {**p, "gpu_memory_utilization": 0.98}) is not None
    assert spec.refusal(a100, {**p, "gpu_memory_utilization": 0.97}) is None


def test_the_grid_is_its_8_settings_with_every_other_argument_at_the_default():
    spec = get_system("vllm-v1")
    h100 = hardware.make_deployment("h100-80gb", "qwen3-8b", tp=1, engine="vllm-v1")
    default = spec.default_params(4096, None, h100)
    grid, stepped = auto_tune_grid(spec, h100, default)
    assert [(g["max_num_seqs"], g["max_num_batched_tokens"]) for g in grid] == \
        [(s, k) for s in AUTO_TUNE_SEQS for k in AUTO_TUNE_TOKENS]
    assert stepped == {} and {g["gpu_memory_utilization"] for g in grid} == {0.98}
    for g in grid:
        assert {k: v for k, v in g.items() if k not in (
            "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization")} == {
            k: v for k, v in default.items() if k not in (
                "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization")}


def test_a_setting_nothing_starts_is_left_out_with_its_reason():
    """A system that refuses every max_num_seqs 256 setting at any utilisation (and
    128 above 0.95): those are left out with the refusal met (auto_tune records a failed
    setting), the others stepped down to 0.95."""
    class Refuses:
        @staticmethod
        def refusal(deployment, p):
            if p["max_num_seqs"] == 256 or p["gpu_memory_utilization"] > 0.95:
                return "gpu_memory_utilization", f"no room at {p['gpu_memory_utilization']}"
            return None

    grid, stepped = auto_tune_grid(Refuses(), None, {"block_size": 16.0})
    assert [g["max_num_seqs"] for g in grid] == [128.0] * 4
    assert {g["gpu_memory_utilization"] for g in grid} == {0.95}
    assert len(stepped) == 8
    assert all(stepped[f"128/{k}"] == {"util": 0.95, "steps": 3, "first": "no room at 0.98"}
               for k in AUTO_TUNE_TOKENS)
    assert all(stepped[f"256/{k}"]["util"] is None
               and "no gpu_memory_utilization from 0.98 down to 0.5" in
               stepped[f"256/{k}"]["first"] for k in AUTO_TUNE_TOKENS)


def test_the_fit_searches_the_grid_first_only_for_vllm_engine_arguments():
    logs = []
    whole = build_scenario(ScenarioSpec(trace="sharegpt", hardware="h100-80gb",
                                        model="qwen3-8b", n_requests=40, n_slots=32,
                                        max_batch=32, scheduler="chunked"))
    grid = fit_cli._grid("vllm-v1", whole, 8, logs.append, "--evals 9")
    assert len(grid) == 8 and logs == []
    assert fit_cli._grid("vllm-v1", whole, 7, logs.append, "--evals 8") is None
    assert "--evals 8 leaves room for 7 of its 8 settings" in logs[0]
    odma = build_scenario(ScenarioSpec(n_requests=40, n_slots=32, max_batch=32))
    assert fit_cli._grid("odma", odma, 24, logs.append, "x") is None and len(logs) == 1


def test_the_fit_warns_when_requests_arrive_in_groups_sharing_an_instant():
    """Mooncake's conversation trace: requests in groups at one timestamp (a rescaled
    rate keeps them together); Poisson arrivals and Azure's own times: no warning."""
    kw = dict(hardware="h100-80gb", model="qwen3-8b", n_requests=200, n_slots=32,
              max_batch=32, scheduler="chunked")
    msg = fit_cli.shared_instants(build_scenario(ScenarioSpec(trace="mooncake", **kw)))
    assert msg.startswith("200 of the slice's 200 requests (100%) share their arrival")
    for trace in ("sharegpt", "azure-conv"):
        assert fit_cli.shared_instants(build_scenario(ScenarioSpec(trace=trace, **kw))) \
            is None
