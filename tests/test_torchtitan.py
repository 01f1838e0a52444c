"""torchtitan jobs (``fxshape.read_torchtitan``, ``--torchtitan``): the TOML and JSON job
files read into the plan, batch, dtype, recomputation and execution torchtitan runs, checked
against torchtitan's own rules by hand; bad input; the CLI on the smallest job."""

import json
import subprocess
import sys

import pytest

import fxshape
from fxshape.torchtitan import read_torchtitan

pytest.importorskip("transformers")

DEBUG = """
[model]
name = "llama3"
flavor = "debugmodel"

[training]
local_batch_size = 8
seq_len = 256

[parallelism]
data_parallel_shard_degree = -1
tensor_parallel_degree = 2
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "1F1B"

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""


def _write(tmp_path, text, name="job.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_toml_job_as_torchtitan_runs_it(tmp_path):
    job = read_torchtitan(_write(tmp_path, DEBUG), gpus=8)
    p = job.parallel
    # dp_shard -1 takes what tp 2 x pp 2 leave of 8 GPUs: 2 ranks, so FSDP (zero 3) over 2
    assert (p.tp, p.pp, p.dp, p.cp, p.zero) == (2, 2, 2, 1, 3) and job.gpus == 8
    # a pipeline: micro-batches of pipeline_parallel_microbatch_size (default 1) sequences,
    # local_batch_size / 1 = 8 of them; the global batch 8 per rank x 2 ranks = 16
    assert (job.micro_batch, p.microbatches, job.global_batch) == (1, 8, 16)
    # "default" resharding is off under a pipeline; sequence parallelism on with tp
    assert p.reshard_after_forward is False and p.sequence_parallel is True
    # torchtitan splits the stages weighing the embedding and the head as a layer each:
    # the debugmodel's 6 layers + 2 over 2 stages are 4 each, so (3, 3)
    assert p.stage_layers == "torchtitan"
    # the op-level policy (every second matmul and the memory-bound ops recomputed)
    assert (job.dtype, job.recompute, job.execution, job.seq_len) == \
        ("bf16", "op", "eager", 256)
    model = job.model()
    assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 256
    # torchtitan 0.3's debugmodel SwiGLU width: int(2 x 4 x 256 / 3) = 682, up to 256: 768
    assert model.config.intermediate_size == 768
    # the 70B: int(8 x 8192 / 3) = 21845, x 1.3 = 28398, up to 4096: 28672 (Llama 3 70B's)
    from fxshape.torchtitan import TITAN_MODELS
    assert TITAN_MODELS[("llama3", "70B")][0]["intermediate_size"] == 28672


def test_accumulation_hsdp_ddp_and_float8(tmp_path):
    text = """
