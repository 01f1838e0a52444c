"""The predicted step drawn as a Chrome / Perfetto trace (issue 34, item 3): parsed back, it
holds every op once, no two events overlap on one stream, a collective overlaps the compute
by the time the model says it hides, and it ends when the step does."""

import gzip
import json

import pytest

import fxshape

transformers = pytest.importorskip("transformers")


def _gpt2(n_layer=2, n_embd=1024):
    import torch

    cfg = transformers.GPT2Config(n_layer=n_layer, n_head=4, n_embd=n_embd, vocab_size=1024,
                                  n_positions=512)
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(cfg)


def _x(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def _no_overlap(events):
    by = {}
    for e in events:
        by.setdefault((e["pid"], e["tid"]), []).append(e)
    for evs in by.values():
        evs.sort(key=lambda e: (e["ts"], e["dur"]))
        for a, b in zip(evs, evs[1:]):
            if a["dur"] > 0 and b["dur"] > 0:
                assert a["ts"] + a["dur"] <= b["ts"] + 1e-6, (a["name"], b["name"])


def _overlap(a, intervals) -> float:
    s, e = a
    return sum(max(0.0, min(e, y) - max(s, x)) for x, y in intervals)


@pytest.fixture(scope="module")
def dp_report():
    # 8-way data parallel: the gradient all-reduce partly hidden under the backward
    return fxshape.analyze(_gpt2(), gpu="h100", seq_len=512, batch_size=4, mode="train",
                           dp=8, provenance=None)


def test_a_single_gpu_step(dp_report, tmp_path):
    r = dp_report
    path = r.to_chrome_trace(str(tmp_path / "step.json"))
    doc = json.load(open(path))
    ev = _x(doc)
    kernels = [e for e in ev if e["cat"] == "kernel"]
    host = [e for e in ev if e["cat"] == "cpu_op"]
    # every op with device time once (a collective in pieces: the stretches of compute
    # it hides under, then its exposed part), every op with host time once
    compute_nodes = [e["args"]["node"] for e in kernels if e["tid"] == 7]
    assert sorted(compute_nodes) == sorted(o.node for o in r.ops
                                           if o.time_s > 0 and o.cls != "communication")
    assert {e["args"]["node"] for e in kernels if e["tid"] == 20} == {
        o.node for o in r.ops if o.cls == "communication"}
    assert sorted(e["args"]["node"] for e in host) == sorted(
        o.node for o in r.ops if o.host_s > 0)
    _no_overlap(ev)
    # the trace ends when the predicted step does
    assert max(e["ts"] + e["dur"] for e in ev) == pytest.approx(r.step.time_s * 1e6, abs=1e-3)
    # a kernel starts no earlier than the host launched it (the all-reduce aside: one event
    # for the buckets launched through the backward, whose hidden part runs before the
    # record's place in program order)
    launch = {e["args"]["correlation"]: e["ts"] for e in ev if e["cat"] == "cuda_runtime"}
    assert all(e["ts"] >= launch[e["args"]["correlation"]] - 1e-6 for e in kernels
               if e["tid"] == 7)
    # the all-reduce overlaps the compute stream by what the model hides
    (dp,) = [o for o in r.ops if o.node == "dp.all_reduce"]
    assert dp.overlapped_s > 0
    comm = [e for e in kernels if e["tid"] == 20]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if e["tid"] == 7]
    hidden = sum(_overlap((e["ts"], e["ts"] + e["dur"]), compute) for e in comm)
    assert hidden == pytest.approx(dp.overlapped_s * 1e6, rel=1e-6)
    # and the collective's pieces add up to its whole time: hidden plus exposed
    assert sum(e["dur"] for e in comm) == pytest.approx(
        (dp.overlapped_s + dp.time_s) * 1e6, rel=1e-6)
    assert doc["otherData"]["step_s"] == r.step.time_s


def test_the_same_report_writes_the_same_bytes(dp_report, tmp_path):
    a = dp_report.to_chrome_trace(str(tmp_path / "a.json.gz"))
    b = dp_report.to_chrome_trace(str(tmp_path / "b.json.gz"))
    assert open(a, "rb").read() == open(b, "rb").read()
    assert json.loads(gzip.open(a).read())["traceEvents"]


