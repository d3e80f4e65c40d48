"""embrope.torch: the torch.library operators, their autograd and fake kernels,
torch.compile(fullgraph=True), and the capture-safe deferred mode."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import embrope  # noqa: E402
import embrope.torch as et  # noqa: E402


# A reference RoPE written in plain torch ops (rotate_half, Su et al. 2021), whose gradient
# torch's own autograd derives.
def reference_rope(x, positions, cos_sin_cache, layout="neox"):
    R = cos_sin_cache.shape[-1]
    half = R // 2
    cos = cos_sin_cache[positions, :half].unsqueeze(-2)
    sin = cos_sin_cache[positions, half:].unsqueeze(-2)
    rot, rest = x[..., :R], x[..., R:]
    if layout == "neox":
        a, b = rot[..., :half], rot[..., half:]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
    return torch.cat([out, rest], -1)


@pytest.mark.parametrize("layout", ["neox", "interleaved"])
def test_apply_rope_gradients_match_torch_autograd_of_a_reference(layout):
    torch.manual_seed(0)
    cache = embrope.RopeCache(48, 256, scaling="yarn", factor=4.0, original_max_positions=64)
    table = torch.from_numpy(np.array(cache.cos_sin_cache))
    positions = torch.randint(0, 256, (3, 5))
    q = torch.randn(3, 5, 4, 64, requires_grad=True)
    k = torch.randn(3, 5, 2, 64, requires_grad=True)
    q_out, k_out = et.apply_rope(q, k, positions, cache, layout=layout)
    weights_q, weights_k = torch.randn_like(q_out), torch.randn_like(k_out)
    ((q_out * weights_q).sum() + (k_out * weights_k).sum()).backward()
    q_ref = q.detach().clone().requires_grad_()
    k_ref = k.detach().clone().requires_grad_()
    q_ref_out = reference_rope(q_ref, positions, table, layout)
    k_ref_out = reference_rope(k_ref, positions, table, layout)
    ((q_ref_out * weights_q).sum() + (k_ref_out * weights_k).sum()).backward()
    torch.testing.assert_close(q_out, q_ref_out, atol=2e-6, rtol=0)
    torch.testing.assert_close(q.grad, q_ref.grad, atol=2e-6, rtol=0)
    torch.testing.assert_close(k.grad, k_ref.grad, atol=2e-6, rtol=0)


def test_apply_rope_gradient_with_sum_loss_and_q_only():
    # .sum() hands the backward an expanded (stride 0) gradient
    cache = embrope.RopeCache(16, 32)
    q = torch.randn(4, 2, 16, requires_grad=True)
    positions = torch.arange(4)
    q_out, k_out = et.apply_rope(q, None, positions, cache)
    assert k_out is None
    q_out.sum().backward()
    q_ref = q.detach().clone().requires_grad_()
    reference_rope(q_ref, positions, torch.from_numpy(np.array(cache.table))).sum().backward()
    torch.testing.assert_close(q.grad, q_ref.grad, atol=2e-6, rtol=0)


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
@pytest.mark.parametrize("inverse", [False, True])
def test_double_backward_of_apply_rope(inverse):
    """The gradient of apply_rope_backward is apply_rope: gradgradcheck (float32, linear maps,
    so central differences are exact up to rounding) and against the reference's autograd."""
    torch.manual_seed(1)
    cache = embrope.RopeCache(12, 64, scaling="yarn", factor=2.0, original_max_positions=16)
    positions = torch.randint(0, 64, (5,))
    q = torch.randn(5, 2, 16, requires_grad=True)
    k = torch.randn(5, 1, 16, requires_grad=True)

    def rope(q, k):
        return et.apply_rope(q, k, positions, cache, layout="interleaved", inverse=inverse)

    assert torch.autograd.gradgradcheck(rope, (q, k), eps=1e-2, atol=2e-3, rtol=2e-3)
    # An explicit second-order quantity: d/dw of <grad_q(w), v>, where grad_q = R^T w.
    w = torch.randn(5, 2, 16, requires_grad=True)
    v = torch.randn(5, 2, 16)
    q_out, _ = rope(q, None)
    (grad_q,) = torch.autograd.grad(q_out, q, w, create_graph=True)
    (second,) = torch.autograd.grad((grad_q * v).sum(), w)
    table = torch.from_numpy(np.array(cache.table))
    if inverse:
        table = torch.cat([table[:, :6], -table[:, 6:]], -1)
    # <R^T w, v> = <w, R v>: its gradient in w is the forward rotation of v.
    expected = reference_rope(v, positions, table, "interleaved")
    torch.testing.assert_close(second, expected, atol=2e-6, rtol=0)


