"""Workloads: real-trace loaders, arrival processes, presets, the length predictor, its
prompt features and the prediction-error model (what the tuner simulates, not how it
tunes)."""
