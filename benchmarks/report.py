"""The benchmark's report: one table, the JSON and a plot, from embrope-bench's JSON.

    python benchmarks/report.py RAW_JSON --out DIR [--command TEXT] [--no-torch]
                                [--models MODELS_JSON]

Reads Google Benchmark's JSON written by embrope-bench (medians of repetitions), adds PyTorch
eager's time for the same cases, measured now, in this run, on the same device and threads,
when torch is importable, and writes into DIR:

- bench.json: one record per case (op, shape, dtype, tokens, median time, GB/s, the GB/s of
  the ceiling of its access pattern over the same bytes timed inside the same case (a copy,
  or for in-place ops an in-place pass, strided over the rotary part of each head row for a
  partial rotation) and the op's percentage of it, the working set
  against the last-level cache, the ratio to the unfused baseline and to PyTorch eager) and
  the run's metadata (machine, commit, command, instruction set);
- bench.md: the same as a markdown table, with the machine, command and commit;
- bench.png: per op at its largest size, the percentage of its ceiling and the speed-up over
  PyTorch eager, as bars (needs matplotlib).

With --models, the end-to-end rows of benchmarks/models.py (HF models unpatched and patched
with embrope.transformers, same run) join the table. The table is also printed. Only the Python standard library is needed for the table and the
JSON; torch and matplotlib are optional.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import time
from typing import Any, Optional

# Threads below this many bytes moved: the copy and the op both run on one thread and in cache.
SMALL_BYTES = 256 * 1024

ROPE_OPS = ("rope", "axial_rope", "rope_backward", "rope_append_kv", "rope_fp8", "qk_norm_rope",
            "qk_norm_rope_append_kv", "qk_norm_rope_append_kv_fp8", "mla_rope_fp8",
            "mla_rope_append_kv")
NAME = re.compile(
    r"^(?P<op>" + "|".join(sorted(ROPE_OPS, key=len, reverse=True)) +
    r"|embed_backward|embed_layer_norm|embed_quantized|embed)/(?P<rest>.*?)"
    r"(?:/real_time|/manual_time)?$")


def parse_case(name: str) -> Optional[dict]:
    """rope/llama3-8b/bf16/T=16384[/variant] -> fields; embed/learned/f32/D=4096/T=64[...]."""
    match = NAME.match(name)
    if not match:
        return None
    op, parts = match.group("op"), match.group("rest").split("/")
    case = {"op": op, "variant": ""}
    if op in ROPE_OPS:
        case.update(shape=parts[0], dtype=parts[1], tokens=int(parts[2][2:]))
        case["variant"] = "/".join(parts[3:])
    elif op == "embed_quantized":  # embed_quantized/int8->bf16/D=4096/T=16384
        fmt, out = parts[0].split("->")
        case.update(op=f"{op} {fmt}", shape=parts[1], dtype=f"{fmt}->{out}",
                    tokens=int(parts[2][2:]))
        case["variant"] = "/".join(parts[3:])
    elif op in ("embed", "embed_layer_norm"):
        case.update(op=f"{op} {parts[0]}", shape=parts[2], dtype=parts[1],
                    tokens=int(parts[3][2:]))
        case["variant"] = "/".join(parts[4:])
    else:  # embed_backward/deterministic/bf16/D=4096/T=16384[/one_id]
        case.update(op=f"embed_backward {parts[0]}", shape=parts[2], dtype=parts[1],
                    tokens=int(parts[3][2:]))
        case["variant"] = "/".join(parts[4:])
    return case


def read_cases(raw: dict) -> list[dict]:
    """The op rows from the medians in Google Benchmark's JSON, each with the GB/s of the
    ceiling pass over the same bytes timed inside the same case (ceiling_gbps; ceiling: "copy"
    or "in-place pass", or for a partial rotation "in-place pass, T of each R B") and its
    working set (the bytes it touches: half the bytes moved in place,
    all of them otherwise)."""
    cases = []
    for b in raw["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        if b.get("error_occurred") or b.get("skipped"):
            continue
        seconds = b["real_time"] * {"us": 1e-6, "ms": 1e-3, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
        name = b.get("run_name", b["name"])
        case = parse_case(name)
        if case is None:
            continue
        moved = int(b.get("bytes", 0))
        # Files from before the in-place ceiling name it copy_seconds / pct_of_copy.
        ceiling_seconds = b.get("ceiling_seconds", b.get("copy_seconds"))
        in_place = bool(b.get("in_place", 0))
        # A partial rotation's ceiling: the in-place pass over the first touched_bytes of each
        # row_bytes (bench.cpp's Rows).
        strided = in_place and b.get("touched_bytes", 0) and b.get("row_bytes", 0)
        ceiling = "copy"
        if in_place:
            ceiling = (f"in-place pass, {int(b['touched_bytes'])} of each {int(b['row_bytes'])} B"
                       if strided else "in-place pass")
        case.update(name=name, seconds=seconds, bytes=moved, gbps=moved / seconds / 1e9,
                    ceiling=ceiling,
                    ceiling_gbps=moved / ceiling_seconds / 1e9 if ceiling_seconds else None,
                    pct_of_ceiling=b.get("pct_of_ceiling", b.get("pct_of_copy")),
                    working_set=moved // 2 if in_place else moved,
                    x_vs_unfused=b.get("x_vs_unfused"))
        cases.append(case)
    return cases


# ------------------------------------------------------------------- PyTorch eager ----

ROPE_SHAPES = {  # hq, hk, head_dim, rotary_dim, interleaved (as benchmarks/bench.cpp)
    "llama3-8b": (32, 8, 128, 128, False), "llama3-70b": (64, 8, 128, 128, False),
    "qwen2.5-7b": (28, 4, 128, 128, False), "pythia": (32, 32, 128, 32, False),
    "gpt-j": (16, 16, 256, 64, True), "hd80": (32, 32, 80, 80, False),
    "hd256": (16, 16, 256, 256, False),
}


def time_median(fn, sync, budget: float = 0.1, max_reps: int = 15) -> float:
    fn()
    sync()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


_tensors: dict = {}


def tensor(torch, name: str, shape: tuple, dtype, device: str, integers: int = 0):
    """A tensor for the timings, made once per (name, shape, dtype): constant values (their
    contents do not change eager PyTorch's speed), or indices spread over [0, integers)."""
    key = (name, shape, dtype, device, integers)
    if key not in _tensors:
        if integers:
            count = shape[0]
            _tensors[key] = ((torch.arange(count, dtype=torch.int64) * 7919) % integers).to(device)
        else:
            _tensors[key] = torch.full(shape, 0.5, dtype=dtype, device=device)
    return _tensors[key]


AXIAL_SHAPES = {  # heads, head_dim, interleaved pairs (as benchmarks/bench.cpp's axial cases)
    "flux": (24, 128, True), "qwen2-vl-vision": (16, 80, False),
}


def axial_eager_seconds(torch, case: dict, dtype, device: str, sync) -> Optional[float]:
    """Axial RoPE as the models' own code runs it per attention layer, from the per-token
    cos/sin [T, D] that their position module computes once per forward: diffusers'
    apply_rotary_emb (use_real, adjacent pairs) for Flux, transformers'
    apply_rotary_pos_emb_vision (rotate_half) for Qwen2-VL's vision tower; q and k."""
    if case["shape"] not in AXIAL_SHAPES:
        return None
    heads, dim, interleaved = AXIAL_SHAPES[case["shape"]]
    tokens = case["tokens"]
    q = tensor(torch, "q", (tokens, heads, dim), dtype, device)
    k = tensor(torch, "k", (tokens, heads, dim), dtype, device)
    cos = tensor(torch, "axial_cos", (tokens, 1, dim), torch.float32, device)
    sin = tensor(torch, "axial_sin", (tokens, 1, dim), torch.float32, device)

    def rotate(x):
        if interleaved:
            real, imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
            rotated = torch.stack([-imag, real], dim=-1).flatten(-2)
        else:
            a, b = x.chunk(2, dim=-1)
            rotated = torch.cat((-b, a), dim=-1)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)

    return time_median(lambda: (rotate(q), rotate(k)), sync)


