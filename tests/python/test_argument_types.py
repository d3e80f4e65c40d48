"""The NumPy / DLPack surface's arguments that are not arrays, and arrays known only through
``__dlpack__``: a value of the wrong kind is refused naming the op and the argument, never
truncated (``int(8.9)``), parsed (``int("1")``) or passed to the native module to fail there
with its signature dump; an array whose DLPack export is read-only is never written."""

import numpy as np
import pytest

import embrope
from embrope import _arrays


class DLPackOnly:
    """An array known only through the DLPack protocol (no shape, no dtype), as some
    frameworks' and array-API wrappers' arrays are."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def read_only(shape, value=1.0) -> np.ndarray:
    """A read-only array over immutable bytes (np.frombuffer of a bytes object)."""
    data = np.full(shape, value, np.float32).tobytes()
    return np.frombuffer(data, np.float32).reshape(shape)


def test_an_array_whose_dlpack_export_is_read_only_is_never_written():
    cache = embrope.RopeCache(8, 4)
    q = read_only((2, 1, 8))
    before = q.copy()
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"^apply_rope: q is read-only \(its DLPack export says so"):
        embrope.apply_rope(DLPackOnly(q), None, np.arange(2), cache)
    table = np.arange(24, dtype=np.float32).reshape(3, 8)
    out = read_only((2, 8), 5.0)
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"^embed: out is read-only \(its DLPack export says so"):
        embrope.embed(table, np.array([2, 0]), out=DLPackOnly(out))
    np.testing.assert_array_equal(q, before)
    np.testing.assert_array_equal(out, np.full((2, 8), 5.0, np.float32))


def test_a_writable_array_known_only_through_dlpack_is_written_in_place():
    # The rotation of position 1 moves q; position 0 is the identity (cos 1, sin 0).
    cache = embrope.RopeCache(8, 4)
    q = np.ones((2, 1, 8), np.float32)
    embrope.apply_rope(DLPackOnly(q), None, np.arange(2), cache)
    np.testing.assert_array_equal(q[0], np.ones((1, 8), np.float32))
    inv_freq, _ = embrope.rope_frequencies(8)
    c, s = np.cos(inv_freq), np.sin(inv_freq)
    np.testing.assert_allclose(q[1, 0], np.concatenate([c - s, s + c]), rtol=1e-6)
    table = np.arange(24, dtype=np.float32).reshape(3, 8)
    out = np.zeros((2, 8), np.float32)
    embrope.embed(table, np.array([2, 0]), out=DLPackOnly(out))
    np.testing.assert_array_equal(out, table[[2, 0]])


def test_an_output_like_an_array_known_only_through_dlpack_is_refused_by_name():
    table = np.zeros((3, 8), np.float32)
    with pytest.raises(TypeError, match=r"^embed: table is a DLPackOnly without shape and "
                                        r"dtype; .* pass the output array"):
        embrope.embed(DLPackOnly(table), np.array([1]))
    with pytest.raises(TypeError, match=r"^apply_rope: q is a DLPackOnly without shape"):
        embrope.apply_rope(DLPackOnly(np.zeros((1, 1, 8), np.float32)), None, np.arange(1),
                           embrope.RopeCache(8, 4), inplace=False)


@pytest.mark.parametrize("call, message", [
    (lambda t, ids, c: embrope.embed(t, ids, vocab_start=1.5),
     r"^embed: vocab_start must be an integer, not float \(1\.5\)"),
    (lambda t, ids, c: embrope.embed(t, ids, vocab_start="1"),
     r"^embed: vocab_start must be an integer, not str"),
    (lambda t, ids, c: embrope.embed(t, ids, vocab_start=True),
     r"^embed: vocab_start must be an integer, not a bool"),
    (lambda t, ids, c: embrope.embed(t, ids, scale="2"),
     r"^embed: scale must be a real number, not str"),
    (lambda t, ids, c: embrope.embed_backward(np.ones((1, 8), np.float32), ids,
                                              np.zeros((4, 8), np.float32), padding_idx=9.7),
     r"^embed_backward: padding_idx must be an integer, not float \(9\.7\)"),
    (lambda t, ids, c: embrope.apply_rope(np.ones((1, 1, 8), np.float32), None, ids, c,
                                          rotary_dim=8.9),
     r"^apply_rope: rotary_dim must be an integer, not float \(8\.9\)"),
    (lambda t, ids, c: embrope.apply_rope(np.ones((1, 1, 8), np.float32), None, ids, c,
                                          mrope_section="123"),
     r"^apply_rope: mrope_section must be a sequence of integers, not str"),
    (lambda t, ids, c: embrope.apply_rope(np.ones((1, 1, 8), np.float32), None, ids, c,
                                          mrope_section=(1.5, 1, 2)),
     r"^apply_rope: mrope_section must be an integer, not float \(1\.5\)"),
    (lambda t, ids, c: embrope.apply_rope(np.ones((1, 1, 8), np.float32), None, ids, c,
                                          axes_dim=8),
     r"^apply_rope: axes_dim must be a sequence of integers, not int"),
    (lambda t, ids, c: embrope.RopeCache(8.5, 4),
     r"^RopeCache: rotary_dim must be an integer, not float \(8\.5\)"),
    (lambda t, ids, c: embrope.RopeCache.vit_2d(64.5, 16),
     r"^RopeCache: head_dim must be an integer, not float \(64\.5\)"),
    (lambda t, ids, c: embrope.RopeCache.from_preset("llama-3-8b", max_positions=64.9),
     r"^RopeCache: max_positions must be an integer, not float \(64\.9\)"),
    (lambda t, ids, c: embrope.RopeCache(8, 4, scaling="longrope", factor=2.0,
                                         original_max_positions=2, short_factor=["1"] * 4,
                                         long_factor=[1.0] * 4),
     r"^RopeCache: short_factor must be a real number, not str"),
    (lambda t, ids, c: embrope.apply_rope(np.ones((1, 1, 8), np.float32), None, ids, c,
                                          mrope_section=np.array(3)),
     r"^apply_rope: mrope_section must be a sequence of integers, not ndarray"),
    (lambda t, ids, c: embrope.RopeCache("8", 4),
     r"^RopeCache: rotary_dim must be an integer, not str"),
    (lambda t, ids, c: embrope.RopeCache(8, 4, scaling="linear", factor="2"),
     r"^RopeCache: factor cannot be str \('2'\); it takes float values"),
])
def test_a_value_of_the_wrong_kind_is_refused_naming_the_op_and_argument(call, message):
    table = np.arange(32, dtype=np.float32).reshape(4, 8)
    ids = np.array([1])
    with pytest.raises(TypeError, match=message):
        call(table, ids, embrope.RopeCache(8, 4))


def test_integers_of_every_kind_are_taken_as_they_are():
    # Integers of every framework, and floats holding whole numbers (a head dim computed as
    # embed_dim / num_heads), as int() took them before; only fractions are refused.
    torch = pytest.importorskip("torch")
    table = np.arange(32, dtype=np.float32).reshape(4, 8)
    for start in (1, np.int64(1), np.int32(1), np.array(1), torch.tensor(1), 1.0,
                  np.float32(1.0)):
        out = embrope.embed(table, np.array([2]), vocab_start=start)
        np.testing.assert_array_equal(out, table[[1]])
    for cache in (embrope.RopeCache(np.int64(8), np.int32(4)), embrope.RopeCache(8.0, 4.0)):
        assert (cache.rotary_dim, cache.max_positions) == (8, 4)
    assert embrope.RopeCache.vit_2d(768 / 12, 16).axes_dim == (32, 32)
    out = embrope.embed(table, np.array([2]), scale=torch.tensor(2.0))
    np.testing.assert_array_equal(out, 2 * table[[2]])


def test_a_bool_is_refused_even_where_the_equal_integer_was_seen_before():
    # The embed options are shared between calls by their arguments' values, and True == 1:
    # the type is part of the key, so a cached vocab_start=1 does not let True through.
    table = np.arange(32, dtype=np.float32).reshape(4, 8)
    embrope.embed(table, np.array([2]), vocab_start=1)
    with pytest.raises(TypeError, match=r"^embed: vocab_start must be an integer, not a bool"):
        embrope.embed(table, np.array([2]), vocab_start=True)


def test_a_stream_that_is_not_a_handle_is_refused():
    with pytest.raises(embrope.InvalidArgumentError, match=r"stream -1 is not a cudaStream_t"):
        _arrays.stream_handle(-1)
    with pytest.raises(embrope.InvalidArgumentError, match=r"stream 18446744073709551616 is not"):
        _arrays.stream_handle(2**64)
    with pytest.raises(TypeError, match=r"stream must be an int or a CUDA stream object, not bool"):
        _arrays.stream_handle(True)
    assert _arrays.stream_handle(2**64 - 1) == 2**64 - 1


def test_a_bare_cuda_device_is_the_current_one(monkeypatch):
    # As torch.device("cuda") means torch.cuda.current_device() (a rank's GPU after
    # torch.cuda.set_device), not GPU 0. Without a GPU torch's answers are stand-ins.
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _arrays.parse_device("cuda") == (1, 3)
    assert _arrays.parse_device(torch.device("cuda")) == (1, 3)
    assert _arrays.parse_device("cuda:1") == (1, 1)
    assert _arrays.parse_device("cpu") == (0, 0)
