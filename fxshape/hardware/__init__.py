"""Hardware: what the GPUs are and what the dtypes mean.

``gpus`` holds one frozen :class:`~fxshape.hardware.gpus.GPUSpec` per GPU (SMs, clocks, peak
rates per dtype, bandwidth, L2, tile menus), each figure with its source; ``dtypes`` maps
dtype names to the canonical math modes (fp16, bf16, tf32, fp32, fp8) and their sizes;
``topology`` the interconnects (NVSwitch, NVLink pairs, PCIe, InfiniBand) with sourced link
bandwidths. Pure
data and lookups: the bottom of the package.

May import: nothing of fxshape.
"""
