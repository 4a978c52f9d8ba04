"""The cuda mhc_pre backend's one-read cluster forward on a GPU: its plan, its fallback and its outputs.

The conformance sweep judges it against the float64 oracle (reports/h100/mhc_pre.md); these tests pin what
the sweep does not show: which shapes take the cluster kernel (a row split over several blocks), that rows
too long for a cluster's shared memory take the Triton forward (bitwise the same), that the phases left
out by the A/B knob really change the result (the knob is not a no-op), and the saved tensors the Triton
backward reads.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA device (raw CUDA backend)")]


def _inputs(n: int, D: int, T: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    M, nD = n * n + 2 * n, n * D
    x = torch.randn((1, T, n, D), device="cuda", generator=g).to(dtype)
    phi = torch.randn((M, nD), device="cuda", generator=g) * nD ** -0.5
    alpha = torch.rand(3, device="cuda", generator=g) + 0.5
    bias = torch.randn(M, device="cuda", generator=g) * 0.5
    gamma = 1 + 0.1 * torch.randn(nD, device="cuda", generator=g)
    return x, phi, alpha, bias, gamma


def _both(n, D, T, dtype):
    """The cluster kernel's forward and the Triton forward on the same inputs."""
    from harness.backends.cuda.mhc_pre import wrapper as cw
    from harness.backends.triton.mhc_pre import wrapper as tw

    x, phi, alpha, bias, gamma = _inputs(n, D, T, dtype)
    opts = (1e-6, 1e-6, 2.0)
    return cw.cluster_forward(x, phi, alpha, bias, gamma, *opts), tw.mhc_pre_forward(x, phi, alpha, bias, gamma, *opts)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_long_row_is_split_over_a_cluster_and_passes_the_verdict(dtype) -> None:
    from harness.backends.cuda.mhc_pre import wrapper as cw
    from harness.backends.triton.mhc_pre import wrapper as tw
    from harness.references.mhc_pre import mhc_pre

    from harness.measure.figures import judge

    x, phi, alpha, bias, gamma = _inputs(4, 4096, 37, dtype)
    opts = (1e-6, 1e-6, 2.0)
    got = cw.cluster_forward(x, phi, alpha, bias, gamma, *opts)
    C, DS, BT, threads, smem = cw.last_plan
    assert C > 1 and DS % 16 == 0 and C * DS >= 4096 and BT in (16, 32) and smem <= 227 * 1024
    # the outputs against the float64 oracle, by the harness's verdict rule (the floor: the reference on the
    # same dtype-rounded inputs in float32, h_in rounded to its contract dtype)
    with torch.no_grad():
        oracle = mhc_pre(*(t.double() for t in (x, phi, alpha, bias, gamma)))
        floor = mhc_pre(x, phi, alpha, bias, gamma)
    for i, name in enumerate(("h_in", "h_post", "h_res")):
        want = dtype if name == "h_in" else torch.float32
        res, _ = judge(name, got[i].reshape(oracle[name].shape), oracle[name], floor[name].to(want), want)
        assert res.verdict == "PASS", (name, res)
    # what the Triton backward reads, as the Triton forward saves it: the same weight parts, and h_mix,
    # inv_rms, h_pre from float32-exact products summed in another order (a few float32 ulps of O(1) sums)
    ref = tw.mhc_pre_forward(x, phi, alpha, bias, gamma, *opts)
    for name, a, b in zip(("h_mix", "inv_rms", "h_pre"), got[3:6], ref[3:6], strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), f"{name}: largest difference {(a - b).abs().max():.3g}"
    assert torch.equal(got[6], ref[6])


def test_a_row_too_long_for_a_cluster_takes_the_triton_forward() -> None:
    from harness.backends.cuda.mhc_pre import wrapper as cw
    from harness.backends.triton.mhc_pre import wrapper as tw

    # n = 8, D = 7168, float32: 16 tokens x 8 streams x 448 features x 4 bytes = 229 KB a block at C = 16
    x, phi, alpha, bias, gamma = _inputs(8, 7168, 5, torch.float32)
    assert cw.cluster_forward(x, phi, alpha, bias, gamma, 1e-6, 1e-6, 2.0) is None and cw.last_plan is None
    outs, saved = cw.forward_saved(x, phi, alpha, bias, gamma)
    ref = tw.mhc_pre_forward(x, phi, alpha, bias, gamma, 1e-6, 1e-6, 2.0)
    assert all(torch.equal(outs[k], r) for k, r in zip(("h_in", "h_post", "h_res"), ref[:3], strict=True))


def test_leaving_the_cluster_meeting_out_changes_the_result() -> None:
    from harness.backends.cuda.mhc_pre import loader

    before, _ = _both(4, 4096, 16, torch.bfloat16)
    loader.lib().mhc_tune(-1, -1, -1, 2)  # kSkipMeet: each block keeps its own partial sums
    try:
        skipped, _ = _both(4, 4096, 16, torch.bfloat16)
    finally:
        loader.lib().mhc_tune(0, 0, 0, 0)
    assert not torch.equal(before[1], skipped[1])  # h_post
    again, _ = _both(4, 4096, 16, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(before, again, strict=True))  # deterministic, knob restored
