"""embrope.embed_backward with embed's norm: the tables' and the norm's gradients against
torch's own autograd of ``layer_norm`` / the RMSNorm formula in float64 (the oracle), from
numpy and through embrope.torch in bfloat16; the norm's gradients alone; argument errors."""

import numpy as np
import pytest

import embrope

torch = pytest.importorskip("torch")

import embrope.torch as et  # noqa: E402


def torch_norm_gradients(pre, grad_out, grad_pre, weight, norm, eps):
    """d(pre), d(weight), d(bias) of sum(norm(pre) * grad_out) + sum(pre * grad_pre), by
    torch's autograd in float64."""
    x = torch.from_numpy(pre.astype(np.float64)).requires_grad_()
    w = torch.from_numpy(weight.astype(np.float64)).requires_grad_()
    b = torch.zeros_like(w, requires_grad=True)
    if norm == "layer_norm":
        y = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)
    else:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    loss = (y * torch.from_numpy(grad_out.astype(np.float64))).sum()
    if grad_pre is not None:
        loss = loss + (x * torch.from_numpy(grad_pre.astype(np.float64))).sum()
    loss.backward()
    return x.grad.numpy(), w.grad.numpy(), (b.grad.numpy() if norm == "layer_norm" else None)


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("with_grad_pre", [False, True])
def test_embed_backward_with_a_norm_matches_torch_autograd(norm, with_grad_pre):
    rng = np.random.default_rng(3)
    V, P, S, D = 25, 12, 10, 96
    table = rng.standard_normal((V, D), dtype=np.float32)
    positions = rng.standard_normal((P, D), dtype=np.float32)
    weight = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)
    ids = rng.integers(0, V, (2, S))
    ids[0, :4] = 3  # a repeated id sums its rows
    out, pre = embrope.embed(table, ids, position_table=positions, norm=norm, norm_weight=weight,
                             norm_eps=1e-5, return_pre_norm=True)
    grad_out = rng.standard_normal(out.shape, dtype=np.float32)
    grad_pre = rng.standard_normal(out.shape, dtype=np.float32) if with_grad_pre else None
    grad_table = np.zeros_like(table)
    grad_positions = np.zeros_like(positions)
    grad_weight = np.full(D, np.nan, dtype=np.float32)  # overwritten
    grad_bias = np.full(D, np.nan, dtype=np.float32) if norm == "layer_norm" else None
    embrope.embed_backward(grad_out, ids, grad_table, scale=1.0,
                           grad_position_table=grad_positions, norm=norm, pre_norm=pre,
                           norm_weight=weight, norm_eps=1e-5, grad_pre_norm=grad_pre,
                           grad_norm_weight=grad_weight, grad_norm_bias=grad_bias)

    dx, dw, db = torch_norm_gradients(np.asarray(pre), grad_out, grad_pre, weight, norm, 1e-5)
    want_table = np.zeros((V, D))
    np.add.at(want_table, ids.reshape(-1), dx.reshape(-1, D))
    want_positions = np.zeros((P, D))
    np.add.at(want_positions, np.tile(np.arange(S), 2), dx.reshape(-1, D))
    np.testing.assert_allclose(grad_table, want_table, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(grad_positions, want_positions, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(grad_weight, dw, atol=2e-5, rtol=1e-5)
    if db is not None:
        np.testing.assert_allclose(grad_bias, db, atol=2e-5, rtol=1e-5)


def test_the_norm_gradients_alone_and_their_errors():
    rng = np.random.default_rng(4)
    pre = rng.standard_normal((6, 16), dtype=np.float32)
    grad_out = rng.standard_normal((6, 16), dtype=np.float32)
    ids = np.arange(6)
    grad_weight = np.zeros(16, dtype=np.float32)
    embrope.embed_backward(grad_out, ids, norm="rms_norm", pre_norm=pre,
                           grad_norm_weight=grad_weight)
    _, dw, _ = torch_norm_gradients(pre, grad_out, None, np.ones(16, np.float32), "rms_norm",
                                    1e-5)
    np.testing.assert_allclose(grad_weight, dw, atol=1e-5, rtol=1e-5)

    with pytest.raises(embrope.InvalidArgumentError, match="pre_norm"):
        embrope.embed_backward(grad_out, ids, norm="layer_norm", grad_norm_weight=grad_weight)
    with pytest.raises(embrope.InvalidArgumentError, match="grad_norm_bias.*rms_norm"):
        embrope.embed_backward(grad_out, ids, norm="rms_norm", pre_norm=pre,
                               grad_norm_bias=np.zeros(16, np.float32))
    with pytest.raises(embrope.InvalidArgumentError, match="grad_norm_weight.*float32"):
        embrope.embed_backward(grad_out, ids, norm="rms_norm", pre_norm=pre,
                               grad_norm_weight=np.zeros(16, np.float16))
    with pytest.raises(embrope.InvalidArgumentError, match="norm is none"):
        embrope.embed_backward(grad_out, ids, np.zeros((6, 16), np.float32), pre_norm=pre)
    with pytest.raises(embrope.InvalidArgumentError, match="norm 'batch_norm'"):
        embrope.embed_backward(grad_out, ids, norm="batch_norm", pre_norm=pre,
                               grad_norm_weight=grad_weight)


def test_torch_embed_with_a_bfloat16_norm_backpropagates_like_torch():
    """embrope.torch.embed with a bfloat16 table and LayerNorm: the gradients equal torch's
    autograd of the same composition in float32 from the bfloat16 pre-norm rows, within
    bfloat16 rounding."""
    torch.manual_seed(5)
    V, S, D = 30, 12, 64
    table = torch.randn(V, D, dtype=torch.bfloat16, requires_grad=True)
    weight = (1 + 0.2 * torch.randn(D)).to(torch.bfloat16).requires_grad_()
    bias = (0.1 * torch.randn(D)).to(torch.bfloat16).requires_grad_()
    ids = torch.randint(0, V, (2, S))
    out, pre = et.embed(table, ids, norm="layer_norm", norm_weight=weight, norm_bias=bias,
                        return_pre_norm=True)
    grad = torch.randn(out.shape)
    (out.float() * grad).sum().backward()

    x = pre.detach().float().requires_grad_()
    w = weight.detach().float().requires_grad_()
    b = bias.detach().float().requires_grad_()
    (torch.nn.functional.layer_norm(x, (D,), w, b, 1e-5) * grad).sum().backward()
    want_table = torch.zeros(V, D).index_add_(0, ids.reshape(-1), x.grad.reshape(-1, D))
    torch.testing.assert_close(table.grad.float(), want_table, atol=0.02, rtol=0.02)
    torch.testing.assert_close(weight.grad.float(), w.grad, atol=0.05, rtol=0.02)
    torch.testing.assert_close(bias.grad.float(), b.grad, atol=0.05, rtol=0.02)
    assert table.grad.dtype == weight.grad.dtype == torch.bfloat16