def test_embed_gradients_match_torch_autograd_of_a_reference():
    torch.manual_seed(1)
    V, P, D = 30, 16, 8
    table = torch.randn(V, D, requires_grad=True)
    position_table = torch.randn(P, D, requires_grad=True)
    type_table = torch.randn(2, D, requires_grad=True)
    ids = torch.randint(0, V, (3, 6))
    ids[0, :3] = 7  # repeated ids: their gradients are summed
    type_ids = torch.randint(0, 2, (3, 6))
    offsets = torch.tensor([0, 4, 10])
    out = et.embed(table, ids, scale=3.0, position_table=position_table,
                   position_offsets=offsets, type_table=type_table, type_ids=type_ids,
                   padding_idx=7)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    refs = [t.detach().clone().requires_grad_() for t in (table, position_table, type_table)]
    positions = offsets[:, None] + torch.arange(6)
    expected = (3.0 * torch.nn.functional.embedding(ids, refs[0], padding_idx=7)
                + refs[1][positions] + refs[2][type_ids])
    (expected * weights).sum().backward()
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    for mine, theirs in zip((table, position_table, type_table), refs):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=0)
    assert torch.all(table.grad[7] == 0)  # padding_idx gives no gradient


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_embed_norm_gradients_match_torch_autograd_of_the_composition(norm):
    """embed + norm (and its pre-norm output, both with gradients) against torch's own
    embedding, addition and layer_norm / RMS formula under autograd."""
    torch.manual_seed(2)
    V, P, D = 30, 16, 48
    table = torch.randn(V, D, requires_grad=True)
    position_table = torch.randn(P, D, requires_grad=True)
    type_table = torch.randn(2, D, requires_grad=True)
    weight = (0.5 * torch.randn(D)).requires_grad_()
    bias = torch.randn(D, requires_grad=True) if norm == "layer_norm" else None
    ids = torch.randint(0, V, (3, 6))
    ids[0, :3] = 7
    type_ids = torch.randint(0, 2, (3, 6))
    out, pre = et.embed(table, ids, scale=2.0, position_table=position_table,
                        type_table=type_table, type_ids=type_ids, norm=norm, norm_weight=weight,
                        norm_bias=bias, norm_eps=1e-5, norm_unit_offset=True,
                        return_pre_norm=True)
    w_out, w_pre = torch.randn_like(out), torch.randn_like(pre)
    ((out * w_out).sum() + (pre * w_pre).sum()).backward()
    leaves = [table, position_table, type_table, weight] + ([bias] if bias is not None else [])
    refs = [t.detach().clone().requires_grad_() for t in leaves]
    x = (2.0 * torch.nn.functional.embedding(ids, refs[0]) + refs[1][torch.arange(6)]
         + refs[2][type_ids])
    if norm == "layer_norm":
        expected = torch.nn.functional.layer_norm(x, (D,), 1.0 + refs[3], refs[4], 1e-5)
    else:
        expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * (1.0 + refs[3])
    ((expected * w_out).sum() + (x * w_pre).sum()).backward()
    torch.testing.assert_close(pre, x, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    for mine, theirs in zip(leaves, refs):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-4, rtol=1e-5)
    with pytest.raises(embrope.InvalidArgumentError, match="vocab_shard"):
        et.embed(table, ids, norm=norm, vocab_shard=True)


