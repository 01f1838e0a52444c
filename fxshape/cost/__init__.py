"""Cost models: how long one kernel takes on one GPU, as pure functions of its shape.

``gemm`` is the GEMM model (tiles, waves, alignment, memory traffic; ``predict_matmul``),
``simt`` the fp32 SIMT sgemm kernel menus it uses without TF32, ``attention`` the fused
attention model (``predict_attention``), ``memops`` memory-bound kernels (``predict_memop``),
``quant`` quantized linear layers as inference engines run them (weight-only int8 and
int4, FP8 ``_scaled_mm``; ``predict_quantized``), ``float8`` FP8 training as torchao's float8
runs it (``predict_float8``), ``notes`` how predictions word their notes, ``paramfile`` how parameter files are read. Their
constants come from ``fxshape/data/`` (fitted by ``fxshape.fit`` and ``bench/``). The step's
other cost models (collectives, the optimizer) belong here too.

May import: hardware.
"""
