"""torchtitan job configurations: the run a torchtitan user is about to launch, as fxshape
sees it (a model, a :class:`~fxshape.parallelism.plan.Parallel`, the batch, the sequence
length, the dtype, the recomputation and the execution).

:func:`read_torchtitan` reads a job file in torchtitan's TOML format (``[model] name`` and
``flavor``, ``[training]``, ``[parallelism]``, ``[activation_checkpoint]``, ``[compile]``,
``[float8]`` / ``[quantize.linear.float8]`` and ``[model] converters``: the files under
``torchtitan/models/*/train_configs/`` up to torchtitan 0.2, and what users keep), or the JSON
torchtitan 0.3 writes with ``--debug.save_config_file`` (0.3 builds its configurations in
Python, ``config_registry.py``; the same sections, ``model_spec`` naming the model).
torchtitan itself is not needed.

What is read and how it maps (torchtitan 0.3's ``torchtitan/config/configs.py``,
``torchtitan/distributed/pipeline_parallel.py``):

- ``local_batch_size`` (``batch_size`` in older files) sequences per data-parallel rank;
  ``global_batch_size`` (-1: local × data-parallel ranks) larger than that means gradient
  accumulation; under a pipeline, ``pipeline_parallel_microbatch_size`` sequences per
  micro-batch. fxshape's micro-batches per step are the pipeline's times the accumulation.
- ``data_parallel_shard_degree`` (-1: what the other degrees leave of the GPUs) > 1 is FSDP
  (``zero=3``), over ``dp_shard`` ranks, replicated ``data_parallel_replicate_degree`` times
  (HSDP); replicate alone is DDP. ``fsdp_reshard_after_forward`` "default" reshards unless
  there is a pipeline.
- ``pipeline_parallel_schedule``: 1F1B, GPipe, Interleaved1F1B (two virtual stages per rank
  unless ``pipeline_parallel_layers_per_stage`` says otherwise), ZBVZeroBubble (two stages a
  rank in a V: ``schedule="zbv"``); other schedules (InterleavedZeroBubble, LoopedBFS,
  DualPipeV) are refused.
- ``activation_checkpoint.mode``: none, full, selective with ``selective_ac_option = "op"``
  (predicted as fxshape's selective recomputation, Megatron's attention core: torchtitan's
  op-level policy keeps matmul outputs and recomputes every second one and the pointwise ops,
  which the note says); a layer-interval option ("2": every second layer) is refused.
- ``mixed_precision_param`` the compute dtype (bfloat16 by default), ``mixed_precision_reduce``
  the gradients' (fp32); ``compile`` on: ``execution="compiled"``.
- ``enable_async_tensor_parallel``: ``Parallel(async_tp=True)`` (needs tensor and sequence
  parallelism under torch.compile, as torchtitan does).
- The ``float8`` converter (torchao's tensorwise or rowwise recipe) and the ``mx`` converter
  (mxfp8) under torch.compile in bf16: ``float8=`` (``fxshape.cost.float8``); other recipes
  are noted and predicted as the bf16 run.

Models: ``llama3`` (debugmodel, 8B, 70B, 405B as torchtitan 0.3 defines them), ``qwen3``
(30B-A3B) and ``deepseek_v3`` (671B) through fxshape's presets; any other is refused with
the list.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .parallelism.plan import Parallel

__all__ = ["TitanJob", "read_torchtitan", "TITAN_MODELS"]


def _llama3(dim, layers, heads, kv_heads, vocab, multiple_of, multiplier=None) -> dict:
    """A Llama 3 flavor as torchtitan 0.3 defines it (``torchtitan/models/llama3/__init__.py``),
    as Hugging Face Llama config values; the SwiGLU width as its ``compute_ffn_hidden_dim``:
    ``int(8 × dim / 3)``, times the multiplier, rounded up to ``multiple_of``."""
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return dict(hidden_size=dim, intermediate_size=-(-hidden // multiple_of) * multiple_of,
                num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, vocab_size=vocab,
                max_position_embeddings=131072, rope_theta=500000.0)


#: torchtitan (name, flavor) -> (fxshape preset, or Llama config values; description)
TITAN_MODELS = {
    ("llama3", "debugmodel"): (_llama3(256, 6, 16, 16, 2048, 256),
                               "Llama 3 debug model (6 layers, dim 256)"),
    ("llama3", "8B"): ("llama-3-8b", "Llama 3 8B"),
    ("llama3", "70B"): (_llama3(8192, 80, 64, 8, 128256, 4096, 1.3), "Llama 3 70B"),
    ("llama3", "405B"): (_llama3(16384, 126, 128, 8, 128256, 4096, 1.2), "Llama 3 405B"),
    ("qwen3", "30B-A3B"): ("qwen3-30b-a3b", "Qwen3 30B-A3B"),
    ("deepseek_v3", "671B"): ("deepseek-v3", "DeepSeek-V3 671B"),
}

_SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved1f1b": "interleaved",
              "zbvzerobubble": "zbv"}
_DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


@dataclass(frozen=True)
class TitanJob:
    """A torchtitan job as fxshape predicts it. ``micro_batch``: sequences per micro-batch on
    one rank; ``global_batch``: sequences per optimizer step over all GPUs; ``notes``: what
    the job sets that the prediction does not model, or models differently."""

    source: str
    name: str
    flavor: str
    parallel: Parallel
    gpus: int
    micro_batch: int
    global_batch: int
    seq_len: int
    dtype: str
    execution: str
    notes: tuple = field(default=())
    #: torchao's float8 recipe the job trains with (``analyze(float8=)``), None without
    float8: str | None = None

    @property
    def recompute(self) -> str | None:
        """The activation recomputation (the plan's: ``parallel.recompute``)."""
        return self.parallel.recompute

    def describe(self) -> str:
        return (f"torchtitan {self.name} {self.flavor} on {self.gpus} GPUs: "
                f"{self.parallel.describe()}, micro-batch {self.micro_batch} x "
                f"{self.seq_len} tokens, global batch {self.global_batch}, {self.dtype}, "
                f"recompute {self.recompute or 'none'}, {self.execution}")

    def model(self):
        """The job's model, on the meta device (no weights)."""
        from .presets import build_preset

        spec = TITAN_MODELS[(self.name, self.flavor)][0]
        if isinstance(spec, str):
            return build_preset(spec)
        import torch
        import transformers

        with torch.device("meta"):
            return transformers.LlamaForCausalLM(transformers.LlamaConfig(**spec))


def _load(path: str) -> dict:
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise ValueError(f"torchtitan config {path!r}: no such file (a job .toml, or the "
                         ".json torchtitan 0.3 writes with --debug.save_config_file)")
    text = open(path, "rb").read()
    if str(path).endswith(".json"):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"torchtitan config {path}: not valid JSON "
                             f"({type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise ValueError(f"torchtitan config {path}: not a job (a JSON object of "
                             f"sections, got {type(data).__name__})")
        spec = data.get("model_spec") or {}
        if not isinstance(spec, dict):
            raise ValueError(f"torchtitan config {path}: model_spec must be an object, got "
                             f"{type(spec).__name__}")
        data.setdefault("model", {"name": spec.get("name"), "flavor": spec.get("flavor")})
        return data
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ValueError("reading a torchtitan .toml needs Python 3.11 (tomllib) or the "
                             "tomli package: pip install tomli") from None
    try:
        return tomllib.loads(text.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"torchtitan config {path}: not valid TOML ({exc})") from None


#: torchtitan's job sections (0.1-0.2's ``JobConfig`` of ``torchtitan/config/job_config.py``
#: and 0.3's ``Trainer.Config``, read from the released sources): any other is refused when
#: it is a near miss of one of these, else ignored with a note
SECTIONS = frozenset({
    "job", "profiling", "profiler", "metrics", "model", "model_spec", "optimizer",
    "lr_scheduler", "training", "parallelism", "checkpoint", "activation_checkpoint",
    "float8", "mx", "quantize", "comm", "memory_estimation", "fault_tolerance",
    "experimental", "validation", "validator", "compile", "debug", "dataloader", "tokenizer",
    "override", "loss", "hf_assets_path", "dump_folder"})

#: the keys of the sections fxshape reads, as torchtitan 0.1-0.3 define them (read or not):
#: a key outside these is refused (a misspelt key would otherwise be ignored)
KEYS = {
    "model": {"name", "flavor", "tokenizer_path", "hf_assets_path", "converters",
              "print_after_conversion", "norm_type"},
    "training": {"dataset", "dataset_path", "local_batch_size", "batch_size",
                 "global_batch_size", "seq_len", "max_norm", "steps", "enable_cpu_offload",
                 "disable_cuda_graphs", "dtype", "mixed_precision_param",
                 "mixed_precision_reduce", "compile", "gc_freq", "gc_debug", "seed",
                 "deterministic", "warmup_steps", "data_parallel_degree",
                 "tensor_parallel_degree", "enable_loss_parallel"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "enable_compiled_autograd", "fsdp_reshard_after_forward",
                    "enable_fsdp_symm_mem", "tensor_parallel_degree",
                    "enable_sequence_parallel", "disable_loss_parallel",
                    "enable_async_tensor_parallel", "spmd_backend",
                    "pipeline_parallel_degree", "pipeline_parallel_split_points",
                    "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                    "context_parallel_degree", "context_parallel_rotate_method",
                    "context_parallel_load_balancer", "context_parallel_ptrr_mask_key",
                    "expert_parallel_degree", "expert_tensor_parallel_degree"},
    "activation_checkpoint": {"mode", "selective_ac_option",
                              "per_op_sac_force_recompute_mm_shapes_by_fqns",
                              "force_recompute_mm_shapes_by_fqns", "memory_budget",
                              "visualize_memory_budget_pareto", "preserve_rng_state",
                              "determinism_check", "debug", "early_stop"},
    "compile": {"enable", "enable_async_tensor_parallel", "components", "backend"},
}

_BOOLS = ("enable_sequence_parallel", "enable_async_tensor_parallel", "enable_cpu_offload",
          "compile", "enable")


def _near(word: str, choices) -> str:
    import difflib

    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.75)
    return close[0] if close else ""