def test_embed_backward_is_deterministic_and_frozen_tables_get_none():
    table = torch.randn(5, 4)  # frozen
    positions = torch.randn(8, 4, requires_grad=True)
    ids = torch.randint(0, 5, (2, 8))
    out = et.embed(table, ids, position_table=positions)
    out.pow(2).sum().backward()
    first = positions.grad.clone()
    positions.grad = None
    et.embed(table, ids, position_table=positions).pow(2).sum().backward()
    assert torch.equal(first, positions.grad)
    assert table.grad is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gradients(dtype):
    cache = embrope.RopeCache(32, 64)
    q = torch.randn(3, 2, 32, dtype=dtype, requires_grad=True)
    positions = torch.tensor([1, 30, 63])
    q_out, _ = et.apply_rope(q, None, positions, cache)
    assert q_out.dtype == dtype
    q_out.float().pow(2).sum().backward()
    assert q.grad.dtype == dtype
    q_ref = q.detach().float().requires_grad_()
    reference_rope(q_ref, positions, torch.from_numpy(np.array(cache.table))).pow(2).sum().backward()
    torch.testing.assert_close(q.grad.float(), q_ref.grad, atol=0.05, rtol=0.02)
    table = torch.randn(6, 8, dtype=dtype, requires_grad=True)
    et.embed(table, torch.tensor([1, 1, 2])).float().sum().backward()
    assert table.grad.dtype == dtype and torch.all(table.grad[1] == 2)


def test_in_place_op_and_rotary_embedding_module():
    cache = embrope.RopeCache.from_preset("gpt-j-6b", max_positions=128)
    rotary = et.RotaryEmbedding(cache)
    q = torch.randn(5, 3, 256)
    k = torch.randn(5, 1, 256)
    positions = torch.tensor([0, 9, 33, 64, 127])
    q_new, k_new = rotary(positions, q, k)
    q_ref = reference_rope(q, positions, rotary.cos_sin_cache, "interleaved")
    torch.testing.assert_close(q_new, q_ref, atol=2e-6, rtol=0)
    q_same, k_same = rotary(positions, q, k, inplace=True)
    assert q_same is q and k_same is k
    assert torch.equal(q, q_new) and torch.equal(k, k_new)
    x = torch.randn(2, 1, 256)
    q2, _ = et.apply_rope(x, None, torch.tensor([3, 4]), cache, inplace=True)
    assert q2 is x


def test_rotary_embedding_keeps_its_tables_dtype_when_the_model_is_cast():
    # model.half() cast the float32 table to float16 (rounding every value) with no word.
    cache = embrope.RopeCache(64, 128)
    model = torch.nn.Sequential(et.RotaryEmbedding(cache))
    exact = model[0].cos_sin_cache.clone()
    model.half().to(torch.bfloat16).to("cpu")
    assert model[0].cos_sin_cache.dtype == torch.float32
    assert torch.equal(model[0].cos_sin_cache, exact)
    q, positions = torch.randn(4, 2, 64).half(), torch.tensor([0, 5, 77, 127])
    got, _ = model[0](positions, q)
    want, _ = et.apply_rope(q, None, positions, cache)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    own = et.RotaryEmbedding(exact.bfloat16())  # a caller's 16-bit table keeps its own dtype
    own.float()
    assert own.cos_sin_cache.dtype == torch.bfloat16