def test_pipeline_ranks_are_processes(tmp_path):
    m = 4
    r = fxshape.analyze(_gpt2(n_layer=2, n_embd=256), gpu="h100", seq_len=128, mode="train",
                        provenance=None, parallel=fxshape.Parallel(pp=2, microbatches=m))
    doc = json.load(open(r.to_chrome_trace(str(tmp_path / "pp.json"))))
    ev = _x(doc)
    _no_overlap(ev)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert len(names) == 2 and all(n.startswith("rank ") for n in names)
    passes = {(e["pid"], e["args"]["pass"], e["args"]["micro"]): e for e in ev
              if "pass" in e["args"]}
    # each rank runs every micro-batch forward and backward once
    assert len(passes) == 2 * 2 * m
    for i in range(m):
        f0, f1 = passes[(0, "F", i)], passes[(1, "F", i)]
        b0, b1 = passes[(0, "B", i)], passes[(1, "B", i)]
        # rank 1's forward waits for rank 0's; rank 0's backward for rank 1's
        assert f1["ts"] >= f0["ts"] + f0["dur"] - 1e-6
        assert b0["ts"] >= b1["ts"] + b1["dur"] - 1e-6
    assert max(e["ts"] + e["dur"] for e in ev) == pytest.approx(r.step.time_s * 1e6,
                                                                abs=1e-3)


def test_a_plans_tail_draws_its_exposed_sync_before_the_optimizer(tmp_path):
    r = fxshape.analyze(_gpt2(n_layer=2, n_embd=256), gpu="h100", seq_len=128, mode="train",
                        provenance=None, parallel=fxshape.Parallel(pp=2, dp=2, microbatches=2))
    ev = _x(json.load(open(r.to_chrome_trace(str(tmp_path / "t.json")))))
    _no_overlap(ev)
    for st in r.step.stages:
        sync = [e for e in ev if e["pid"] == st.rank and e["name"].startswith("gradient sync")]
        opt = [e for e in ev if e["pid"] == st.rank and e["name"] == "optimizer"]
        comm = st.tail_s - st.optimizer_s
        assert comm > 0 and st.optimizer_s > 0  # dp=2 synchronises the gradients
        (sync,), (opt,) = sync, opt
        # the sync starts when the rank's last pass ends, on its own stream; the optimizer
        # follows it on the compute stream; together they are the rank's tail
        assert sync["ts"] == pytest.approx(st.end_s * 1e6, abs=1e-3)
        assert sync["tid"] != opt["tid"]
        assert opt["ts"] == pytest.approx(sync["ts"] + sync["dur"], abs=1e-3)
        assert sync["dur"] + opt["dur"] == pytest.approx(st.tail_s * 1e6, abs=1e-3)


@pytest.mark.parametrize("plan,micro", [(fxshape.Parallel(dp=2, zero=3), 1),
                                        (fxshape.Parallel(microbatches=2), 2),
                                        (fxshape.Parallel(dp=2, zero=1, microbatches=3), 3)])
def test_a_plan_without_a_pipeline_draws_the_reported_step(tmp_path, plan, micro):
    """Issue 52: under ZeRO-3 the drawn step was the eager one (4.69 ms against 4.21 ms
    reported, no sharded collective), and of 2 micro-batches one was drawn."""
    r = fxshape.analyze(_gpt2(n_layer=2, n_embd=256), gpu="h100", seq_len=128, mode="train",
                        provenance=None, parallel=plan)
    ev = _x(json.load(open(r.to_chrome_trace(str(tmp_path / "t.json")))))
    _no_overlap(ev)
    # every micro-batch's forward and backward, the last event ending where the step does
    assert sum(e["name"].startswith("forward micro-batch") for e in ev) == micro
    assert sum(e["name"].startswith("backward micro-batch") for e in ev) == micro
    assert max(e["ts"] + e["dur"] for e in ev) == pytest.approx(r.step.time_s * 1e6,
                                                                 abs=1e-3)
    assert [e["name"] for e in ev][-1] == "optimizer"
    # FSDP2 gathers the parameters in the compute dtype: its ops run no autocast casts,
    # as its step prices none (ZeRO-1 keeps them)
    casts = [o for o in r.ops if o.op == "autocast weight casts"]
    assert (casts == []) == (plan.zero == 3)


def test_the_command_line_and_bad_input(tmp_path, capsys):
    import torch

    from fxshape import cli
    from fxshape.report.chrome import chrome_trace

    assert cli.main(["analyze", "gpt2", "--gpu", "h100", "--seq-len", "64",
                     "--format", "chrome-trace"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["otherData"]["gpu"] == "h100-sxm" and _x(doc)
    assert cli.main(["analyze", "gpt2", "--seq-len", "64", "--pad",
                     "--format", "chrome-trace"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--format chrome-trace has no place" in err and "\n" not in err
    bare = fxshape.Report(rows=(), unsupported=(), gpu="h100-sxm", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="no predicted step to draw"):
        chrome_trace(bare)
