"""Padding: run GEMMs at aligned sizes with identical results.

``plan`` decides per GEMM whether padding M, N or K pays, copies included (``can_pad``: may
we; ``best_padding``: is it worth it; ``plan_padding``), ``rewrite`` is ``fxshape.pad`` (a
copy of the model whose linear layers run padded, ties kept) and ``compile`` the
``torch.compile`` backend that pads compiled forward and backward graphs.

May import: hardware, cost, tracing, config, analysis, execution, report.
"""