def test_opcheck_of_every_operator():
    """torch.library.opcheck: schema, fake kernel, autograd registration, dispatch."""
    cache = embrope.RopeCache(16, 32)
    table = torch.from_numpy(np.array(cache.table))
    q = torch.randn(4, 2, 16, requires_grad=True)
    k = torch.randn(4, 1, 16, requires_grad=True)
    positions = torch.tensor([0, 3, 8, 31])
    rope_args = (q, k, positions, table, 0, False, 0, [0, 0, 0, 0])
    torch.library.opcheck(torch.ops.embrope.apply_rope.default, rope_args)
    torch.library.opcheck(torch.ops.embrope.apply_rope_backward.default,
                          (q.detach(), k.detach(), positions, table, 1, True, 16, [0, 0, 0, 0]))
    torch.library.opcheck(torch.ops.embrope.apply_rope_.default,
                          (q.detach().clone(), k.detach().clone(), positions, table, 0, False, 0,
                           [0, 0, 0, 0]))
    embed_args = (torch.randn(10, 4, requires_grad=True), torch.tensor([[1, 2], [3, 9]]),
                  torch.randn(6, 4, requires_grad=True), None, None,
                  torch.randn(2, 4, requires_grad=True), torch.tensor([[0, 1], [1, 1]]), 1.5, 0,
                  False, 1, 10000.0, 0, None)
    torch.library.opcheck(torch.ops.embrope.embed.default, embed_args)
    torch.library.opcheck(torch.ops.embrope.embed_norm.default,
                          embed_args[:7] + (torch.randn(4, requires_grad=True),
                                            torch.randn(4, requires_grad=True), 1.5, 0, 1,
                                            10000.0, 0, 1, 1e-5, False, None))
    torch.library.opcheck(torch.ops.embrope.embed_backward.default,
                          (torch.randn(2, 2, 4), torch.tensor([[1, 2], [3, 9]]), None, None, None,
                           10, 6, 0, torch.float32, 1.0, 0, False, None))
    torch.library.opcheck(torch.ops.embrope.packed_positions.default,
                          (torch.tensor([0, 2, 5]), None, 5))


class TinyAttention(torch.nn.Module):
    """Embedding with learned positions, then one attention layer with RoPE."""

    def __init__(self, vocab=64, dim=32, heads=4, kv_heads=2, positions=128):
        super().__init__()
        torch.manual_seed(0)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.table = torch.nn.Parameter(torch.randn(vocab, dim) * 0.1)
        self.position_table = torch.nn.Parameter(torch.randn(positions, dim) * 0.1)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim)
        self.rotary = et.RotaryEmbedding(embrope.RopeCache(self.head_dim, positions))

    def forward(self, ids, positions):
        x = et.embed(self.table, ids, position_table=self.position_table,
                     position_ids=positions)
        B, S, _ = x.shape
        qkv = self.qkv(x)
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                             self.kv_heads * self.head_dim], -1)
        q = q.reshape(B, S, self.heads, self.head_dim)
        k = k.reshape(B, S, self.kv_heads, self.head_dim)
        v = v.reshape(B, S, self.kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        attention = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            enable_gqa=True)
        return attention.transpose(1, 2).reshape(B, S, -1)


def test_torch_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    model = TinyAttention()
    ids = torch.randint(0, 64, (2, 10))
    positions = torch.arange(10).expand(2, 10).contiguous()
    eager = model(ids, positions)
    eager.square().sum().backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(ids, positions)
    out.square().sum().backward()
    torch.testing.assert_close(out, eager, atol=1e-5, rtol=1e-5)
    for mine, theirs in zip([p.grad for p in model.parameters()], eager_grads):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)


def test_torch_compile_with_a_cache_never_used_eagerly():
    # The cache's table tensor is made while the graph is traced, not before.
    torch._dynamo.reset()
    for cache in (embrope.RopeCache(16, 32), embrope.RopeCache(16, 32, layout="interleaved")):
        q, positions = torch.randn(4, 2, 16), torch.tensor([0, 5, 9, 31])

        def rope(q, positions):
            return et.apply_rope(q, None, positions, cache)[0]

        compiled = torch.compile(rope, fullgraph=True)(q, positions)
        want, _ = embrope.apply_rope(q.numpy().copy(), None, positions.numpy(), cache)
        torch.testing.assert_close(compiled, torch.from_numpy(want), atol=0, rtol=0)


def test_torch_compile_in_place_op_fullgraph():
    torch._dynamo.reset()
    cache = embrope.RopeCache(16, 64)
    table = torch.from_numpy(np.array(cache.table))

    def step(q, k, positions):
        et.apply_rope(q, k, positions, table, inplace=True)
        return q * 2, k

    q, k = torch.randn(3, 2, 16), torch.randn(3, 1, 16)
    positions = torch.tensor([1, 2, 60])
    q1, k1 = q.clone(), k.clone()
    expected = step(q1, k1, positions)
    got = torch.compile(step, fullgraph=True)(q, k, positions)
    torch.testing.assert_close(got[0], expected[0], atol=0, rtol=0)
    torch.testing.assert_close(k, k1, atol=0, rtol=0)  # k rotated in place in both


