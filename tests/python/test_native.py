"""The boundary between the package and its native module: one typed call per op, its
settings built by keyword in one place (embrope._native) for the NumPy / DLPack functions
and embrope.torch alike."""

import numpy as np
import pytest

import embrope
from embrope import _arrays, _native
from embrope import _embrope as _C


def rope_inputs():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((3, 2, 8)).astype(np.float32)
    return q, np.arange(3, dtype=np.int64), embrope.RopeCache(8, 16)


def test_native_table_is_a_cache_cos_and_sin_or_a_cos_sin_cache():
    q, positions, cache = rope_inputs()
    cos, sin = cache.cos, cache.sin
    table = np.array(cache.table)
    for tables in ({"cache": cache._native, "cos": cos, "sin": sin}, {"cos": cos}, {},
                   {"cache": cache._native, "cos_sin_cache": table},
                   {"cos": cos, "sin": sin, "cos_sin_cache": table}):
        with pytest.raises(embrope.InvalidArgumentError,
                           match="apply_rope: give the cos/sin table as cache, as cos and sin, or "
                                 "as cos_sin_cache"):
            _C.apply_rope(q.copy(), None, positions, **tables)


def test_native_cos_sin_cache_is_split_into_its_halves():
    # The halves' views, formed natively, read what slices of the table hold: the same bits as
    # cos and sin given apart, for a table whose rows are spaced wider than they are too.
    q, positions, cache = rope_inputs()
    table = np.array(cache.table)  # [16, 8]: 4 cos columns, then 4 sin columns
    half = table.shape[1] // 2
    wide = np.full((16, 13), np.nan, np.float32)
    wide[:, 3:11] = table
    for layout in (table, wide[:, 3:11]):
        want = q.copy()
        _C.apply_rope(want, None, positions, cos=layout[:, :half], sin=layout[:, half:])
        got = q.copy()
        _C.apply_rope(got, None, positions, cos_sin_cache=layout)
        np.testing.assert_array_equal(got, want)
        assert not np.array_equal(got, q)
    for bad in (table[:, :7], table[0], table[None]):
        with pytest.raises(embrope.InvalidArgumentError,
                           match=r"apply_rope: cos_sin_cache has shape \[.*\]; it must be "
                                 r"\[max_positions, rotary_dim\] with rotary_dim even"):
            _C.apply_rope(q.copy(), None, positions, cos_sin_cache=bad)
    # Its errors name it, not one of the halves formed from it.
    for bad, dtype in ((table.astype(np.int32), "int32"), (table.astype(np.float64), "float64")):
        with pytest.raises(embrope.InvalidArgumentError,
                           match=f"apply_rope: cos_sin_cache has dtype {dtype}.*float32, "
                                 "float16 or bfloat16"):
            _C.apply_rope(q.copy(), None, positions, cos_sin_cache=bad)
    with pytest.raises(embrope.InvalidArgumentError,
                       match="apply_rope: cos_sin_cache has stride 2 in its last dimension, "
                             "which must be 1"):
        _C.apply_rope(q.copy(), None, positions, cos_sin_cache=np.repeat(table, 2, axis=1)[:, ::2])
    # A table without rows: no position is inside it (and no address is formed past it).
    with pytest.raises(embrope.BadIndexError, match="positions"):
        _C.apply_rope(q.copy(), None, positions, cos_sin_cache=np.zeros((0, 8), np.float32))


def test_native_calls_take_their_settings_by_keyword():
    q, positions, cache = rope_inputs()
    with pytest.raises(TypeError):
        _C.apply_rope(q, None, positions, cache._native)
    with pytest.raises(TypeError):
        _C.embed(np.zeros((4, 8), np.float32), np.zeros(2, np.int32),
                 np.zeros((2, 8), np.float32), _C.EmbedOptions())


def test_a_misspelt_setting_is_an_error_not_a_no_op():
    with pytest.raises(TypeError, match="RopeConfig has no field 'factr'"):
        embrope.rope_frequencies(64, scaling="linear", factr=2.0)
    with pytest.raises(TypeError, match="EmbedOptions has no field 'norm_epsilon'"):
        _arrays.settings("embed", _C.EmbedOptions, norm_epsilon=1e-6)


def fields(native, names):
    return {name: getattr(native, name) for name in names}


