"""The generic (DLPack) API writing torch tensors: autograd is told, or the write is refused.

torch's own in-place ops move a tensor's version counter, so that a backward through a
value saved before the write raises instead of using the new value, and they refuse to write
a leaf that requires grad (and out= tensors that require grad) while grad mode is on. The
generic API keeps those rules, and refuses to read a tensor that requires grad while grad
mode is on (its results would carry no gradient back, as torch refuses .numpy() of such a
tensor); embrope.torch is the differentiable path."""

import numpy as np
import pytest

import embrope

torch = pytest.importorskip("torch")


def rope_args(tokens=4, heads=2, dim=8):
    q = torch.randn(tokens, heads, dim)
    return q, torch.arange(tokens), embrope.RopeCache(dim, 16)


def test_writing_a_tensor_that_requires_grad_is_refused():
    # The case a user hit: h = x.exp() rotated in place left x.grad silently wrong.
    x = torch.randn(4, 2, 8, requires_grad=True)
    h = x.exp()
    _, positions, cache = rope_args()
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"apply_rope: q requires grad, and this call writes it outside "
                             r"autograd; use embrope.torch.apply_rope"):
        embrope.apply_rope(h, None, positions, cache)
    with pytest.raises(embrope.InvalidArgumentError, match="apply_rope: q requires grad"):
        embrope.apply_rope(x, None, positions, cache)  # a leaf, as torch refuses
    q_out = torch.empty(4, 2, 8, requires_grad=True)
    with pytest.raises(embrope.InvalidArgumentError, match="apply_rope: q_out requires grad"):
        embrope.apply_rope(x.detach(), None, positions, cache, q_out=q_out)
    table = torch.randn(10, 8)
    with pytest.raises(embrope.InvalidArgumentError, match="embed: out requires grad"):
        embrope.embed(table, torch.tensor([1, 2]), out=torch.empty(2, 8, requires_grad=True))


def test_reading_a_tensor_that_requires_grad_is_refused():
    # Out of place, the result carries no gradient: a loss computed from it would leave x's
    # history without gradient, silently (torch refuses .numpy() of such a tensor).
    x = torch.randn(4, 2, 8, requires_grad=True)
    _, positions, cache = rope_args()
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"apply_rope: q requires grad, and this call works outside "
                             r"autograd .*embrope.torch.apply_rope"):
        embrope.apply_rope(x * 2, None, positions, cache, inplace=False)
    with pytest.raises(embrope.InvalidArgumentError, match="apply_rope: k requires grad"):
        embrope.apply_rope(x.detach(), x, positions, cache, inplace=False)
    table = torch.from_numpy(np.array(cache.table)).requires_grad_()  # a cos_sin_cache
    with pytest.raises(embrope.InvalidArgumentError, match="apply_rope: cache requires grad"):
        embrope.apply_rope(x.detach(), None, positions, table, inplace=False)
    weight = torch.nn.Embedding(10, 8).weight
    with pytest.raises(embrope.InvalidArgumentError, match="embed: table requires grad"):
        embrope.embed(weight, torch.tensor([1, 2]))
    # detached, or under no_grad: read as any array
    q, _ = embrope.apply_rope(x.detach(), None, positions, cache, inplace=False)
    with torch.no_grad():
        again, _ = embrope.apply_rope(x, None, positions, cache, inplace=False)
        embrope.embed(weight, torch.tensor([1, 2]))
    assert torch.equal(torch.as_tensor(q), torch.as_tensor(again))


def test_under_no_grad_the_write_is_allowed_as_in_torch():
    x = torch.randn(4, 2, 8, requires_grad=True)
    _, positions, cache = rope_args()
    expected, _ = embrope.apply_rope(x.detach().numpy().copy(), None, positions.numpy(), cache)
    with torch.no_grad():
        embrope.apply_rope(x, None, positions, cache)
    np.testing.assert_array_equal(x.detach().numpy(), expected)


def test_a_write_moves_the_version_so_a_stale_backward_raises():
    # w * h saves h; rotating h afterwards must not let w.grad use the rotated values.
    w = torch.randn(4, 2, 8, requires_grad=True)
    q, positions, cache = rope_args()
    loss = (w * q).sum()
    version = q._version
    embrope.apply_rope(q, None, positions, cache)
    assert q._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_every_written_argument_moves_its_version():
    q, positions, cache = rope_args()
    k = torch.randn(4, 1, 8)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    before = (q._version, k._version, q_out._version, k_out._version)
    embrope.apply_rope(q, k, positions, cache, q_out=q_out, k_out=k_out)
    after = (q._version, k._version, q_out._version, k_out._version)
    assert after[:2] == before[:2]  # read only
    assert all(a > b for a, b in zip(after[2:], before[2:]))

    table, ids = torch.randn(10, 8), torch.tensor([[1, 2, 3]])
    out, pre = torch.empty(1, 3, 8), torch.empty(1, 3, 8)
    versions = (out._version, pre._version, table._version)
    embrope.embed(table, ids, out=out, norm="rms_norm", pre_norm_out=pre)
    assert out._version > versions[0] and pre._version > versions[1]
    assert table._version == versions[2]

    grad_table = torch.zeros(10, 8)
    version = grad_table._version
    embrope.embed_backward(torch.ones(1, 3, 8), ids, grad_table)
    assert grad_table._version > version

    cu_seqlens, positions_out = torch.tensor([0, 2, 5]), torch.empty(5, dtype=torch.int64)
    version = positions_out._version
    embrope.packed_positions(cu_seqlens, positions_out)
    assert positions_out._version > version