def test_deferred_errors_mode_reports_without_raising():
    cache = embrope.RopeCache(8, 16)
    status = embrope.DeferredStatus()
    q = torch.randn(3, 1, 8)
    with et.deferred_errors(status):
        out, _ = et.apply_rope(q, None, torch.tensor([1, 40, 2]), cache)
    assert torch.all(out[1] == 0)
    with pytest.raises(embrope.BadIndexError, match=r"positions\[1\] = 40"):
        status.check()
    with pytest.raises(IndexError, match=r"positions\[1\] = 40"):
        et.apply_rope(q, None, torch.tensor([1, 40, 2]), cache)  # default: raises at once
    with pytest.raises(TypeError):
        with et.deferred_errors("status"):
            pass


def test_deferred_errors_is_per_asyncio_task():
    # Two requests served as asyncio tasks on one thread, their blocks overlapping across an
    # await: each bad id goes to its own task's status, and neither raises.
    import asyncio

    table = torch.randn(10, 4)
    statuses = {"a": embrope.DeferredStatus(), "b": embrope.DeferredStatus()}

    async def first(opened, second_opened, done):
        with et.deferred_errors(statuses["a"]):
            opened.set()
            await second_opened.wait()  # the second task's block opens inside this one
            out = et.embed(table, torch.tensor([1, 11]))
            done.set()
        return out

    async def second(first_opened, opened, first_done):
        await first_opened.wait()
        with et.deferred_errors(statuses["b"]):
            opened.set()
            await first_done.wait()  # the first task's block closes inside this one
            return et.embed(table, torch.tensor([1, 12]))

    async def serve():
        a_open, b_open, a_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        return await asyncio.gather(first(a_open, b_open, a_done),
                                    second(a_open, b_open, a_done))

    outputs = asyncio.run(serve())
    for out in outputs:
        assert torch.all(out[1] == 0)
    with pytest.raises(embrope.BadIndexError, match=r"ids\[1\] = 11"):
        statuses["a"].check()
    with pytest.raises(embrope.BadIndexError, match=r"ids\[1\] = 12"):
        statuses["b"].check()


def test_a_cuda_status_waits_on_torchs_current_stream(monkeypatch):
    # The ops ran on torch's current stream (a non-blocking side stream under
    # torch.cuda.stream(s)); check() and ok() without a stream must wait on that one, not the
    # legacy stream, or they read the record before the kernels wrote it. Without a GPU the
    # native status and torch.cuda are stand-ins that record the stream asked for.
    class Native:
        device = (1, 2)
        waited: list = []

        def check(self, stream):
            self.waited.append(stream)

        def ok(self, stream):
            self.waited.append(stream)
            return True

    status = embrope.DeferredStatus()
    monkeypatch.setattr(status, "_native", Native())
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda index: type("Stream", (), {"cuda_stream": 0x5000 + index})())
    status.check()
    status.ok()
    status.check(stream=7)
    assert Native.waited == [0x5002, 0x5002, 7]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # torch never used CUDA
    status.check()
    assert Native.waited[-1] == 0


def test_a_caches_first_copy_inside_a_cuda_graph_capture_is_refused(monkeypatch):
    # A copy made during capture is a node of the graph, run at its replays only, in the
    # graph's memory: kept for later calls, it would give eager calls a table never written.
    # So a RopeCache's first use on another device inside a capture is refused, naming the op
    # and what to do, and nothing is kept. Without a GPU the capture query of the target
    # device is a stand-in; the refusal comes before any copy is attempted.
    cache = embrope.RopeCache(16, 32)
    asked = []
    monkeypatch.setattr(et, "_capturing", lambda device: asked.append(device) or True)
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"^apply_rope: the RopeCache lives on cpu, and its first use on "
                             r"cuda:1 is inside CUDA graph capture.*call the op once on cuda:1 "
                             r"before capturing"):
        et._cache_tensor("apply_rope", cache, torch.device("cuda:1"))
    assert "cuda:1" not in et._cache_tables.get(cache, {})
    assert asked == [torch.device("cuda:1")]  # the target device's stream, not the current one
    # On the cache's own device the table is a view, which a capture may take.
    table = et._cache_tensor("apply_rope", cache, torch.device("cpu"))
    assert table.data_ptr() == cache.table.ctypes.data