def test_python_defaults_are_the_libraries():
    rope_fields = ("layout", "inverse", "rotary_dim", "mrope_section", "mrope_interleaved")
    table = np.zeros((16, 8), np.float32)
    assert (fields(_native.rope_settings("apply_rope", table).options("apply_rope"), rope_fields)
            == fields(_C.RopeOptions(), rope_fields))
    embed_fields = ("scale", "vocab_start", "vocab_shard", "positions", "sinusoid_base",
                    "sinusoid_layout", "norm", "norm_eps", "norm_unit_offset")
    assert (fields(_native.embed_settings("embed").options("embed"), embed_fields)
            == fields(_C.EmbedOptions(), embed_fields))
    backward_fields = ("scale", "vocab_start", "vocab_shard", "padding_idx", "mode")
    ours = _native.embed_backward_options("embed_backward", scale=1.0, vocab_start=0,
                                          vocab_shard=False, padding_idx=None,
                                          mode="deterministic")
    assert fields(ours, backward_fields) == fields(_C.EmbedBackwardOptions(), backward_fields)


def test_a_call_takes_its_own_settings_else_its_caches():
    cache = embrope.RopeCache(12, 16, layout="interleaved", mrope_section=(2, 2, 2),
                              mrope_interleaved=True)
    interleaved = _C.RopeLayout.interleaved.value
    none = (0, 0, 0, 0)  # no axes
    assert _native.rope_settings("apply_rope", cache) == (interleaved, False, 0,
                                                          (2, 2, 2, 1) + none, 1.0, 1.0)
    assert _native.rope_settings("apply_rope", cache, layout="neox", inverse=True,
                                 mrope_section=(4, 1, 1), q_out_scale=2.0) == (0, True, 0,
                                                                               (4, 1, 1, 0) + none,
                                                                               2.0, 1.0)
    # A table array carries no settings: neox, no mrope, no axes; an axial cache its axes.
    assert _native.rope_settings("apply_rope", cache.table) == (0, False, 0, (0,) * 8, 1.0, 1.0)
    axial = embrope.RopeCache.axial([8, 4], 16)
    assert _native.rope_settings("apply_rope", axial) == (0, False, 0, (0, 0, 0, 0, 8, 4, 0, 0),
                                                          1.0, 1.0)


def test_torch_and_numpy_give_the_same_bits_from_one_cache():
    torch = pytest.importorskip("torch")
    import embrope.torch as et

    rng = np.random.default_rng(3)
    cache = embrope.RopeCache(12, 32, layout="interleaved", mrope_section=(2, 2, 2),
                              mrope_interleaved=True)
    q = rng.standard_normal((5, 3, 16)).astype(np.float32)
    positions = rng.integers(0, 32, (3, 5)).astype(np.int64)
    by_numpy, _ = embrope.apply_rope(q, None, positions, cache, inplace=False)
    by_torch, _ = et.apply_rope(torch.from_numpy(q), None, torch.from_numpy(positions), cache)
    np.testing.assert_array_equal(by_torch.numpy(), by_numpy)
    # and they are not the neox rotation without mrope (the settings did arrive)
    plain, _ = embrope.apply_rope(q, None, positions[0], cache.table, inplace=False)
    assert not np.array_equal(plain, by_numpy)


def struct_fields(header, opening):
    """The member names of the struct whose body follows `opening` in `header` (comments and
    default values dropped; `double a, b;` gives a and b)."""
    import pathlib
    import re
    text = (pathlib.Path(__file__).parents[2] / "include" / "embrope" / header).read_text()
    body = text[text.index(opening) + len(opening):]
    body = body[:body.index("\n}")]
    body = re.sub(r"/\*.*?\*/|//[^\n]*", "", body, flags=re.S)
    names = []
    for declaration in body.split(";"):
        declaration = re.sub(r"\{[^}]*\}|=[^,]*", "", declaration).strip()
        if not declaration:
            continue
        first, *rest = declaration.split(",")
        names += [first.split()[-1].lstrip("*")] + [r.strip().lstrip("*") for r in rest]
    return names


def test_rope_config_field_table_holds_every_field_of_both_structs():
    # EMBROPE_ROPE_CONFIG_VALUES / _FACTORS (embrope/rope_cache.hpp) drive the C API's
    # conversions and this binding: a field missing from them would be dropped silently.
    table = set(_C.RopeConfig.fields)
    cpp = set(struct_fields("rope_cache.hpp", "struct RopeConfig {"))
    c = set(struct_fields("embrope.h", "typedef struct embrope_rope_config_t {"))
    assert "beta_slow" in c and "high_freq_factor" in c and "long_factor" in cpp  # the parser
    assert cpp - {"scaling"} == table
    assert c - {"struct_size", "scaling", "num_factors"} == table
    assert len(_C.RopeConfig.fields) == len(table)