def test_a_bad_index_still_moves_the_version():
    # The call writes every good row (and zero-fills the bad one) before it raises.
    q, _, cache = rope_args()
    version = q._version
    with pytest.raises(embrope.BadIndexError):
        embrope.apply_rope(q, None, torch.tensor([0, 1, 99, 2]), cache)
    assert q._version > version


# embrope.torch's in-place operators (apply_rope with inplace=True and the cache appends) have
# no autograd: they refuse tensors that require grad while grad mode is on, in the public
# function, the operator called directly and under torch.compile alike (before, an in-place
# rotation of h = 2 * x left x.grad = 2, silently missing the rotation), and move the versions
# of what they write.

def append_args(tokens=4, heads=2, dim=8):
    q, positions, cache = rope_args(tokens, heads, dim)
    k, v = torch.randn(tokens, 1, dim), torch.randn(tokens, 1, dim)
    k_cache, v_cache = torch.zeros(2, 4, 1, dim), torch.zeros(2, 4, 1, dim)  # [pages, page, Hk, D]
    return q, k, v, positions, cache, k_cache, v_cache, torch.arange(tokens) + 2


def test_torch_in_place_ops_refuse_a_tensor_that_requires_grad():
    import embrope.torch as et

    x = torch.randn(4, 2, 8, requires_grad=True)
    _, positions, cache = rope_args()
    table = torch.from_numpy(np.array(cache.table))
    rotating = "apply_rope: q requires grad, but rotating in place has no autograd"
    with pytest.raises(embrope.InvalidArgumentError, match=rotating):
        et.apply_rope(2 * x, None, positions, cache, inplace=True)
    with pytest.raises(embrope.InvalidArgumentError, match=rotating):
        et.apply_rope(x, None, positions, cache, inplace=True)
    with pytest.raises(embrope.InvalidArgumentError, match=rotating):
        torch.ops.embrope.apply_rope_(2 * x, None, positions, table, 0, False, 0, [0] * 8)
    with pytest.raises(Exception, match=rotating):
        torch.compile(lambda q: et.apply_rope(q, None, positions, table, inplace=True),
                      fullgraph=True)(2 * x)
    q, k, v, positions, cache, k_cache, v_cache, slots = append_args()
    for name, args in (("q", (2 * x, k, v)), ("k", (q, k.requires_grad_(), v))):
        with pytest.raises(embrope.InvalidArgumentError,
                           match=f"apply_rope_append_kv: {name} requires grad, but this serving "
                                 "op has no autograd"):
            et.apply_rope_append_kv(*args, positions, cache, k_cache, v_cache,
                                    slot_mapping=slots)
    with torch.no_grad():  # where they belong
        h = 2 * x
        want, _ = embrope.apply_rope(h.detach().clone(), None, positions, cache)
        et.apply_rope(h, None, positions, cache, inplace=True)
        torch.testing.assert_close(h, want, atol=0, rtol=0)
        et.apply_rope_append_kv(q, k, v, positions, cache, k_cache, v_cache, slot_mapping=slots)


def test_torch_in_place_ops_move_the_versions_they_write():
    import embrope.torch as et

    w = torch.randn(4, 2, 8, requires_grad=True)
    q, positions, cache = rope_args()
    k = torch.randn(4, 1, 8)
    loss = (w * q).sum()  # saves q
    before = (q._version, k._version)
    with torch.no_grad():
        et.apply_rope(q, k, positions, cache, inplace=True)
    assert q._version > before[0] and k._version > before[1]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    # A bad position still writes the other rows: the versions move too.
    version = q._version
    with pytest.raises(embrope.BadIndexError):
        et.apply_rope(q, None, torch.tensor([0, 1, 99, 2]), cache, inplace=True)
    assert q._version > version
    q, k, v, positions, cache, k_cache, v_cache, slots = append_args()
    before = [t._version for t in (q, k, v, k_cache, v_cache)]
    et.apply_rope_append_kv(q, k, v, positions, cache, k_cache, v_cache, slot_mapping=slots)
    after = [t._version for t in (q, k, v, k_cache, v_cache)]
    assert [a > b for a, b in zip(after, before)] == [True, False, False, True, True]