@pytest.mark.skipif(embrope.cuda_device_count() == 0 or not torch.cuda.is_available(),
                    reason="needs a CUDA GPU")
def test_deferred_errors_on_a_side_stream_are_seen_by_check():
    side = torch.cuda.Stream()
    table = torch.randn(10, 64, device="cuda")
    status = embrope.DeferredStatus("cuda")
    with torch.cuda.stream(side), et.deferred_errors(status):
        torch.cuda._sleep(200_000_000)  # the side stream is busy for a while
        et.embed(table, torch.tensor([1, 12], device="cuda"))
        with pytest.raises(embrope.BadIndexError, match=r"ids\[1\] = 12"):
            status.check()


def test_a_backward_on_another_thread_reports_to_its_forwards_status():
    # Autograd runs a CUDA backward on a thread of its own, where the forward thread's
    # deferred_errors is not in effect: a bad position raised there (and synchronised).
    import threading

    cache = embrope.RopeCache(8, 16)
    table = torch.randn(10, 8, requires_grad=True)

    def backward_on_another_thread(loss):
        failures = []

        def run():
            try:
                loss.backward()
            except Exception as error:  # collected: the caller asserts there is none
                failures.append(error)

        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
        return failures

    def forward(status):
        q = torch.randn(3, 1, 8, requires_grad=True)
        with et.deferred_errors(status):
            rotated, _ = et.apply_rope(q, None, torch.tensor([1, 40, 2]), cache)
            looked_up = et.embed(table, torch.tensor([1, 12, 2]))
        return (rotated ** 2).sum() + (looked_up ** 2).sum()

    status = embrope.DeferredStatus()
    assert backward_on_another_thread(forward(status)) == []  # it raised there
    with pytest.raises(embrope.BadIndexError, match=r"ids\[1\] = 12"):  # the lowest key
        status.check()
    # The backward's own thread's status comes first.
    loss, own = forward(embrope.DeferredStatus()), embrope.DeferredStatus()
    with et.deferred_errors(own):
        loss.backward()
    with pytest.raises(embrope.BadIndexError):
        own.check()


def test_torch_errors_name_the_op_and_argument():
    cache = embrope.RopeCache(8, 16)
    with pytest.raises(ValueError, match="apply_rope: rotary_dim 4"):
        et.apply_rope(torch.randn(2, 1, 8), None, torch.arange(2), cache, rotary_dim=4)
    table = torch.from_numpy(np.array(cache.table)).requires_grad_()
    with pytest.raises(ValueError, match="requires grad"):
        et.apply_rope(torch.randn(2, 1, 8), None, torch.arange(2), table)
    with pytest.raises(IndexError, match=r"embed: ids\[0\] = 9"):
        et.embed(torch.randn(4, 2), torch.tensor([9]))


def test_public_rope_functions_take_a_table_that_requires_grad_without_grad_mode():
    # A table held as a Parameter, used for inference: nothing can miss a gradient under
    # no_grad or inference_mode (it was refused there too).
    cache = embrope.RopeCache(8, 16)
    table = torch.nn.Parameter(torch.from_numpy(np.array(cache.table)))
    q, positions = torch.randn(2, 2, 8), torch.arange(2)
    want, _ = et.apply_rope(q, None, positions, table.detach())
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            got, _ = et.apply_rope(q, None, positions, table)
            normed, _ = et.apply_qk_norm_rope(q, None, positions, table, q_weight=torch.ones(8))
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        assert normed.shape == q.shape
    with pytest.raises(embrope.InvalidArgumentError, match="apply_rope: the cos/sin table"):
        et.apply_rope(q, None, positions, table)  # grad mode on: refused


