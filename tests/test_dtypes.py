import pytest
import torch

from fxshape.hardware.dtypes import canonical_dtype, itemsize, output_itemsize


@pytest.mark.parametrize("value,key", [
    (torch.float16, "fp16"), ("float16", "fp16"), ("fp16", "fp16"), ("FP16", "fp16"),
    ("torch.float16", "fp16"), ("half", "fp16"),
    (torch.bfloat16, "bf16"), ("bfloat16", "bf16"), ("bf16", "bf16"),
    (torch.float32, "fp32"), ("float32", "fp32"), ("fp32", "fp32"),
    ("tf32", "tf32"),
    ("fp8", "fp8"), (torch.float8_e4m3fn, "fp8"), (torch.float8_e5m2, "fp8"),
])
def test_canonical(value, key):
    assert canonical_dtype(value) == key


@pytest.mark.parametrize("bad", ["int8", "float64", "", None, 16, torch.int32, torch.float64])
def test_unknown_dtype_is_rejected_with_the_accepted_list(bad):
    with pytest.raises(ValueError) as exc:
        canonical_dtype(bad)
    assert repr(bad) in str(exc.value)
    assert "bf16" in str(exc.value)


def test_itemsizes():
    # storage bytes: tf32 is stored as fp32; fp8 GEMMs write 16-bit outputs
    assert [itemsize(k) for k in ("fp16", "bf16", "tf32", "fp32", "fp8")] == [2, 2, 4, 4, 1]
    assert output_itemsize("fp8") == 2


def test_kv_formats():
    from fxshape.hardware.dtypes import kv_format

    # NVFP4: two e2m1 a byte and one e4m3 scale per 16 elements: 0.5 + 1/16 = 0.5625
    assert kv_format("fp4") == kv_format("NVFP4") == ("nvfp4", 0.5625)
    assert kv_format(torch.int8) == kv_format("int8") == ("int8", 1.0)
    assert kv_format(torch.float8_e4m3fn) == ("fp8", 1.0)
    assert kv_format("bfloat16") == ("bf16", 2.0)
    with pytest.raises(ValueError, match="unknown kv_dtype 'int3'"):
        kv_format("int3")