[model]
name = "llama3"
flavor = "8B"
converters = ["float8"]
[training]
local_batch_size = 2
global_batch_size = 64
seq_len = 1024
mixed_precision_param = "float32"
[compile]
enable = true
[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 4
[activation_checkpoint]
mode = "full"
"""
    job = read_torchtitan(_write(tmp_path, text))
    p = job.parallel
    # replicate 2 x shard 4 = 8 data-parallel ranks: HSDP, one copy sharded over 4
    assert (p.dp, p.dp_shard, p.zero, job.gpus) == (8, 4, 3, 8)
    # 64 sequences = 2 per rank x 8 ranks x 4 accumulation steps
    assert (job.micro_batch, p.microbatches, job.global_batch) == (2, 4, 64)
    assert (job.dtype, job.recompute, job.execution) == ("fp32", "full", "compiled")
    assert any("float8" in n for n in job.notes)
    # replicate only: DDP
    ddp = read_torchtitan(_write(tmp_path, DEBUG.replace(
        "data_parallel_shard_degree = -1", "data_parallel_replicate_degree = 2\n"
        "data_parallel_shard_degree = 1")))
    assert (ddp.parallel.dp, ddp.parallel.zero, ddp.gpus) == (2, 0, 8)


def test_a_torchtitan_0_3_json_dump(tmp_path):
    # what `--debug.save_config_file` writes: Trainer.Config.to_dict(), the model under
    # model_spec; the checkpointing policy known by its fields (SelectiveAC's
    # force_recompute_mm_shapes_by_fqns; FullAC has none of its own; null: none)
    base = {"model_spec": {"name": "llama3", "flavor": "debugmodel", "model": {}},
            "training": {"local_batch_size": 4, "seq_len": 128},
            "parallelism": {"data_parallel_shard_degree": 2, "tensor_parallel_degree": 1},
            "compile": {"enable": False}}
    for ac, want in (({"force_recompute_mm_shapes_by_fqns": ["moe.router.gate"]},
                      "op"), ({}, "full"), (None, None)):
        path = _write(tmp_path, json.dumps({**base, "activation_checkpoint": ac}), "j.json")
        job = read_torchtitan(path)
        assert job.recompute == want
        assert (job.parallel.dp, job.parallel.zero, job.micro_batch) == (2, 3, 4)


@pytest.mark.parametrize("edit,match", [
    (('flavor = "debugmodel"', 'flavor = "3B"'), "flavor '3B' is not one fxshape defines"),
    (('pipeline_parallel_schedule = "1F1B"',
      'pipeline_parallel_schedule = "InterleavedZeroBubble"'),
     "InterleavedZeroBubble' is not modelled; accepted: 1F1B, GPipe, Interleaved1F1B, "
     "ZBVZeroBubble"),
    (('pipeline_parallel_schedule = "1F1B"', 'pipeline_parallel_schedule = "ZBVZeroBubble"\n'
      'pipeline_parallel_layers_per_stage = 1'),
     "ZBVZeroBubble runs exactly two stages per rank"),
    (('selective_ac_option = "op"', 'selective_ac_option = "2"'),
     "selective_ac_option '2'.*accepted: 'op'"),
    (('local_batch_size = 8', 'local_batch_size = 0'),
     "local_batch_size = 0; accepted: an integer >= 1"),
    (('local_batch_size = 8', 'local_batch_size = 8\nglobal_batch_size = 20'),
     "global_batch_size 20 is not a multiple of local_batch_size x data-parallel ranks = 16"),
    (('[model]', '[model'), "not valid TOML"),
])
def test_bad_jobs(tmp_path, edit, match):
    path = _write(tmp_path, DEBUG.replace(*edit))
    with pytest.raises(ValueError, match=match):
        read_torchtitan(path, gpus=8)


@pytest.mark.parametrize("edit,match", [
    # a misspelt key or section: refused with the close match, not ignored
    (("tensor_parallel_degree = 2", "tensor_paralel_degree = 2"),
     r"unknown key 'tensor_paralel_degree' in \[parallelism\]; did you mean "
     r"'tensor_parallel_degree'\?"),
    (("[parallelism]", "[paralelism]"), r"unknown section \[paralelism\]; did you mean "
                                        r"\[parallelism\]\?"),
    # a key with no near miss in a section fxshape reads: refused, naming what is accepted
    (("seq_len = 256", "seq_len = 256\nwhatever = 1"), r"unknown key 'whatever' in "
                                                         r"\[training\]; accepted: "),
    # booleans are booleans ("false" would have turned sequence parallelism on)
    (("tensor_parallel_degree = 2", 'tensor_parallel_degree = 2\n'
      'enable_sequence_parallel = "false"'),
     "enable_sequence_parallel = 'false'; accepted: true or false"),
    # a string where a table belongs (it was read as full recomputation)
    (('[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "op"', ''),
     None),
    # a list where a table belongs (an AttributeError before)
    (("\n[model]", 'compile = [true]\n[model]'),
     r"\[compile\] must be a table of settings, got list"),
    # degrees: zero, a word, a float (ZeroDivisionError / TypeError before)
    (("tensor_parallel_degree = 2", "tensor_parallel_degree = 0"),
     "tensor_parallel_degree = 0; accepted: an integer >= 1"),
    (("tensor_parallel_degree = 2", 'tensor_parallel_degree = "two"'),
     "tensor_parallel_degree = 'two'; accepted: an integer >= 1"),
    (('pipeline_parallel_schedule = "1F1B"', 'pipeline_parallel_schedule = "Interleaved1F1B"\n'
      'pipeline_parallel_layers_per_stage = 0'),
     "pipeline_parallel_layers_per_stage = 0; accepted: an integer >= 1"),
    (('pipeline_parallel_schedule = "1F1B"', 'pipeline_parallel_schedule = ["1F1B"]'),
     r"pipeline_parallel_schedule = \['1F1B'\]; accepted: a string"),
    # a reduction dtype torchtitan does not take (read as fp32 before)
    (("seq_len = 256", 'seq_len = 256\nmixed_precision_reduce = "int8"'),
     "mixed_precision_reduce 'int8'; accepted: float32, bfloat16"),
    (("seq_len = 256", "seq_len = 256\nmixed_precision_param = [1]"),
     r"mixed_precision_param \[1\]; accepted: bfloat16, float32"),
    (('name = "llama3"', 'name = ["llama3"]'), r"model \['llama3'\] flavor"),
])
def test_hostile_jobs_are_refused_in_one_line(tmp_path, edit, match):
    """Issue 52: job files written by hand, each refused in one line naming what is
    accepted (they raised AttributeError, ZeroDivisionError, TypeError, or were read wrong)."""
    assert edit[0] in DEBUG
    text = DEBUG.replace(*edit, 1)
    if match is None:  # a string where a table belongs (it was read as full recomputation)
        text = 'activation_checkpoint = "none"\n' + text
        match = r"\[activation_checkpoint\] must be a table of settings, got str 'none'"
    path = _write(tmp_path, text)
    with pytest.raises(ValueError, match=match) as err:
        read_torchtitan(path, gpus=8)
    assert "\n" not in str(err.value)


def test_a_section_torchtitan_has_but_fxshape_does_not_read_is_noted(tmp_path):
    job = read_torchtitan(_write(tmp_path, DEBUG + '\n[metrics]\nlog_freq = 1\n'
                                                 '[my_team_settings]\nx = 1\n'), gpus=8)
    # [metrics] is torchtitan's (nothing fxshape prices); a section torchtitan does not have
    # and that is no near miss of one is said, not silently dropped
    assert any("[my_team_settings]" in n and "ignored" in n for n in job.notes)
    assert not any("[metrics]" in n for n in job.notes)


def test_world_size_errors(tmp_path):
    path = _write(tmp_path, DEBUG)
    with pytest.raises(ValueError, match=r"-1 .*give the number of GPUs \(--gpus\)"):
        read_torchtitan(path)
    with pytest.raises(ValueError, match="6 GPUs are not a multiple of tp x pp x cp x "
                                         "dp_replicate = 4"):
        read_torchtitan(path, gpus=6)
    fixed = _write(tmp_path, DEBUG.replace("= -1", "= 2"), "fixed.toml")
    with pytest.raises(ValueError, match="multiply to 8 GPUs .* not 16"):
        read_torchtitan(fixed, gpus=16)
    with pytest.raises(ValueError, match="no such file"):
        read_torchtitan(str(tmp_path / "missing.toml"))


def test_analyze_a_job_from_the_command_line(tmp_path):
    path = _write(tmp_path, DEBUG)
    out = subprocess.run([sys.executable, "-m", "fxshape", "analyze", "--torchtitan", path,
                          "--gpus", "8", "--format", "json"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["torchtitan"]["parallel"]["pp"] == 2 and doc["step"]["microbatches"] == 8
    # the CLI's report is analyze's for the job's plan
    job = read_torchtitan(path, gpus=8)
    rep = fxshape.analyze(job.model(), batch_size=job.micro_batch, seq_len=job.seq_len,
                          mode="train", parallel=job.parallel, recompute=job.recompute,
                          provenance=None)
    assert doc["step"]["time_s"] == rep.step.time_s
    # a plan option beside the job: refused, naming it
    bad = subprocess.run([sys.executable, "-m", "fxshape", "analyze", "--torchtitan", path,
                          "--gpus", "8", "--tp", "4"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "drop --tp" in bad.stderr


def test_plan_refuses_what_the_job_sets(tmp_path, capsys):
    from fxshape.cli import main

    path = _write(tmp_path, DEBUG)
    # the job's sequence length is 256 and its dtype bf16: other values are the user's
    assert main(["plan", "--torchtitan", path, "--gpus", "8", "--seq-len", "512"]) != 0
    assert "--seq-len 512 differs from the torchtitan job's 256" in capsys.readouterr().err
    assert main(["plan", "--torchtitan", path, "--gpus", "8", "--dtype", "fp16"]) != 0
    assert "--dtype fp16 differs from the torchtitan job's bf16" in capsys.readouterr().err


def test_a_zbv_job_reads_as_the_v_schedule(tmp_path):
    # torchtitan's ZBVZeroBubble: two stages a rank placed in a V (schedule="zbv")
    path = _write(tmp_path, DEBUG.replace('pipeline_parallel_schedule = "1F1B"',
                                          'pipeline_parallel_schedule = "ZBVZeroBubble"'))
    job = read_torchtitan(path, gpus=8)
    p = job.parallel
    assert p.schedule == "zbv" and p.virtual_stages == 2 and p.pp == 2
    assert p.schedule_name.startswith("zero bubble ZB-V")


def test_async_tp_job(tmp_path):
    # torchtitan's async TP: tensor and sequence parallelism under torch.compile
    text = DEBUG.replace("[parallelism]", "[parallelism]\nenable_async_tensor_parallel = true")
    compiled = text.replace("[training]", "[compile]\nenable = true\n\n[training]", 1)
    job = read_torchtitan(_write(tmp_path, compiled), gpus=8)
    assert job.parallel.async_tp and job.parallel.sequence_parallel
    assert job.execution == "compiled"
    # eager: torchtitan refuses it, so does the reader (one line)
    with pytest.raises(ValueError, match="enable_async_tensor_parallel needs tensor "
                                         "parallelism with sequence parallelism under "
                                         "torch.compile"):
        read_torchtitan(_write(tmp_path, text, "eager.toml"), gpus=8)