def test_operators_called_directly_refuse_a_table_that_requires_grad():
    # The rotation gives the cos/sin table no gradient; through torch.ops (past the public
    # functions' check) a table that requires grad would be left without one, silently.
    cache = embrope.RopeCache(8, 16)
    table = torch.from_numpy(np.array(cache.table)).requires_grad_()
    q, k, positions = torch.randn(2, 2, 8), torch.randn(2, 1, 8), torch.arange(2)
    refused = r"\b{}: the cos/sin table requires grad"
    rope = (0, False, 0, [0] * 8)
    for q_grad in (False, True):  # the table alone, or with q
        x = q.clone().requires_grad_(q_grad)
        with pytest.raises(embrope.InvalidArgumentError, match=refused.format("apply_rope")):
            torch.ops.embrope.apply_rope(x, k, positions, table, *rope)
        with pytest.raises(embrope.InvalidArgumentError,
                           match=refused.format("apply_rope_backward")):
            torch.ops.embrope.apply_rope_backward(x, k, positions, table, *rope)
        with pytest.raises(embrope.InvalidArgumentError,
                           match=refused.format("apply_qk_norm_rope")):
            torch.ops.embrope.apply_qk_norm_rope(x, k, positions, table, torch.ones(8), None,
                                                 1e-6, False, *rope)
    # Traced by torch.compile, the refusal stops the compile: the error torch raises has
    # embrope's as its root cause.
    compiled = torch.compile(
        lambda x, t: torch.ops.embrope.apply_rope(x, k, positions, t, *rope), fullgraph=True)
    with pytest.raises(Exception) as raised:
        compiled(q, table)
    cause = raised.value
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
    assert isinstance(cause, embrope.InvalidArgumentError)
    assert "apply_rope: the cos/sin table requires grad" in str(cause)
    with torch.no_grad():  # no backward to miss it: allowed, the same bits
        got, _ = torch.ops.embrope.apply_rope(q, k, positions, table, *rope)
    want, _ = embrope.apply_rope(q.numpy(), None, positions.numpy(), cache)
    torch.testing.assert_close(got, torch.from_numpy(want), atol=0, rtol=0)


def test_embed_padding_idx_counts_back_from_the_end_as_torch_does():
    # A negative padding_idx never matched an id: the row kept its gradient, silently.
    ids = torch.tensor([[4, 1, 4], [0, 4, 2]])
    for padding_idx in (-1, -5, 3):
        # Small integers: every sum is exact, whatever its order.
        table = torch.randint(-4, 5, (5, 4)).float().requires_grad_()
        want_table = table.detach().clone().requires_grad_()
        (et.embed(table, ids, padding_idx=padding_idx) ** 2).sum().backward()
        (F.embedding(ids, want_table, padding_idx=padding_idx) ** 2).sum().backward()
        torch.testing.assert_close(table.grad, want_table.grad, atol=0, rtol=0)
        assert torch.all(table.grad[padding_idx] == 0)
    table = torch.randn(5, 4, requires_grad=True)
    with pytest.raises(embrope.InvalidArgumentError, match="embed: padding_idx -6 is below -5"):
        et.embed(table, ids, padding_idx=-6)
    with pytest.raises(embrope.InvalidArgumentError, match="padding_idx -1 is negative"):
        et.embed(table, ids + 5, vocab_start=5, padding_idx=-1)
    grads = et.embed_backward(torch.ones(2, 3, 4), ids, table_rows=5, padding_idx=-1)
    assert torch.all(grads[0][4] == 0) and torch.all(grads[0][1] == 1)
    # Without a table gradient it has nothing to keep (no error about grad_table).
    _, positions_grad, _ = et.embed_backward(torch.ones(2, 3, 4), ids, position_rows=6,
                                             position_ids=ids, padding_idx=-1)
    assert positions_grad[4].tolist() == [3.0] * 4
    # The NumPy surface keeps the ids' numbering: a negative id matches no row.
    with pytest.raises(embrope.InvalidArgumentError,
                       match="embed_backward: padding_idx -1 is negative"):
        embrope.embed_backward(np.ones((2, 3, 4), np.float32), ids.numpy(),
                               np.zeros((5, 4), np.float32), padding_idx=-1)