def _check_schema(cfg: dict, path: str, notes: list) -> None:
    """Sections are tables of the types torchtitan takes; a misspelt section or a key
    outside torchtitan's in the sections fxshape reads is refused with the close match
    (ignored, it would silently leave a default in place); booleans are booleans."""
    if not isinstance(cfg, dict):
        raise ValueError(f"torchtitan config {path}: not a job (a table of sections, got "
                         f"{type(cfg).__name__})")
    for sec, body in cfg.items():
        if sec not in SECTIONS:
            near = _near(sec, SECTIONS)
            if near:
                raise ValueError(f"torchtitan config {path}: unknown section [{sec}]; did "
                                 f"you mean [{near}]?")
            notes.append(f"section [{sec}] is not one of torchtitan's that fxshape knows: "
                         "ignored")
            continue
        if sec in KEYS and body is not None and not isinstance(body, dict):
            raise ValueError(f"torchtitan config {path}: [{sec}] must be a table of settings, "
                             f"got {type(body).__name__} {body!r}"[:300])
        for key in (body or {}) if sec in KEYS else ():
            if key not in KEYS[sec]:
                near = _near(key, KEYS[sec])
                hint = (f"; did you mean {near!r}?" if near else
                        f"; accepted: {', '.join(sorted(KEYS[sec]))}")
                raise ValueError(f"torchtitan config {path}: unknown key {key!r} in "
                                 f"[{sec}]{hint}")
            v = body[key]
            if key in _BOOLS and not isinstance(v, bool):
                raise ValueError(f"torchtitan config {path}: [{sec}] {key} = {v!r}; "
                                 "accepted: true or false (a boolean, not a string or "
                                 "number)")


