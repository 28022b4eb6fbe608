"""Export: what an engineer takes away.

- :mod:`~tuner.export.policy`: the policy file (schema, validation on load);
- :mod:`~tuner.export.deployment`: the vLLM arguments and the measurement kit;
- :mod:`~tuner.export.bench_dataset`: dataset files ``vllm bench serve`` replays.

Modules are imported on demand (nothing is imported here).
"""
