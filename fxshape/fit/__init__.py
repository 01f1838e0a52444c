"""Fitting: measured times in, model constants out.

``calibration`` is the measured-data schema (read, write, locate ``../shared/calibration``),
``fitting`` fits the GEMM model's constants to such rows (``bench/fit_model.py`` and
``fxshape calibrate`` use it), ``measure`` times GEMMs on the local GPU with CUDA events and
``calibrate`` is the ``fxshape calibrate`` command (measure this GPU, fit, write a parameter
file). numpy and scipy are imported here only, inside functions.

May import: hardware, cost.
"""
