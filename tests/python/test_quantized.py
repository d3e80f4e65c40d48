"""embed from quantized tables through the Python package (QuantizedTable): .gguf files written
and read by the gguf package (PyPI) and dequantized by it, torchao's quantized nn.Embedding,
ExecuTorch's int4 packing, quantize(), the arrays kept by reference, and the errors."""

import numpy as np
import pytest

import embrope
from embrope import QuantizedTable

torch = pytest.importorskip("torch")


def _random_k_blocks(rng, kind, count):
    """Random Q4_K / Q6_K blocks (gguf-py cannot quantize them) with finite float16 scales."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (count, size), dtype=np.uint8)
    if kind == gguf.GGMLQuantizationType.Q4_K:  # half d, half dmin first
        raw[:, 0:2] = rng.uniform(-2, 2, count).astype(np.float16).view(np.uint8).reshape(count, 2)
        raw[:, 2:4] = rng.uniform(-.5, .5, count).astype(np.float16).view(np.uint8).reshape(count, 2)
    else:  # Q6_K: half d last
        raw[:, -2:] = rng.uniform(-.05, .05, count).astype(np.float16).view(np.uint8).reshape(count, 2)
    return raw


@pytest.mark.parametrize("kind_name", ["Q8_0", "Q4_0", "Q4_K", "Q6_K", "F16", "BF16"])
def test_gguf_file_token_embd_as_the_gguf_package_dequantizes_it(tmp_path, kind_name):
    gguf = pytest.importorskip("gguf")
    kind = gguf.GGMLQuantizationType[kind_name]
    rng = np.random.default_rng(7)
    vocab, dim = 40, 512
    if kind_name in ("Q8_0", "Q4_0"):
        rows = rng.standard_normal((vocab, dim)).astype(np.float32)
        data = gguf.quants.quantize(rows, kind)
    elif kind_name == "F16":
        data = rng.standard_normal((vocab, dim)).astype(np.float16)
    elif kind_name == "BF16":  # the bytes of bfloat16 values, as gguf-py writes them
        ml_dtypes = pytest.importorskip("ml_dtypes")
        values = rng.standard_normal((vocab, dim)).astype(ml_dtypes.bfloat16)
        data = values.view(np.uint8)
    else:
        block, size = gguf.GGML_QUANT_SIZES[kind]
        data = _random_k_blocks(rng, kind, vocab * dim // block).reshape(vocab, -1)
    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", data, raw_dtype=kind)
    writer.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    reader = gguf.GGUFReader(str(path))
    table = QuantizedTable.from_gguf(reader)
    ids = rng.integers(0, vocab, (3, 7))
    if kind_name in ("F16", "BF16"):  # float tables come back as the array itself
        assert isinstance(table, np.ndarray) and table.shape == (vocab, dim)
        want = data if kind_name == "F16" else values
        assert table.dtype == want.dtype
        np.testing.assert_array_equal(embrope.embed(table, ids).view(np.uint16),
                                      want[ids].view(np.uint16))
        return
    assert table.format == "gguf_" + kind_name.lower()
    assert table.shape == (vocab, dim)
    # Read in place from the file's memory map, not copied.
    stored = next(t for t in reader.tensors if t.name == "token_embd.weight").data
    assert np.shares_memory(table.data, stored)
    out = embrope.embed(table, ids)
    assert out.dtype == np.float32 and out.shape == (3, 7, dim)
    want = gguf.quants.dequantize(np.asarray(stored), kind).reshape(vocab, dim)[ids]
    np.testing.assert_array_equal(out.view(np.uint32), want.astype(np.float32).view(np.uint32))
    # The same through the path, and the whole table.
    np.testing.assert_array_equal(
        QuantizedTable.from_gguf(path).dequantize(),
        gguf.quants.dequantize(np.asarray(stored), kind).reshape(vocab, dim))
    with pytest.raises(embrope.InvalidArgumentError, match="no tensor 'token_embd'"):
        QuantizedTable.from_gguf(reader, "token_embd")


@pytest.mark.parametrize("granularity", ["row", "group32", "group64"])
@pytest.mark.parametrize("weight_dtype", ["int8", "int4"])
def test_torchao_quantized_embedding_equals_its_own_forward(granularity, weight_dtype):
    torchao = pytest.importorskip("torchao")
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(300, 128))
    gran = PerAxis(0) if granularity == "row" else PerGroup(int(granularity[5:]))
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=getattr(torch, weight_dtype),
                                          granularity=gran),
              filter_fn=lambda m, _: isinstance(m, torch.nn.Embedding))
    weight = model[0].weight
    table = QuantizedTable.from_torchao(weight)
    assert table.format == "int8" and table.data.data_ptr() == weight.qdata.data_ptr()
    ids = torch.randint(0, 300, (4, 33))
    with torch.no_grad():
        want = model[0](ids)
    got = embrope.embed(table, ids)
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), torchao.__version__
    # Fused with a scale: the float32 product of the same value.
    got = embrope.embed(table, ids, scale=2.0)
    assert torch.equal(got, want * 2.0)


def test_torchao_float8_weight_looks_up_in_the_weights_dtype():
    pytest.importorskip("torchao")
    from torchao.quantization import Float8Tensor
    from torchao.quantization.granularity import PerRow

    torch.manual_seed(0)
    weight = Float8Tensor.from_hp(torch.randn(10, 256, dtype=torch.bfloat16),
                                  granularity=PerRow())
    assert weight.scale.dtype == torch.float32  # the scales alone would say float32
    table = QuantizedTable.from_torchao(weight)
    assert table.format == "float8_e4m3fn" and table.default_dtype() == torch.bfloat16
    ids = torch.tensor([[1, 2, 9], [0, 0, 5]])
    got = embrope.embed(table, ids)
    assert got.dtype == torch.bfloat16
    # torchao's own dequantization of the same rows.
    assert torch.equal(got, weight.dequantize()[ids])
    assert table.dequantize().dtype == torch.bfloat16


def test_torchao_packed_int4_is_refused_not_read_as_int8():
    pytest.importorskip("torchao")
    from torchao.quantization import Int4Tensor

    # Int4Tensor keeps two int4 values per int8 ([V, D / 2]) and scales [D / group, V]: read
    # as int8 it would be a table of half the width, in other values.
    vocab, dim, group = 8, 256, 32
    weight = Int4Tensor(torch.randint(-128, 128, (vocab, dim // 2), dtype=torch.int8),
                        torch.rand(dim // group, vocab), torch.zeros(dim // group, vocab),
                        block_size=[1, group], shape=torch.Size([vocab, dim]))
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"qdata of shape \[8, 128\] for a weight of shape \[8, 256\].*"
                             "not packed ones such as Int4Tensor"):
        QuantizedTable.from_torchao(weight)


def test_executorch_int4_packing_and_float64_reference():
    # ExecuTorch's embedding_4bit example: q = [-4, -4, -1, -2] packs to 0x44, 0x76.
    data = np.array([[0x44, 0x76], [0x08, 0x8f]], dtype=np.uint8)
    scales = np.array([0.5, 0.25], dtype=np.float32)
    zero_points = np.array([1, -2], dtype=np.int8)
    table = QuantizedTable("int4", data, scales=scales, zero_points=zero_points)
    assert table.shape == (2, 4)
    out = embrope.embed(table, np.array([0, 1]))
    q = np.array([[-4, -4, -1, -2], [-8, 0, 0, 7]], dtype=np.float64)
    want = (q - zero_points[:, None]) * scales[:, None]
    np.testing.assert_array_equal(out, want.astype(np.float32))


@pytest.mark.parametrize("fmt,kw", [("int8", {}), ("int8", {"group_size": 16, "zero_point": True}),
                                    ("int4", {"group_size": 32}), ("int4", {"zero_point": True}),
                                    ("gguf_q8_0", {}), ("gguf_q4_0", {}),
                                    ("float8_e4m3fn", {}), ("float8_e5m2", {})])
def test_quantize_round_trips_within_the_formats_step(fmt, kw):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((12, 64)).astype(np.float32)
    table = QuantizedTable.quantize(x, fmt, **kw)
    back = np.asarray(table.dequantize()).astype(np.float64)
    # Error at most half a step of the format (float8: its relative precision).
    if fmt.startswith("float8"):
        rel = {"float8_e4m3fn": 2.0 ** -4, "float8_e5m2": 2.0 ** -3}[fmt]
        assert np.all(np.abs(back - x) <= rel * np.abs(x) + 1e-30)
    else:
        levels = 255 if fmt in ("int8", "gguf_q8_0") else 15
        group = kw.get("group_size", 32 if fmt.startswith("gguf") else 64)
        span = np.abs(x.reshape(12, -1, group)).max(axis=2, keepdims=True) * 2
        step = np.broadcast_to(span / levels, (12, 64 // group, group)).reshape(12, 64)
        assert np.all(np.abs(back - x) <= step * 1.01)
    # A torch table gives torch arrays.
    t = QuantizedTable.quantize(torch.from_numpy(x), fmt, **kw)
    assert isinstance(t.data, torch.Tensor)
    assert torch.equal(t.dequantize().float(), torch.from_numpy(back.astype(np.float32)))


# Magnitudes: a model's (0.01 to 3), and small ones whose float16 super-block scales are
# float16 subnormals (rounded to nearest they were 0: all-zero Q6_K rows, Q4_K rows of minima).
@pytest.mark.parametrize("magnitude", [1.0, 1e-4, 3e-6, 1e-7])
@pytest.mark.parametrize("fmt", ["gguf_q4_k", "gguf_q6_k"])
def test_quantize_k_quants_the_gguf_package_reads_back(fmt, magnitude):
    gguf = pytest.importorskip("gguf")
    kind = gguf.GGMLQuantizationType[fmt[5:].upper()]
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((6, 512)) * rng.uniform(0.01, 3.0, (6, 1)) * magnitude
         ).astype(np.float32)
    x[2, :256] += 1.5  # a block of positive values (Q4_K's min is then 0)
    x[3, 256:] = 0.0   # an all-zero block (zero scales)
    table = QuantizedTable.quantize(x, fmt)
    # The blocks are llama.cpp's layout: the gguf package decodes them to embrope's values.
    theirs = gguf.quants.dequantize(np.asarray(table.data).reshape(-1), kind).reshape(6, 512)
    ours = table.dequantize()
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))
    # Each value within half a step of its sub-block: the step is the sub-block's span over its
    # levels (Q4_K 15 over [min(x, 0), max(x, 0)] per 32 values, Q6_K 31 over max|x| per 16)
    # with the factor rounded up, at most one step d of the super-block's float16 scale more
    # (and for Q4_K the minimum's rounding up, at most dmin, spread over the 15 levels). d is
    # at least 2^-24, a float16 subnormal: values far below it keep that absolute error.
    group, steps = (32, 15.0) if fmt == "gguf_q4_k" else (16, 31.0)
    blocks = np.asarray(table.data).reshape(-1, 144 if fmt == "gguf_q4_k" else 210)
    half = lambda at: blocks[:, at:at + 2].copy().view(np.float16)[:, 0].astype(np.float64)
    d = half(0) if fmt == "gguf_q4_k" else half(208)
    dmin = half(2) if fmt == "gguf_q4_k" else np.zeros_like(d)
    per_group = 256 // group  # groups of a super-block
    d, dmin = np.repeat(d, per_group), np.repeat(dmin, per_group)
    xs = x.reshape(-1, group).astype(np.float64)
    if fmt == "gguf_q4_k":
        span = np.maximum(xs.max(axis=1), 0) - np.minimum(xs.min(axis=1), 0)
    else:
        span = np.abs(xs).max(axis=1)
    error = np.abs(ours.reshape(-1, group) - xs).max(axis=1)
    bound = (span + dmin) / steps / 2 + d / 2
    assert np.all(error <= bound * (1 + 1e-6))
    # At a model's magnitudes that is within one step of the sub-block.
    if magnitude == 1.0:
        assert np.all(error <= span / steps)
    assert np.all(ours.reshape(-1, group)[span == 0] == 0)


def test_quantized_table_is_read_by_reference_and_fuses_with_positions():
    rng = np.random.default_rng(5)
    table = QuantizedTable.quantize(rng.standard_normal((20, 32)), "int8", group_size=8)
    positions = rng.standard_normal((16, 32)).astype(np.float32)
    ids = np.array([[3, 4, 5]])
    out = embrope.embed(table, ids, position_table=positions, norm="rms_norm")
    x = table.dequantize().astype(np.float64)[ids[0]] + positions[:3]
    want = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=1e-6)
    table.data[3] = 0  # by reference: the next lookup sees the change
    assert np.all(embrope.embed(table, np.array([3])) == 0)


def test_quantized_table_errors_name_the_argument_and_the_rule():
    rng = np.random.default_rng(1)
    good = QuantizedTable.quantize(rng.standard_normal((8, 64)), "int4", group_size=16)
    ids = np.array([1, 2])
    with pytest.raises(embrope.InvalidArgumentError, match=r"table.data has 32 columns.*33 bytes"):
        embrope.embed(QuantizedTable("int4", good.data, dim=66, scales=good.scales), ids)
    with pytest.raises(embrope.InvalidArgumentError, match=r"table.scales has 3 columns.*divide D 64"):
        embrope.embed(QuantizedTable("int4", good.data, scales=np.ones((8, 3), np.float32)), ids)
    with pytest.raises(embrope.InvalidArgumentError, match="format int4 needs table.scales"):
        embrope.embed(QuantizedTable("int4", good.data), ids)
    with pytest.raises(embrope.InvalidArgumentError, match="not whole gguf_q4_k blocks"):
        QuantizedTable("gguf_q4_k", np.zeros((2, 100), np.uint8))
    with pytest.raises(embrope.InvalidArgumentError, match="format 'q4' is not one of"):
        QuantizedTable("q4", good.data)
    with pytest.raises(embrope.InvalidArgumentError, match="group_size 24 must divide D 64"):
        QuantizedTable.quantize(np.ones((2, 64)), "int8", group_size=24)
    with pytest.raises(embrope.InvalidArgumentError, match="D 100 must be a multiple of 256"):
        QuantizedTable.quantize(np.ones((2, 100)), "gguf_q4_k")
    with pytest.raises(embrope.BadIndexError, match="ids"):
        embrope.embed(good, np.array([8]))


def test_torch_embed_takes_a_quantized_table_forward_only():
    torch = pytest.importorskip("torch")
    import embrope.torch as et

    gen = torch.Generator().manual_seed(3)
    weights = torch.randn(40, 64, generator=gen)
    table = QuantizedTable.quantize(weights, "int4", group_size=16, zero_point=True)
    assert isinstance(table.data, torch.Tensor)
    ids = torch.tensor([[3, 39, 0], [7, 7, 12]])
    positions = torch.randn(8, 64, generator=gen)
    out = et.embed(table, ids, positions="learned", position_table=positions, scale=0.5)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 3, 64)
    # Each element rounded once from float32: the dequantized row scaled plus the position.
    values = torch.from_numpy(np.asarray(table.dequantize(), dtype=np.float32))
    want = 0.5 * values[ids] + positions[torch.arange(3)].expand(2, 3, 64)
    assert torch.equal(out.float(), want.to(out.dtype).float())
    assert torch.equal(out, embrope.embed(table, ids, positions="learned",
                                          position_table=positions, scale=0.5))
    # A float input that requires grad would get none: refused, and accepted under no_grad.
    learnable = positions.clone().requires_grad_()
    with pytest.raises(embrope.InvalidArgumentError,
                       match="position_table requires grad, and embed of a QuantizedTable has "
                             "no backward"):
        et.embed(table, ids, positions="learned", position_table=learnable)
    with torch.no_grad():
        et.embed(table, ids, positions="learned", position_table=learnable)
    # Its scales are constants to embed: one that requires grad is refused by name.
    graded = QuantizedTable("int4", table.data, dim=64,
                            scales=table.scales.clone().requires_grad_(),
                            zero_points=table.zero_points)
    for call in (embrope.embed, et.embed):
        with pytest.raises(embrope.InvalidArgumentError,
                           match="table.scales requires grad, and embed has no backward for "
                                 "quantized tables"):
            call(graded, ids)
    # So is a learnable scale, as with a float table (it would be read as a number).
    with pytest.raises(embrope.InvalidArgumentError,
                       match="embed: scale is a tensor that requires grad"):
        et.embed(table, ids, scale=torch.tensor(0.5, requires_grad=True))
    with torch.no_grad():
        assert torch.equal(et.embed(table, ids, scale=torch.tensor(0.5, requires_grad=True)),
                           embrope.embed(table, ids, scale=0.5))


def test_a_big_endian_gguf_file_is_refused(tmp_path):
    # Its Q8_0 blocks' float16 scales were read in this machine's byte order: values off by
    # up to 1e6, silently.
    gguf = pytest.importorskip("gguf")
    rows = np.random.default_rng(8).standard_normal((8, 64)).astype(np.float32)
    path = tmp_path / "big.gguf"
    writer = gguf.GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_tensor("token_embd.weight", gguf.quants.quantize(rows, gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(embrope.InvalidArgumentError, match="byte order is not this machine's"):
        QuantizedTable.from_gguf(str(path))
