"""CUDA-graph replay vs eager launch as two regimes of a kernel's fixed cost (issue 50):
``fxshape.cost.host.launch_gap_s`` and the step's records (``fxshape.execution.step``)."""

import dataclasses
import os

import pytest
import torch
from torch import nn

import fxshape
from fxshape.execution.step import OpRecord, launch_regime
from fxshape.cost.host import host_params, launch_gap_s
from fxshape.fit.calibration import calibration_dir

GAP = host_params().eager_gap_s


def test_the_gap_moves_a_kernel_into_the_other_regime():
    hp = dataclasses.replace(host_params(), eager_gap_s=1.7e-6)
    # constants fitted on CUDA-graph replays (today's H100 and B200): an eager or compiled
    # run launches each kernel from the host and pays the gap; a graph replay does not
    assert launch_gap_s("eager", True, hp) == 1.7e-6
    assert launch_gap_s("compiled", True, hp) == 1.7e-6
    assert launch_gap_s("cudagraphs", True, hp) == 0.0
    # constants timed as single eager launches (the 2022-2024 fits): their fitted fixed
    # cost stands in both regimes (taking the gap out under a graph replay was tried and
    # refuted by the held-out CUDA-graphed decode runs: docs/step.md)
    assert launch_gap_s("eager", False, hp) == 0.0
    assert launch_gap_s("cudagraphs", False, hp) == 0.0
    with pytest.raises(ValueError, match="unknown execution 'graphs'; accepted"):
        launch_gap_s("graphs", True, hp)


def _rec(cls, kernels, time_s):
    return OpRecord("n", "op", "m", "forward", cls, kernels, 0, 0, time_s, 1e-5)


def test_records_take_the_gap_of_their_constants():
    assert GAP > 0  # the packaged figure: bench/fit_host.py's trace measurement
    gemm, mem, view = _rec("gemm", 2, 10e-6), _rec("memory", 3, 20e-6), _rec("view", 0, 0.0)
    # H100: GEMM constants from CUDA-graph replays; memory-bound kernels timed eagerly
    h_eager = launch_regime([gemm, mem, view], "eager", "h100")
    assert h_eager[0].time_s == pytest.approx(10e-6 + 2 * GAP)  # 2 kernels, a gap each
    assert h_eager[1].time_s == pytest.approx(20e-6) and h_eager[2] == view
    h_graph = launch_regime([gemm, mem], "cudagraphs", "h100")
    assert [r.time_s for r in h_graph] == [10e-6, 20e-6]
    # A100: every constant timed eagerly: its fitted times in both regimes
    for execution in ("eager", "compiled", "cudagraphs"):
        got = launch_regime([gemm, mem], execution, "a100")
        assert [r.time_s for r in got] == [10e-6, 20e-6]
    # under the 2024 generation the H100's GEMMs are eagerly timed too
    with fxshape.use_params("2024"):
        assert launch_regime([gemm], "eager", "h100")[0].time_s == 10e-6


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(256, 1024), nn.Linear(1024, 256)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("gpu", ["h100", "a100", "b200"])
def test_a_graph_replay_is_never_slower_than_host_launches(gpu):
    x = (torch.randn(8, 16, 256),)
    compiled = fxshape.analyze(_MLP(), x, gpu=gpu, execution="compiled").step
    graphs = fxshape.analyze(_MLP(), x, gpu=gpu, execution="cudagraphs").step
    assert graphs.kernels == compiled.kernels  # the same Inductor kernels, launched two ways
    assert graphs.gpu_s <= compiled.gpu_s and graphs.time_s <= compiled.time_s
    if gpu != "a100":  # graph-timed GEMM constants: the host's launches add the gap, two
        # GEMMs of the MLP a gap each (the memory-bound kernels' constants are eager-timed)
        assert compiled.gpu_s - graphs.gpu_s == pytest.approx(2 * GAP)


@pytest.mark.needs_data(os.path.join(calibration_dir(), "traces"))
def test_fit_host_measures_the_packaged_gap():
    # bench/fit_host.py: the median gap between queued kernels of the H100 eager trace
    import fit_host

    gap, table = fit_host.eager_gap()
    assert gap == GAP and 1e-6 < gap < 3e-6
    # the graph-replayed MI300X trace's kernels run back to back
    graph = [row for row in table if "graph_replay" in row[0]]
    assert graph and float(graph[0][2]) < 0.05