def _count_dlpack_exports(monkeypatch, torch):
    """Tensor.__dlpack__ wrapped to count its calls (it still exports)."""
    calls = []
    dlpack = torch.Tensor.__dlpack__

    def counted(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return dlpack(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "__dlpack__", counted)
    return calls


def test_plain_tensors_reach_the_native_module_as_capsules(monkeypatch):
    # Tensor.__dlpack__'s Python-level checks cost 2-4 us a tensor, most of a one-token
    # call: plain tensors (and parameters) go as torch's own export, whatever the surface.
    torch = pytest.importorskip("torch")
    calls = _count_dlpack_exports(monkeypatch, torch)
    table = torch.nn.Parameter(torch.randn(10, 8).bfloat16())
    ids = torch.tensor([[3, 1, 4], [1, 5, 9]])
    with torch.no_grad():
        out = embrope.embed(table, ids)
    assert torch.equal(out, torch.nn.functional.embedding(ids, table.detach()))
    q = torch.randn(4, 2, 8)[1:]  # a view with a storage offset
    expected = q.clone()
    embrope.apply_rope(expected.numpy(), None, np.arange(3), embrope.RopeCache(8, 16))
    embrope.apply_rope(q, None, torch.arange(3), embrope.RopeCache(8, 16))
    assert torch.equal(q, expected)
    rotated = embrope.torch.apply_rope(torch.randn(3, 2, 8), None, torch.arange(3),
                                       embrope.RopeCache(8, 16))
    assert rotated[0].shape == (3, 2, 8)
    assert calls == []


def test_a_tensor_subclass_with_overrides_keeps_the_dlpack_protocol(monkeypatch):
    torch = pytest.importorskip("torch")
    calls = _count_dlpack_exports(monkeypatch, torch)
    seen = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    base = torch.randn(10, 8)
    out = embrope.embed(base.as_subclass(Logged), torch.tensor([2, 7]), out=torch.empty(2, 8))
    assert torch.equal(out, base[[2, 7]])
    assert "Logged" in calls and seen  # its export went through its override


def test_settings_shared_between_calls_keep_the_sign_of_a_zero_scale():
    # 0.0 == -0.0 as keys, but the rows scaled by them differ in the zeros' signs: a call with
    # -0.0 after one with 0.0 must not reuse the first call's settings.
    table = np.array([[1.0, -2.0], [3.0, 0.5]], np.float32)
    ids = np.array([1, 0])
    for _ in range(2):  # the second round finds both settings shared
        plus = embrope.embed(table, ids, scale=0.0)
        minus = embrope.embed(table, ids, scale=-0.0)
        assert np.array_equal(np.signbit(plus), np.signbit(table[ids] * np.float32(0.0)))
        assert np.array_equal(np.signbit(minus), np.signbit(table[ids] * np.float32(-0.0)))
    torch = pytest.importorskip("torch")
    import embrope.torch as et

    plus = et.embed(torch.from_numpy(table), torch.from_numpy(ids), scale=0.0)
    minus = et.embed(torch.from_numpy(table), torch.from_numpy(ids), scale=-0.0)
    assert torch.equal(torch.signbit(minus), ~torch.signbit(plus))


def test_settings_given_as_tensors_are_read_on_every_call():
    # A 0-d tensor compares by identity as a key and can change in place between calls: its
    # value, not a cached reading of it, decides each call.
    torch = pytest.importorskip("torch")
    table, ids = torch.randn(10, 8), torch.tensor([1, 2, 30])
    shard = torch.tensor(True)
    assert torch.equal(embrope.embed(table, ids, vocab_shard=shard)[2], torch.zeros(8))
    shard.fill_(False)
    with pytest.raises(embrope.BadIndexError, match=r"embed: ids\[2\] = 30 is outside"):
        embrope.embed(table, ids, vocab_shard=shard)
    scale = torch.tensor(2.0)
    assert torch.equal(embrope.embed(table, ids[:2], scale=scale), table[ids[:2]] * 2)
    scale.fill_(3.0)
    assert torch.equal(embrope.embed(table, ids[:2], scale=scale), table[ids[:2]] * 3)