def test_embed_refuses_norm_arguments_without_a_norm():
    # A forgotten norm= gave an unnormalised output and a norm weight that never trained.
    table, ids = torch.randn(5, 4), torch.tensor([0, 3])
    weight = torch.ones(4, requires_grad=True)
    for given in ({"norm_weight": weight}, {"norm_bias": torch.zeros(4)},
                  {"norm_unit_offset": True}):
        with pytest.raises(embrope.InvalidArgumentError,
                           match="embed: norm_weight, norm_bias or norm_unit_offset is given "
                                 "but norm is none"):
            et.embed(table, ids, **given)
    # A learnable scale would be read as a number and get no gradient.
    with pytest.raises(embrope.InvalidArgumentError, match="embed: scale is a tensor that "
                                                            "requires grad"):
        et.embed(table, ids, scale=torch.tensor(2.0, requires_grad=True))
    torch.testing.assert_close(et.embed(table, ids, scale=torch.tensor(2.0)), 2 * table[ids],
                               atol=0, rtol=0)
    # norm="none" is no norm, as in embrope.embed.
    torch.testing.assert_close(et.embed(table, ids, norm="none"), table[ids], atol=0, rtol=0)


def test_embed_backward_refuses_index_tensors_whose_gradient_is_not_asked_for():
    grad_out, ids = torch.ones(2, 3, 4), torch.tensor([[1, 2, 3], [0, 1, 2]])
    with pytest.raises(embrope.InvalidArgumentError,
                       match="embed_backward: position_ids is given but position_rows is 0"):
        et.embed_backward(grad_out, ids, table_rows=5, position_ids=ids)
    with pytest.raises(embrope.InvalidArgumentError,
                       match="embed_backward: position_offsets is given but position_rows is 0"):
        et.embed_backward(grad_out, ids, table_rows=5, position_offsets=torch.tensor([0, 1]))
    with pytest.raises(embrope.InvalidArgumentError,
                       match="embed_backward: type_ids is given but type_rows is 0"):
        et.embed_backward(grad_out, ids, table_rows=5, type_ids=ids)
    with pytest.raises(embrope.InvalidArgumentError,
                       match="embed_backward: table_rows, position_rows and type_rows are all 0"):
        et.embed_backward(grad_out, ids)
    _, grad_positions, grad_types = et.embed_backward(grad_out, ids, position_rows=4,
                                                      position_ids=ids, type_rows=4,
                                                      type_ids=ids)
    assert grad_positions[1].tolist() == [2.0] * 4 and grad_types[3].tolist() == [1.0] * 4


def test_a_backward_through_an_operator_without_a_gradient_raises():
    # The backward operators and float8 outputs have no derivative: going through them (a
    # gradient of a gradient, or a float8 output backpropagated) is an error, never a
    # gradient silently left out (torch only warns for an operator without autograd).
    table, ids = torch.randn(10, 8, requires_grad=True), torch.tensor([1, 2, 3])
    for norm, op in ((None, "embed_backward"), ("layer_norm", "embed_norm_backward")):
        out = et.embed(table, ids, norm=norm)
        grad, = torch.autograd.grad((out ** 2).sum(), table, create_graph=True)
        with pytest.raises(embrope.NotAvailableError, match=f"embrope::{op} has no gradient"):
            grad.sum().backward()
    cache = embrope.RopeCache(8, 16)
    q, weight = torch.randn(3, 2, 8, requires_grad=True), torch.ones(8, requires_grad=True)
    out, _ = et.apply_qk_norm_rope(q, None, torch.arange(3), cache, q_weight=weight)
    grad, = torch.autograd.grad((out ** 2).sum(), q, create_graph=True)
    with pytest.raises(embrope.NotAvailableError,
                       match="embrope::apply_qk_norm_rope_backward has no gradient"):
        grad.sum().backward()
    table = torch.from_numpy(np.array(cache.table))
    q8, _, _, _ = torch.ops.embrope.apply_rope_quantized(
        q, None, torch.arange(3), table, 0, False, 0, [0] * 8, torch.float8_e4m3fn, 1.0, 1.0,
        None, None, None, None)
    with pytest.raises(embrope.NotAvailableError,
                       match="embrope::apply_rope_quantized has no gradient"):
        q8.float().sum().backward()