def _dtype(v):
    return _DTYPES.get(v) if isinstance(v, str) else None


def _str(section: dict, key: str, default, path: str) -> str:
    v = section.get(key, default)
    if not isinstance(v, str):
        raise ValueError(f"torchtitan config {path}: {key} = {v!r}; accepted: a string")
    return v


def _int(section: dict, key: str, default, path: str, minimum=1, allow=()):
    v = section.get(key, default)
    if v in allow:
        return v
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"torchtitan config {path}: {key} = {v!r}; accepted: an integer "
                         f">= {minimum}" + "".join(f" or {a}" for a in allow))
    return v


def _pipeline(par: dict, name: str, flavor: str, local: int, pp: int, path: str) -> tuple:
    """A pipelined job's ``(micro-batch size, micro-batches per step, virtual stages,
    schedule)``, from its parallelism section."""
    virtual = 1
    micro = _int(par, "pipeline_parallel_microbatch_size", 1, path)
    if local % micro:
        raise ValueError(f"torchtitan config {path}: local_batch_size {local} is not a "
                         f"multiple of pipeline_parallel_microbatch_size {micro}")
    pipe_micro = local // micro
    raw = _str(par, "pipeline_parallel_schedule", "1F1B", path)
    schedule = _SCHEDULES.get(raw.lower())
    if schedule is None:
        raise ValueError(f"torchtitan config {path}: pipeline_parallel_schedule {raw!r} "
                         "is not modelled; accepted: 1F1B, GPipe, Interleaved1F1B, "
                         "ZBVZeroBubble")
    per = _int(par, "pipeline_parallel_layers_per_stage", None, path, allow=(None,))
    if schedule == "interleaved":
        layers = _layers(name, flavor)
        virtual = 2 if per is None else max(1, -(-layers // per) // pp)
        if virtual < 2:
            raise ValueError(f"torchtitan config {path}: Interleaved1F1B needs at least "
                             "two stages per rank")
    if schedule == "zbv":
        layers = _layers(name, flavor)
        virtual = 2 if per is None else max(1, -(-layers // per) // pp)
        if virtual != 2:
            raise ValueError(f"torchtitan config {path}: ZBVZeroBubble runs exactly two "
                             f"stages per rank; pipeline_parallel_layers_per_stage {per} "
                             f"gives {virtual} over {pp} ranks")
    return micro, pipe_micro, virtual, schedule


def _float8_setting(cfg: dict, compiled: bool, dtype: str, notes: list):
    """The FP8 recipe fxshape prices for a job whose converters train in float8, or None
    (the reason in ``notes``)."""
    float8 = None
    recipe = _float8_recipe(cfg)
    if recipe is None:
        notes.append("MX formats (the 'mx' converter) are not modelled yet: predicted "
                     f"as the {dtype} run")
    elif recipe not in ("tensorwise", "rowwise", "mxfp8"):
        notes.append(f"float8 recipe {recipe!r} is not modelled (tensorwise, rowwise "
                     f"and mxfp8 are): predicted as the {dtype} run")
    elif not compiled or dtype != "bf16":
        notes.append(f"float8 {recipe} is priced under torch.compile in bf16 only "
                     f"(fxshape.cost.float8): predicted as the {dtype} run"
                     + ("" if compiled else " without it"))
    else:
        float8 = recipe
        notes.append(f"float8 {recipe} (torchao) priced: fxshape.cost.float8")
    return float8


def read_torchtitan(path, *, gpus: int | None = None) -> TitanJob:
    """The torchtitan job at ``path`` as fxshape predicts it; ``gpus``: the world size
    (``torchrun --nproc_per_node × nodes``), needed when ``data_parallel_shard_degree`` is
    -1 and checked against the degrees otherwise.

    Raises:
        ValueError: a file that is not a torchtitan job, a model or flavor fxshape has no
            definition of, degrees that do not multiply to ``gpus``, batch sizes that do not
            divide, or settings fxshape cannot express (named, with what is accepted).
    """
    path = str(path)
    cfg = _load(path)
    notes = []
    _check_schema(cfg, path, notes)
    model = cfg.get("model") or {}
    name, flavor = model.get("name"), model.get("flavor")
    if not isinstance(name, str) or not isinstance(flavor, str) or \
            (name, flavor) not in TITAN_MODELS:
        known = ", ".join(f"{n} {f}" for n, f in TITAN_MODELS)
        raise ValueError(f"torchtitan config {path}: model {name!r} flavor {flavor!r} is not "
                         f"one fxshape defines; accepted: {known}")
    training = cfg.get("training") or {}
    par = cfg.get("parallelism") or {}
    tp = _int(par, "tensor_parallel_degree", 1, path)
    pp = _int(par, "pipeline_parallel_degree", 1, path)
    cp = _int(par, "context_parallel_degree", 1, path)
    ep = _int(par, "expert_parallel_degree", 1, path)
    rep = _int(par, "data_parallel_replicate_degree", 1, path)
    shard = _int(par, "data_parallel_shard_degree", -1, path, allow=(-1,))
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise ValueError(f"gpus must be a positive integer, got {gpus!r}")
    others = tp * pp * cp * rep
    if shard == -1:
        if gpus is None:
            raise ValueError(f"torchtitan config {path}: data_parallel_shard_degree = -1 "
                             "takes what the other degrees leave of the GPUs: give the "
                             "number of GPUs (--gpus)")
        if gpus % others:
            raise ValueError(f"torchtitan config {path}: {gpus} GPUs are not a multiple of "
                             f"tp x pp x cp x dp_replicate = {others}")
        shard = gpus // others
    world = others * shard
    if gpus is not None and gpus != world:
        raise ValueError(f"torchtitan config {path}: its degrees multiply to {world} GPUs "
                         f"(dp_replicate {rep} x dp_shard {shard} x cp {cp} x tp {tp} x pp "
                         f"{pp}), not {gpus}")
    dp = rep * shard
    local = _int(training, "local_batch_size", training.get("batch_size", 8), path)
    seq = _int(training, "seq_len", 2048, path)
    glob = _int(training, "global_batch_size", -1, path, allow=(-1,))
    glob = local * dp if glob == -1 else glob
    if glob % (local * dp):
        raise ValueError(f"torchtitan config {path}: global_batch_size {glob} is not a "
                         f"multiple of local_batch_size x data-parallel ranks = {local * dp}")
    accumulation = glob // (local * dp)
    micro, pipe_micro, virtual, schedule = (local, 1, 1, "1f1b") if pp == 1 else \
        _pipeline(par, name, flavor, local, pp, path)
    reshard = _str(par, "fsdp_reshard_after_forward", "default", path)
    if reshard not in ("default", "always", "never"):
        raise ValueError(f"torchtitan config {path}: fsdp_reshard_after_forward {reshard!r}; "
                         "accepted: default, always, never")
    reshard_after = reshard == "always" or (reshard == "default" and pp == 1)
    dtype = _dtype(training.get("mixed_precision_param", "bfloat16"))
    if dtype is None:
        raise ValueError(f"torchtitan config {path}: mixed_precision_param "
                         f"{training.get('mixed_precision_param')!r}; accepted: bfloat16, "
                         "float32")
    reduce = _dtype(training.get("mixed_precision_reduce", "float32"))
    if reduce is None:
        raise ValueError(f"torchtitan config {path}: mixed_precision_reduce "
                         f"{training.get('mixed_precision_reduce')!r}; accepted: float32, "
                         "bfloat16")
    recompute = _recompute(cfg.get("activation_checkpoint", {}), path, notes)
    comp = cfg.get("compile") or {}
    compiled = bool(comp.get("enable", training.get("compile", False)))
    sp = tp > 1 and par.get("enable_sequence_parallel", True)
    async_tp = bool(par.get("enable_async_tensor_parallel", False)
                    or comp.get("enable_async_tensor_parallel", False))
    if async_tp and not (compiled and sp):
        raise ValueError(f"torchtitan config {path}: enable_async_tensor_parallel needs "
                         "tensor parallelism with sequence parallelism under torch.compile "
                         f"(tp={tp}, sequence parallel {sp}, compile {compiled})")
    float8 = _float8_setting(cfg, compiled, dtype, notes) if _float8(cfg) else None
    if name == "llama3":
        notes.append("torchtitan fuses the Q, K and V projections into one GEMM; fxshape's "
                     "Llama runs them as three (the same FLOPs)")
    zero = 3 if shard > 1 else 0
    par_obj = Parallel(tp=tp, cp=cp, pp=pp, dp=dp, zero=zero, virtual_stages=virtual,
                       microbatches=pipe_micro * accumulation, schedule=schedule,
                       sequence_parallel=sp, async_tp=async_tp,
                       dp_shard=shard if zero and rep > 1 else None,
                       reshard_after_forward=reshard_after, grad_dtype=reduce, ep=ep,
                       # torchtitan weighs the embedding and the head as a layer each
                       stage_layers="torchtitan" if pp > 1 else None, recompute=recompute)
    return TitanJob(source=path, name=name, flavor=flavor, parallel=par_obj, gpus=world,
                    micro_batch=micro, global_batch=glob, seq_len=seq, dtype=dtype,
                    execution="compiled" if compiled else "eager",
                    notes=tuple(notes), float8=float8)


def _layers(name, flavor) -> int:
    spec = TITAN_MODELS[(name, flavor)][0]
    if isinstance(spec, dict):
        return spec["num_hidden_layers"]
    from .presets import PRESETS

    kw = PRESETS[spec][2]
    return kw.get("num_hidden_layers", kw.get("n_layer", 12))


def _recompute(ac: dict, path: str, notes: list):
    if ac is None:  # 0.3's JSON: no checkpointing
        return None
    if "mode" not in ac:  # 0.3's JSON: the policy's fields say which
        if not ac:
            return "full"
        if "memory_budget" in ac:
            raise ValueError(f"torchtitan config {path}: the memory-budget activation "
                             "checkpointing (compiler-chosen) is not modelled; accepted: "
                             "none, full, selective")
        mode = "selective" if "force_recompute_mm_shapes_by_fqns" in ac else "full"
    else:
        mode = str(ac["mode"])
    if mode == "none":
        return None
    if mode == "full":
        return "full"
    if mode == "selective":
        option = str(ac.get("selective_ac_option", "op"))
        if option != "op":
            raise ValueError(f"torchtitan config {path}: selective_ac_option {option!r} (a "
                             "layer interval) is not modelled; accepted: 'op', or mode "
                             "'full' / 'none'")
        forced = ac.get("force_recompute_mm_shapes_by_fqns") or []
        if forced:
            notes.append("activation checkpointing: the matmuls of "
                         + ", ".join(map(str, forced)) + " (force_recompute_mm_shapes_by_fqns) "
                         "are priced as the op-level policy has them, not always recomputed")
        return "op"
    raise ValueError(f"torchtitan config {path}: activation_checkpoint mode {mode!r}; "
                     "accepted: none, selective, full")


def _float8_recipe(cfg: dict) -> str | None:
    """torchao's recipe of a float8 converter ([quantize.linear.float8] or [float8]
    ``recipe_name``; tensorwise by default), None for the MX converter."""
    conv = (cfg.get("model") or {}).get("converters") or []
    conv = [conv] if isinstance(conv, str) else list(conv)
    if any(str(c).lower() in ("mx", "quantize.linear.mx") for c in conv):
        sec = ((cfg.get("quantize") or {}).get("linear") or {}).get("mx") or \
            cfg.get("mx") or {}
        name = str(sec.get("recipe_name") or "mxfp8_cublas")
        return "mxfp8" if name in ("mxfp8", "mxfp8_cublas") else name
    if not any("float8" in str(c).lower() for c in conv):
        return None
    sec = ((cfg.get("quantize") or {}).get("linear") or {}).get("float8") or \
        cfg.get("float8") or {}
    return str(sec.get("recipe_name") or "tensorwise")


def _float8(cfg: dict) -> bool:
    conv = (cfg.get("model") or {}).get("converters") or []
    conv = [conv] if isinstance(conv, str) else list(conv)
    return any("float8" in str(c).lower() or str(c).lower() in ("mx", "quantize.linear.mx")
               for c in conv)