def to_e4m3(torch, x, scale: float):
    """x * scale in float32, clamped to float8_e4m3fn's finite range and converted, as eager
    PyTorch code writes float8 (bench.cpp's float8 cases)."""
    return (x.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def paged_cache(torch, tokens: int, heads: int, dim: int, dtype, device: str):
    """A paged KV cache's k and v [pages * 16, heads, dim] for `tokens` tokens, and the slots
    0..tokens-1 (bench.cpp's: pages of 16, slots in order)."""
    pages = (tokens + 15) // 16
    k_cache = torch.zeros(pages * 16, heads, dim, dtype=dtype, device=device)
    return k_cache, torch.zeros_like(k_cache), torch.arange(tokens, device=device)


def append_paged(torch, k_cache, v_cache, slots, k, v) -> None:
    """k and v written into a paged cache at slots as vLLM's reshape_and_cache_flash does
    (index_copy_); a float8 cache (scale 1) takes each part through to_e4m3, as bytes."""
    if k_cache.dtype == torch.float8_e4m3fn:
        k_cache.view(torch.uint8).index_copy_(0, slots, to_e4m3(torch, k, 1.0).view(torch.uint8))
        v_cache.view(torch.uint8).index_copy_(0, slots, to_e4m3(torch, v, 1.0).view(torch.uint8))
    else:
        k_cache.index_copy_(0, slots, k)
        v_cache.index_copy_(0, slots, v)


def torch_eager_seconds(torch, case: dict, device: str, vocab: int) -> Optional[float]:
    """PyTorch eager's median time for the case, or None where it has no counterpart.

    RoPE: vLLM's RotaryEmbedding.forward_native (index_select the cos/sin cache, rotate
    in the tensor's dtype, out of place). Lookup: F.embedding; learned and sinusoidal
    positions: F.embedding plus a gathered position table (a sinusoid table precomputed, as a
    torch model would hold it). RoPE with float8 outputs: the same, then each output scaled,
    clamped to the finite range and converted (``.to(torch.float8_e4m3fn)``). RoPE backward:
    autograd's gradients through forward_native. RoPE + KV append: forward_native, then k and v
    written into the paged cache by index_copy_ (vLLM's reshape_and_cache_flash). Embedding
    backward: aten's embedding_dense_backward, as autograd calls it for F.embedding."""
    if case["op"].startswith("embed_quantized "):
        return quantized_embed_eager_seconds(torch, case, device, vocab)
    quantized = case["op"] in ("rope_fp8", "qk_norm_rope_append_kv_fp8", "mla_rope_fp8")
    # "->fp8e4m3": float8 outputs, or for rope_append_kv a float8 cache.
    base = (case["dtype"].split("->")[0] if quantized or case["op"] == "rope_append_kv"
            else case["dtype"])
    if base not in ("f32", "f16", "bf16"):
        return None  # a float8 KV cache: no eager counterpart here
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[base]
    tokens = case["tokens"]
    sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
    if case["op"] == "axial_rope":
        return axial_eager_seconds(torch, case, dtype, device, sync)
    if case["op"] in ("rope", "rope_fp8", "rope_append_kv", "rope_backward"):
        if case["shape"] not in ROPE_SHAPES:
            return None
        hq, hk, dim, rotary, interleaved = ROPE_SHAPES[case["shape"]]
        q = tensor(torch, "q", (tokens, hq, dim), dtype, device)
        k = tensor(torch, "k", (tokens, hk, dim), dtype, device)
        cache = tensor(torch, "cos_sin_cache", (65536, rotary), dtype, device)
        positions = tensor(torch, "positions", (tokens,), None, device, integers=65536)

        def rotate(x, cos, sin):
            rot, rest = x[..., :rotary], x[..., rotary:]
            if interleaved:
                a, b = rot[..., 0::2], rot[..., 1::2]
                out = torch.stack((a * cos - b * sin, b * cos + a * sin), -1).flatten(-2)
            else:
                a, b = rot.chunk(2, dim=-1)
                out = torch.cat((a * cos - b * sin, b * cos + a * sin), -1)
            return torch.cat((out, rest), -1)

        def quantize(x, scale):  # as bench.cpp's rope_fp8 case: e4m3, q x 0.5, k x 2
            return (x * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)

        def rope(q, k):
            cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
            return rotate(q, cos, sin), rotate(k, cos, sin)

        if case["op"] == "rope_backward":
            # Training's backward of the same rotation: autograd's gradient of q and k through
            # forward_native's graph (built once; the gradients' time alone).
            q_leaf, k_leaf = q.detach().requires_grad_(), k.detach().requires_grad_()
            outputs = rope(q_leaf, k_leaf)
            return time_median(lambda: torch.autograd.grad(
                outputs, (q_leaf, k_leaf), (q, k), retain_graph=True), sync)
        if case["op"] == "rope_append_kv":
            # Then k and v written at their slots (append_paged; a float8 cache with
            # k_scale = v_scale = 1, as bench.cpp's fused case).
            float8 = case["dtype"].endswith("->fp8e4m3")
            v = tensor(torch, "v", (tokens, hk, dim), dtype, device)
            k_cache, v_cache, slots = paged_cache(
                torch, tokens, hk, dim, torch.float8_e4m3fn if float8 else dtype, device)

            def run_append():
                q_out, k_out = rope(q, k)
                append_paged(torch, k_cache, v_cache, slots, k_out, v)
                return q_out

            return time_median(run_append, sync)

        def run():
            q_out, k_out = rope(q, k)
            if quantized:
                return quantize(q_out, 0.5), quantize(k_out, 2.0)
            return q_out, k_out

        return time_median(run, sync)
    if case["op"] in ("mla_rope_fp8", "mla_rope_append_kv") and case["shape"] == "deepseek-v3":
        return mla_eager_seconds(torch, case["op"], tokens, dtype, device, sync)
    if case["op"].startswith("qk_norm_rope") and case["shape"] == "qwen3-8b":
        # HF Qwen3's q_norm / k_norm (RMSNorm in float32, the weight times the normalised
        # value in the input dtype), then the rotation as above; the cache-append rows then
        # write k and v at their slots as vLLM's reshape_and_cache_flash does (index_copy_ into
        # the paged cache; float8: each part scaled, clamped and converted, as bench.cpp's).
        q = tensor(torch, "q", (tokens, 32, 128), dtype, device)
        k = tensor(torch, "k", (tokens, 8, 128), dtype, device)
        wq = tensor(torch, "q_norm_weight", (128,), dtype, device)
        wk = tensor(torch, "k_norm_weight", (128,), dtype, device)
        cache = tensor(torch, "cos_sin_cache", (65536, 128), dtype, device)
        positions = tensor(torch, "positions", (tokens,), None, device, integers=65536)

        def rms_norm(x, w):
            x32 = x.float()
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
            return w * x32.to(x.dtype)

        def rotate_half(x, cos, sin):
            a, b = x.chunk(2, dim=-1)
            return torch.cat((a * cos - b * sin, b * cos + a * sin), -1)

        def run_qk():
            cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
            return rotate_half(rms_norm(q, wq), cos, sin), rotate_half(rms_norm(k, wk), cos, sin)

        if case["op"] == "qk_norm_rope":
            return time_median(run_qk, sync)
        v = tensor(torch, "v", (tokens, 8, 128), dtype, device)
        k_cache, v_cache, slots = paged_cache(
            torch, tokens, 8, 128, torch.float8_e4m3fn if quantized else dtype, device)

        def run_append():
            q_rot, k_rot = run_qk()
            append_paged(torch, k_cache, v_cache, slots, k_rot, v)
            # q x 0.5 into float8 beside a float8 cache (scale 1)
            return to_e4m3(torch, q_rot, 0.5) if quantized else q_rot

        return time_median(run_append, sync)
    if case["op"].startswith("embed ") and not case["op"].startswith("embed_backward"):
        kind = case["op"].split()[1]
        dim = int(case["shape"].split("=")[1])
        table = tensor(torch, "table", (vocab, dim), dtype, device)
        ids = tensor(torch, "ids", (tokens,), None, device, integers=vocab)
        positions = tensor(torch, "positions", (tokens,), None, device, integers=32768)
        position_table = tensor(torch, "position_table", (32768, dim), dtype, device)
        functional = torch.nn.functional
        if kind == "lookup":
            return time_median(lambda: functional.embedding(ids, table), sync)
        return time_median(
            lambda: functional.embedding(ids, table) + functional.embedding(positions,
                                                                            position_table), sync)
    if case["op"].startswith("embed_backward "):
        # F.embedding's backward (aten's embedding_dense_backward, what autograd calls): the
        # table's gradient [V, D], in grad_out's dtype.
        dim = int(case["shape"].split("=")[1])
        grad_out = tensor(torch, "grad_out", (tokens, dim), dtype, device)
        ids = tensor(torch, "ids", (tokens,), None, device, integers=vocab)
        return time_median(lambda: torch.ops.aten.embedding_dense_backward(
            grad_out, ids, vocab, -1, False), sync)
    if case["op"].startswith("embed_layer_norm "):  # learned positions, then LayerNorm
        dim = int(case["shape"].split("=")[1])
        table = tensor(torch, "table", (vocab, dim), dtype, device)
        ids = tensor(torch, "ids", (tokens,), None, device, integers=vocab)
        positions = tensor(torch, "positions", (tokens,), None, device, integers=32768)
        position_table = tensor(torch, "position_table", (32768, dim), dtype, device)
        weight = tensor(torch, "norm_weight", (dim,), dtype, device)
        bias = tensor(torch, "norm_bias", (dim,), dtype, device)
        functional = torch.nn.functional
        return time_median(
            lambda: functional.layer_norm(
                functional.embedding(ids, table) + functional.embedding(positions, position_table),
                (dim,), weight, bias, 1e-12), sync)
    return None


def quantized_embed_eager_seconds(torch, case: dict, device: str, vocab: int) -> Optional[float]:
    """A quantized table's lookup as eager PyTorch code does it (torchao's embedding of a
    quantized weight): the whole table dequantized to bfloat16, then F.embedding. The tables are
    bench.cpp's: int8 with a float32 scale per row, int4 packed two per byte with a float32
    scale and an int8 zero point per group of 32, float8_e4m3fn with a scale per row; GGUF
    blocks (Q8_0, Q4_K, Q6_K) by gguf_dequantize, the gguf package's steps in torch."""
    fmt = case["op"].split()[1]
    dim = int(case["shape"].split("=")[1])
    tokens = case["tokens"]
    sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
    ids = tensor(torch, "ids", (tokens,), None, device, integers=vocab)
    functional = torch.nn.functional
    if fmt == "int8":
        q = torch.full((vocab, dim), 17, dtype=torch.int8, device=device)
        scale = tensor(torch, "quant_row_scales", (vocab, 1), torch.float32, device)
        return time_median(lambda: functional.embedding(
            ids, (q.float() * scale).to(torch.bfloat16)), sync)
    if fmt == "int4":
        packed = torch.full((vocab, dim // 2), 0x11, dtype=torch.uint8, device=device)
        scale = tensor(torch, "quant_group_scales", (vocab, dim // 32, 1), torch.float32, device)
        zero = torch.full((vocab, dim // 32, 1), 2, dtype=torch.int8, device=device)

        def run():
            q = torch.stack(((packed >> 4).to(torch.int8) - 8, (packed & 15).to(torch.int8) - 8),
                            -1).view(vocab, dim // 32, 32)
            table = ((q.float() - zero.float()) * scale).view(vocab, dim).to(torch.bfloat16)
            return functional.embedding(ids, table)

        return time_median(run, sync)
    if fmt == "fp8e4m3":
        q = torch.full((vocab, dim), 0x11, dtype=torch.uint8, device=device).view(
            torch.float8_e4m3fn)
        scale = tensor(torch, "quant_row_scales", (vocab, 1), torch.float32, device)
        return time_median(lambda: functional.embedding(
            ids, (q.float() * scale).to(torch.bfloat16)), sync)
    if fmt in GGUF_BLOCKS:
        values, block_bytes = GGUF_BLOCKS[fmt]
        blocks = torch.full((vocab * dim // values, block_bytes), 0x11, dtype=torch.uint8,
                            device=device)
        return time_median(lambda: functional.embedding(
            ids, gguf_dequantize(torch, fmt, blocks).view(vocab, dim).to(torch.bfloat16)), sync)
    return None


GGUF_BLOCKS = {"q8_0": (32, 34), "q4_k": (256, 144), "q6_k": (256, 210)}  # values, bytes


def gguf_dequantize(torch, fmt: str, blocks):
    """llama.cpp's blocks (uint8 [n, block bytes]) to float32 [n, values] in PyTorch eager: the
    steps of the gguf package's dequantize_blocks (gguf/quants.py), tensor for tensor."""
    n = blocks.shape[0]

    def half(b):  # a block's float16 field
        return b.contiguous().view(torch.float16).float()

    def shifts(*bits):
        return torch.tensor(bits, dtype=torch.uint8, device=blocks.device)

    if fmt == "q8_0":  # d, then 32 int8 values: d * q
        return blocks[:, 2:].contiguous().view(torch.int8).float() * half(blocks[:, :2])
    if fmt == "q4_k":  # d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
        d, dmin = half(blocks[:, 0:2]), half(blocks[:, 2:4])
        packed = blocks[:, 4:16].reshape(n, 3, 4)
        s_d, s_m, s_md = packed[:, 0], packed[:, 1], packed[:, 2]
        sc = torch.cat((s_d & 0x3F, (s_md & 0x0F) | ((s_d >> 2) & 0x30)), -1).float()
        mn = torch.cat((s_m & 0x3F, (s_md >> 4) | ((s_m >> 2) & 0x30)), -1).float()
        qs = blocks[:, 16:].reshape(n, 4, 1, 32) >> shifts(0, 4).reshape(1, 1, 2, 1)
        qs = (qs & 0x0F).reshape(n, 8, 32).float()
        return ((d * sc).reshape(n, 8, 1) * qs - (dmin * mn).reshape(n, 8, 1)).reshape(n, 256)
    if fmt == "q6_k":  # 128 bytes of low nibbles, 64 of high pairs, 16 int8 scales, d
        scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
        d = (half(blocks[:, 208:210]) * scales).reshape(n, 16, 1)
        ql = blocks[:, :128].reshape(n, 2, 1, 64) >> shifts(0, 4).reshape(1, 1, 2, 1)
        ql = (ql & 0x0F).reshape(n, 8, 32)
        qh = blocks[:, 128:192].reshape(n, 2, 1, 32) >> shifts(0, 2, 4, 6).reshape(1, 1, 4, 1)
        qh = (qh & 0x03).reshape(n, 8, 32)
        q = (ql | (qh << 4)).to(torch.int8) - 32
        return (d * q.reshape(n, 16, 16).float()).reshape(n, 256)
    raise ValueError(f"gguf_dequantize: no format {fmt}")


def mla_eager_seconds(torch, op: str, tokens: int, dtype, device: str, sync) -> float:
    """DeepSeek-V3 MLA as bench.cpp's rows (q [T, 128, 128 | 64], kv_a [T, 512 | 64]): the rope
    slices rotated with interleaved pairs (vLLM's forward_native with is_neox_style=False);
    mla_rope_fp8 then quantizes every part to float8_e4m3fn (q's x 0.5, k's x 2; FlashInfer's
    mla_rope_quantize_fp8), mla_rope_append_kv writes q's rotated slice back and kv_c beside
    the rotated k_pe into the latent cache at the slots (vLLM's concat_and_cache_mla)."""
    h, nope, rope, rank = 128, 128, 64, 512
    q = tensor(torch, "mla_q", (tokens, h, nope + rope), dtype, device)
    kv_a = tensor(torch, "mla_kv", (tokens, rank + rope), dtype, device)
    cache = tensor(torch, "cos_sin_cache", (65536, rope), dtype, device)
    positions = tensor(torch, "positions", (tokens,), None, device, integers=65536)
    latent = torch.zeros((tokens + 15) // 16 * 16, rank + rope, dtype=dtype, device=device)
    slots = torch.arange(tokens, device=device)

    def rotate(x, cos, sin):
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), -1).flatten(-2)

    def run():
        cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
        q_pe = rotate(q[..., nope:], cos.unsqueeze(-2), sin.unsqueeze(-2))
        k_pe = rotate(kv_a[:, rank:], cos, sin)
        if op == "mla_rope_fp8":
            return (to_e4m3(torch, q_pe, 0.5), to_e4m3(torch, q[..., :nope], 0.5),
                    to_e4m3(torch, k_pe, 2.0), to_e4m3(torch, kv_a[:, :rank], 2.0))
        q[..., nope:] = q_pe
        latent.index_copy_(0, slots, torch.cat((kv_a[:, :rank], k_pe), -1))
        return q

    return time_median(run, sync)


# --------------------------------------------------------------------------- output ----

def machine() -> dict:
    info = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "" if value is None else f"{value:{spec}}{suffix}"


def last_level_cache_bytes() -> Optional[int]:
    """The largest CPU cache of this machine (sysfs), or None."""
    sizes = []
    for index in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def working_set(c: dict, llc: Optional[int]) -> str:
    """The case's working set, and where it lives against the last-level cache (CPU runs)."""
    size = c["working_set"]
    text = f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e3:.0f} KB"
    if llc is None:
        return text
    return text + (", LLC" if size <= llc else ", DRAM")


def table_rows(cases: list[dict], llc: Optional[int]) -> list[list[str]]:
    rows = []
    for c in cases:
        op = c["op"] + (f" ({c['variant']})" if c["variant"] else "")
        pct = c.get("pct_of_ceiling")
        small = c["bytes"] < SMALL_BYTES
        rows.append([op, c["shape"], c["dtype"], str(c["tokens"]), fmt(c["seconds"] * 1e6, ".1f"),
                     fmt(c["gbps"], ".2f"), c["ceiling"], fmt(c.get("ceiling_gbps"), ".2f"),
                     fmt(pct, ".0f", "%" + ("*" if small else "")), working_set(c, llc),
                     fmt(c.get("x_vs_unfused"), ".2f", "x"), fmt(c.get("x_vs_torch"), ".2f", "x")])
    return rows


HEADER = ["op", "shape", "dtype", "tokens", "median us", "GB/s", "ceiling", "ceiling GB/s",
          "% of ceiling", "working set", "vs unfused", "vs torch eager"]
NOTE = ("ceiling: a pass of the op's own access pattern over the same bytes on the same "
        "threads, timed after every call of the op in the same case, so that both see the "
        "machine's memory at the same moments: for an op that reads one place and writes "
        "another (or mixes in-place rows with cache writes) a copy (on the CPU with streaming "
        "stores past 16 MiB, as the ops stream large outputs: glibc's memcpy was up to 1.9x "
        "slower there; a device copy on the GPU); for an in-place op on the CPU an in-place "
        "read-modify-write pass, which outruns a copy where the data fits in the caches (no "
        "second buffer to allocate lines for); for a partial rotation (Pythia, GPT-J) that pass over the first "
        "T bytes of each R-byte head row, its own strided pattern. % of ceiling: the op's GB/s over the ceiling's (medians of both). "
        "working set: the bytes the case touches (in place: half the bytes moved), against the "
        "machine's last-level cache (LLC: it can stay there between calls; DRAM: it cannot). "
        "* marks cases under 256 KB, where both run on one thread from cache: the "
        "percentage compares call overheads more than bandwidth. vs unfused: the unfused "
        "baseline's median time over the op's (RoPE: q then k in two calls; learned positions: "
        "lookup, positions, then an add pass; RoPE + KV append: RoPE, then a copy; embed + "
        "LayerNorm: the lookup with positions, then a LayerNorm pass; qk-norm + RoPE: an "
        "RMSNorm pass over the head rows (embed with rms_norm), then RoPE; RoPE with float8 "
        "outputs: RoPE out of place, then a quantize pass; qk-norm + RoPE + KV append: qk-norm "
        "+ RoPE, then the cache copy (float8: a quantize pass and a converting copy); MLA: "
        "the rope slices' RoPE, then the nope parts' quantize pass or the latent cache copy). "
        "vs torch eager: PyTorch eager's median time over the op's, measured in the same run "
        "(qk-norm + RoPE: HF Qwen3's RMSNorm, then vLLM's RoPE; float8 outputs: vLLM's RoPE, "
        "then scale, clamp and .to(float8_e4m3fn); KV append: index_copy_ into the paged "
        "cache, as reshape_and_cache_flash writes it; MLA: interleaved RoPE of the rope "
        "slices, then each part quantized, or kv_c and k_pe copied into the latent cache as "
        "concat_and_cache_mla; RoPE backward: autograd's gradients through vLLM's RoPE; "
        "embedding backward: aten's embedding_dense_backward, as autograd calls it, the "
        "gradient in grad_out's dtype).")


MODELS_NOTE = ("model rows: a 2-layer model of the family's head sizes (hidden 2048, 16 query "
               "/ 4 KV heads of 128, float32, random weights) in HF transformers, unpatched "
               "and after embrope.transformers.patch(model), alternating in the same run; "
               "median us is the patched model's, vs torch eager is HF's time over it (the "
               "whole model: RoPE is a small part of it); the vs unfused column holds the "
               "time the patch saved (negative: lost), and says so if the two models chose "
               "different greedy tokens.")


def model_rows(models: dict) -> list[list[str]]:
    rows = []
    for r in models.get("rows", []):
        saved = r["saved_seconds"] * 1e3
        rows.append([f"model ({r['model']})", r["what"], "f32", str(r["tokens"]),
                     fmt(r["patched_seconds"] * 1e6, ".0f"), "-", "-", "-", "-", "-",
                     f"saved {saved:.0f} ms" + ("" if r["same_tokens"] else ", TOKENS DIFFER"),
                     fmt(r["x_vs_hf"], ".2f", "x")])
    return rows


def print_table(rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADER)]
    right = set(range(3, len(HEADER)))

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    print(line(HEADER))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def markdown(rows: list[list[str]], meta: dict, note: str = NOTE) -> str:
    out = [f"# embrope benchmark ({meta['device']}, {meta['cases']} cases)", "",
           f"Machine: {meta['machine'].get('cpu', '?')}, {meta['machine']['cpus']} CPUs, "
           f"{meta['threads']} threads, CPU kernels: {meta['cpu_isa']}; {meta['date']}; "
           f"commit {meta['commit']}.", f"Command: `{meta['command']}`", "", note, "",
           "| " + " | ".join(HEADER) + " |", "|" + "---|" * 3 + "---:|" * (len(HEADER) - 3)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def plot(cases: list[dict], path: pathlib.Path, title: str) -> bool:
    """Per op, shape and dtype at its largest token count: the percentage of its ceiling, and
    the speed-up over PyTorch eager where the run has it, as horizontal bars."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib is not installed: no plot", file=sys.stderr)
        return False
    largest: dict = {}
    for c in cases:
        if c["variant"] or c.get("pct_of_ceiling") is None:
            continue
        key = (c["op"], c["shape"], c["dtype"])
        if key not in largest or c["tokens"] > largest[key]["tokens"]:
            largest[key] = c
    if not largest:
        return False
    bars = [largest[k] for k in sorted(largest)][::-1]  # first case at the top
    labels = [f"{c['op']} {c['shape']} {c['dtype']}, {c['tokens']} tokens" for c in bars]
    with_torch = any(c.get("x_vs_torch") for c in bars)
    fig, axes = plt.subplots(1, 2 if with_torch else 1, sharey=True, squeeze=False,
                             figsize=(13 if with_torch else 8, 0.28 * len(bars) + 1.6))
    colors = {"f32": "tab:blue", "f16": "tab:orange", "bf16": "tab:green"}
    color = [colors.get(c["dtype"].split("->")[0], "tab:gray") for c in bars]
    ax = axes[0][0]
    pct = [c["pct_of_ceiling"] for c in bars]
    ax.barh(labels, pct, color=color)
    ax.axvline(100, color="black", lw=0.8)
    for y, (v, c) in enumerate(zip(pct, bars)):
        ax.text(v, y, f" {v:.0f}% of {c['ceiling']}", va="center", fontsize=7)
    ax.set(xlabel="% of the ceiling of its access pattern (copy, or in-place pass)",
           xlim=(0, max(pct + [100]) * 1.25))
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="x", alpha=0.3)
    if with_torch:
        ax = axes[0][1]
        x = [c.get("x_vs_torch") or 0 for c in bars]
        ax.barh(labels, x, color=color)
        ax.axvline(1, color="black", lw=0.8)
        for y, v in enumerate(x):
            if v:
                ax.text(v, y, f" {v:.1f}x", va="center", fontsize=7)
        ax.set(xscale="log", xlabel="speed-up over PyTorch eager (its time over embrope's)")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("--out", required=True)
    parser.add_argument("--command", default="scripts/bench.sh")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--models", help="benchmarks/models.py's JSON: end-to-end rows")
    args = parser.parse_args(argv)
    raw = json.loads(pathlib.Path(args.raw).read_text())
    context = raw.get("context", {})
    cases = read_cases(raw)
    device = context.get("device", "cpu")
    torch_version = None
    torch_missing = False
    if not args.no_torch:
        try:
            import torch

            torch_version = torch.__version__
        except ImportError:
            torch_missing = True
            print("report: PyTorch is not installed: no torch eager column", file=sys.stderr)
    if torch_version is not None:
        torch.set_num_threads(os.cpu_count() or 1)
        torch_device = "cuda" if device == "gpu" else "cpu"
        vocab = 128256 if context.get("cases") == "full" else 32000
        print(f"report: timing PyTorch {torch_version} eager on the same cases", file=sys.stderr)
        for c in cases:
            if c["variant"]:
                continue
            seconds = torch_eager_seconds(torch, c, torch_device, vocab)
            if seconds is not None:
                c["torch_seconds"] = seconds
                c["x_vs_torch"] = seconds / c["seconds"]
    commit = context.get("commit") or "unknown"
    meta = {
        "device": device, "cases": context.get("cases", "main"),
        "cpu_isa": context.get("cpu_isa", "?"), "threads": context.get("omp_threads", "?"),
        "commit": commit, "command": args.command, "machine": machine(),
        "date": context.get("date", datetime.datetime.now().isoformat()),
        "embrope_version": context.get("embrope_version"), "torch": torch_version,
        "google_benchmark_context": context,
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    llc = last_level_cache_bytes() if device == "cpu" else None
    meta["last_level_cache_bytes"] = llc
    rows = table_rows(cases, llc)
    note = NOTE
    if torch_missing:
        note += (" The vs torch eager column is empty: PyTorch is not installed here (`pip "
                 "install torch`, or for the CPU only `pip install torch --index-url "
                 "https://download.pytorch.org/whl/cpu`, then run the benchmark again).")
    models = None
    if args.models and pathlib.Path(args.models).exists():
        models = json.loads(pathlib.Path(args.models).read_text())
        rows += model_rows(models)
        note += " " + MODELS_NOTE
        meta["models"] = models.get("meta")
    print()
    print_table(rows)
    print()
    print(note)
    (out / "bench.json").write_text(json.dumps(
        {"meta": meta, "cases": cases, "models": (models or {}).get("rows", [])}, indent=1))
    (out / "bench.md").write_text(markdown(rows, meta, note))
    plotted = plot(cases, out / "bench.png",
                   f"embrope on {meta['machine'].get('cpu', device)} ({meta['cpu_isa']}), "
                   f"commit {commit}")
    print(f"\nwrote {out / 'bench.json'}, {out / 'bench.md'}"
          + (f", {out / 'bench.png'}" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
