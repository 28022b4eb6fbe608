"""Calibration: the roofline step-time model fitted to the operator's own benchmark runs.

:mod:`tuner.calibration.roofline_fit` is the fit (gradient through the run's schedule,
or CMA-ES); :mod:`tuner.calibration.measured` turns a measured run into a target and
compares a simulated run with it. ``python -m tuner.calibrate`` is the command line;
the profile it writes is read by :mod:`hardware.profile`.
"""
