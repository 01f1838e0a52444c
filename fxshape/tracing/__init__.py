"""Tracing: a model in, an aten-level FX graph with a shape on every node out.

``export`` is ``capture`` (``torch.export`` on meta or fake tensors, then ``make_fx``; inputs
synthesized for Hugging Face models; joint forward-backward graphs for training), ``configs``
checks a model's config before it is built (one line naming the field and the rule), ``attnops``
keeps ``scaled_dot_product_attention`` whole as fused custom ops, ``dedup`` finds layer
stacks and builds the reduced copies that are traced in their place, ``decode`` wraps a causal
LM with a static KV cache so that one decode step can be captured. Nothing here knows
what an op costs: which nodes are GEMMs comes from the op registry, which installs itself
(``export.set_labelled_ops``).

May import: hardware.
"""
