"""What the option matrices share (tests/test_options.py: analyze in Python;
tests/test_bad_inputs.py: every command line option): one value other than the default for
every option of ``fxshape.analyze``, the contradictions among them, a calibration file, and the
pairwise covering array."""

import json
import os

from fxshape import Parallel

MODES = ("inference", "prefill", "train", "decode")
_CFG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)


def _params_file() -> str:
    # a calibration file with GEMM constants for the H100 only (its e_max lowered a tenth:
    # the H100's GEMMs run slower), as `fxshape calibrate` writes for one GPU
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"fxshape_test_options_{os.getpid()}.json")
    if not os.path.exists(path):
        from fxshape.cost.gemm import _DEFAULT_PARAMS_PATH

        with open(_DEFAULT_PARAMS_PATH) as f:
            entry = dict(json.load(f)["gpus"]["h100-sxm"])
        entry["e_max"] *= 0.9
        with open(path, "w") as f:
            json.dump({"gpus": {"h100-sxm": entry}}, f)
    return path


#: one value other than the default for every option of fxshape.analyze
VALUES = {
    "gpu": "a100", "dtype": "fp16", "batch_size": 2, "seq_len": 32, "context_len": 64,
    "tp": 2, "sequence_parallel": True, "dp": 2, "topology": "pcie4", "optimizer": "sgd",
    "execution": "compiled", "attention": "math", "moe_routing": (0.5, 0.5), "dedup": False,
    "params": "PARAMS", "provenance": "matched", "kv_dtype": "fp8", "page_size": 16,
    # a 2-stage pipeline over 2 micro-batches (the matrix's Llama has 2 layers)
    "parallel": Parallel(pp=2, microbatches=2), "recompute": "selective",
    # NCCL's protocols under CUDA graphs (decode's default is vLLM's choice; other modes'
    # the eager NCCL model)
    "allreduce": "nccl",
    # Inductor's decomposed matrix-vector products (torch.compile; decode's batch 1)
    "gemv": "inductor",
    # weight-only int8 linear layers (fxshape.cost.quant); the group size is int4's, so
    # with the matrix's int8 (or alone) it is refused
    "quantize": "int8", "group_size": 32,
    # torchao's float8 training under torch.compile (fxshape.cost.float8)
    "float8": "tensorwise",
}
_DECODE_ONLY = {"context_len", "kv_dtype", "page_size"}
#: what every run of the matrix is given besides its options: a short prompt (the default
#: would be the 256 positions) and no "set by" (its re-traces would triple the matrix's
#: time; provenance="matched" is one of the options, compared with this)
_BASE = {mode: ({} if mode == "decode" else {"seq_len": 16}) | {"provenance": None}
         for mode in MODES}


def _refused(mode: str, names) -> bool:
    """The contradictions: combinations no report can honour (each refused in one line)."""
    names = set(names)
    if mode == "decode" and names & {"seq_len", "sequence_parallel"}:
        return True  # one new token per sequence; no sequence to split
    if mode != "decode" and names & _DECODE_ONLY:
        return True  # no KV cache outside decode
    if "gemv" in names and mode != "decode" and "execution" not in names:
        return True  # torch.compile's decomposition: not in eager (the other modes' default)
    if "moe_routing" in names:
        return True  # the Llama has no expert layers to route
    if "group_size" in names:
        return True  # int4's group size: not with int8, not without quantize
    if "quantize" in names and mode == "train":
        return True  # quantized layers are priced for inference
    if "float8" in names and (mode != "train" or "execution" not in names
                              or names & {"gpu", "dtype", "quantize"}):
        return True  # FP8 training: compiled, bf16, on a GPU with FP8 (not the A100)
    if mode != "train" and names & {"parallel", "recompute"}:
        return True  # a pipeline and recomputation are a training step's
    if mode == "train" and {"parallel", "topology"} <= names:
        return True  # a pipeline's send/recv over PCIe: no measurements, refused as unmodelled
    if "parallel" in names and names & {"tp", "dp", "sequence_parallel"}:
        return True  # the plan or its shorthands, not both
    return "sequence_parallel" in names and "tp" not in names  # it splits over tp GPUs


def covering_array(factors: dict, conflict, deciders=()) -> list:
    """Cases (option -> value; options left out take their defaults) in which every pair of
    values of two different options appears together at least once. Values in conflict (a
    contradiction: ``conflict(case)``) get a case of their own each: a value refused alone,
    and a pair refused together though neither value is alone. A pair of a value refused
    alone with another value is left to the value's own case, unless the other is one of
    ``deciders`` (options such as the mode, which decide what else is a contradiction). The
    rest are packed greedily into cases with no conflict. Deterministic."""
    if not factors:
        return [{}]  # a command without options: its one case
    names = list(factors)
    pairs = [((a, va), (b, vb)) for i, a in enumerate(names) for b in names[i + 1:]
             for va in factors[a] for vb in factors[b]]
    singles = [((a, va),) for a in names for va in factors[a]]
    alone = {p[0] for p in singles if conflict(dict(p))}
    bad = [p for p in singles if p[0] in alone]
    bad += [p for p in pairs if conflict(dict(p)) and (
        not (set(p) & alone) or any(k in deciders for k, _ in p))]
    todo = [p for p in pairs + singles if not conflict(dict(p))]
    cases = []
    while todo:
        case, rest = {}, []
        for p in todo:
            if all(case.get(k, v) == v for k, v in p) and not conflict({**case, **dict(p)}):
                case.update(p)
            else:
                rest.append(p)
        cases.append(case)
        todo = [p for p in rest if not all(case.get(k) == v for k, v in p)]
    return cases + [dict(p) for p in bad]
