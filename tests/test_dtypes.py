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
