"""The training state a GPU holds, counted in one place (``fxshape.parallelism.state``)."""

import pytest

from fxshape.parallelism.state import training_state


def test_training_state_by_hand():
    n = 1_000
    # AdamW, fp32 gradients, no sharding: master 4, gradient 4, moments 8, the step's
    # temporary 4 bytes a parameter
    st = training_state(lambda by: n / by, optimizer="adamw", grad_bytes=4)
    assert (st.master, st.grads, st.state, st.temp) == (4 * n, 4 * n, 8 * n, 4 * n)
    assert st.resident == 16 * n
    # ZeRO-1 over 4: the moments and the temporary a quarter; ZeRO-2 the gradients too;
    # ZeRO-3 the master weights too (bf16 gradients: 2 bytes)
    for zero, want in ((1, (4 * n, 2 * n, 2 * n, n)), (2, (4 * n, n / 2, 2 * n, n)),
                       (3, (n, n / 2, 2 * n, n))):
        st = training_state(lambda by: n / by, optimizer="adamw", grad_bytes=2, zero=zero,
                            shard=4)
        assert (st.master, st.grads, st.state, st.temp) == want
    # SGD keeps no state and no temporary; the fused AdamW no temporary
    st = training_state(lambda by: n, optimizer="sgd", grad_bytes=4)
    assert (st.state, st.temp) == (0, 0)
    assert training_state(lambda by: n, optimizer="adamw-fused", grad_bytes=4).temp == 0
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        training_state(lambda by: n, optimizer="lion", grad_bytes=4)
