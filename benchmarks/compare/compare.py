#!/usr/bin/env python3
"""Peer comparison: embrope against PyTorch eager, torch.compile, Liger-Kernel and FlashInfer.

embrope is called through its Python package (`import embrope`: the functions a user calls,
over the same libembrope as the C API), with torch tensors passed as they are (DLPack), on
torch's current stream. Every implementation runs on the same inputs and its output is checked
against a float64 reference before it is timed; a peer that cannot be imported or run is
reported as "unavailable: <reason>" rather than left out.

See README.md next to this file for the command lines and the measurement method.
"""

import argparse
import datetime
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

if "--device=cpu" in sys.argv or any(a == "--device" and b == "cpu"
                                     for a, b in zip(sys.argv, sys.argv[1:])):
    # The CPU mode runs embrope's OpenMP runtime beside torch's own: with spinning idle
    # threads the two starve each other on a small machine. Must be set before either
    # runtime starts, i.e. before torch is imported.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

# ------------------------------------------------------------------------------ embrope ----

class Embrope:
    """The calls of embrope's Python package this benchmark makes, with one deferred status per
    device: embrope's calls then only enqueue kernels (no per-call synchronisation, capturable
    into CUDA graphs), and the status is checked after each measurement."""

    def __init__(self):
        import embrope

        self.m = embrope
        self.version = embrope.__version__
        self.path = os.path.dirname(os.path.abspath(embrope.__file__))
        self._deferred = {}

    def deferred_status(self, device):
        key = str(device)
        if key not in self._deferred:
            self._deferred[key] = self.m.DeferredStatus(key)
        return self._deferred[key]

    def check_deferred(self, device):
        if str(device) in self._deferred:
            stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
            self._deferred[str(device)].check(stream)

    def rope_cache(self, rotary_dim, max_positions, base, device):
        return self.m.RopeCache(rotary_dim, max_positions, base, device=str(device))

    @staticmethod
    def rope_cache_to_host(cache):
        """The cache's cos and sin halves, [P, D/2] float32 each, on the CPU."""
        table = cache.table  # NumPy (read-only) for a CPU cache, DLPack on the GPU
        if hasattr(table, "__array_interface__"):
            table = torch.tensor(table.copy())
        else:
            table = torch.from_dlpack(table).cpu()
        half = table.shape[1] // 2
        return table[:, :half].contiguous(), table[:, half:].contiguous()


# ------------------------------------------------------------------------ correctness ----

_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}


def ulp_of(magnitude, dtype):
    """The spacing of `dtype` values at |magnitude| (float64), floored at the smallest normal
    so that zeros compare with an absolute tolerance."""
    tiny = torch.finfo(dtype).tiny
    m = magnitude.abs().clamp_min(tiny)
    _, exponent = torch.frexp(m)  # m = mantissa * 2^exponent, mantissa in [0.5, 1)
    return torch.pow(2.0, (exponent - 1 - _MANTISSA_BITS[dtype]).to(torch.float64))


def max_ulp_error(out, ref64, scale64, dtype):
    """Largest |out - ref| in ulps of `dtype` at `scale` (element-wise, float64)."""
    err = (out.double() - ref64).abs()
    return float((err / ulp_of(scale64, dtype)).max().item()) if err.numel() else 0.0


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_reference(x, cos_half, sin_half, positions):
    """float64 NeoX RoPE of x [T, H, D] with the given float32 cos/sin halves [P, D/2].

    Returns the exact result and the per-element magnitude the tolerance scales with: the
    larger of |ref| and |x1 c| + |x2 s|, with c and s as float32 and as rounded to x's dtype.
    An implementation that multiplies in the activation dtype (HF eager: tables cast to bf16,
    two rounded products, a rounded sum) is then within 0.5 (table rounding) + 2 * 0.5
    (products) + 0.5 (sum) = 2 ulps of that magnitude, also where the sum cancels; one that
    computes in float32 and rounds once is within about 0.5 ulp."""
    pos = positions
    scale = None
    for table_dtype in (torch.float64, x.dtype):
        c = torch.cat((cos_half, cos_half), -1).to(table_dtype).double()[pos].unsqueeze(1)
        s = torch.cat((sin_half, sin_half), -1).to(table_dtype).double()[pos].unsqueeze(1)
        x64 = x.double()
        m = (x64 * c).abs() + (rotate_half(x64) * s).abs()
        if table_dtype == torch.float64:
            ref = x64 * c + rotate_half(x64) * s
            scale = torch.maximum(m, ref.abs())
        else:
            scale = torch.maximum(scale, m)
    return ref, scale


# --------------------------------------------------------------------------- timing ------

class Timer:
    def __init__(self, device, reps, warmup, min_ms, iters, flush_l2):
        self.device = device
        self.reps = reps
        self.warmup = warmup
        self.min_ms = min_ms
        self.iters = iters
        self.flush_l2 = flush_l2 and device.type == "cuda"
        self._flush_buf = None
        if self.flush_l2:
            # Twice the largest L2 of the targeted parts (50 MiB on H100/H200), written with
            # a memset between iterations so that every timed call starts with a cold L2.
            self._flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device=device)

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _batch_ms(self, fn, n):
        """Mean ms per call of n back-to-back calls."""
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) * 1e3 / n
        if not self.flush_l2:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / n
        # Cold L2: one event pair per call, the flush outside each pair.
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for s, e in events:
            self._flush_buf.zero_()
            s.record()
            fn()
            e.record()
        events[-1][1].synchronize()
        return sum(s.elapsed_time(e) for s, e in events) / n

    def measure(self, fn):
        """Median over reps of the mean time per call (ms), and the iterations per rep."""
        for _ in range(self.warmup):
            fn()
        self._sync()
        iters = self.iters
        if not iters:
            # Enough calls per repetition to cover min_ms, so that event resolution and the
            # launch of the first call do not dominate.
            probe = max(self._batch_ms(fn, 3), 1e-4)
            iters = int(min(max(self.min_ms / probe, 5), 20000))
        times = [self._batch_ms(fn, iters) for _ in range(self.reps)]
        self._sync()
        return statistics.median(times), iters, times


def time_graph(timer, fn, device, ops_per_graph):
    """Captures ops_per_graph calls of fn into one CUDA graph and times replays; returns
    (median ms per op, iters) or raises with the capture error."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):  # warm caches/allocations outside the capture
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(ops_per_graph):
                fn()
    except Exception as exc:
        # When the op fails inside the capture, torch.cuda.graph's exit then fails to end the
        # invalidated capture and raises its own error: report the op's error first.
        first = exc.__context__ if exc.__context__ is not None else exc
        text = f"{type(first).__name__}: {first}".splitlines()[0][:300]
        if first is not exc:
            text += f"; then {type(exc).__name__}: " + str(exc).splitlines()[0][:160]
        try:
            torch.cuda.synchronize(device)
        except Exception as sync_exc:  # keep the capture's reason, add the aftermath
            text += f"; synchronize afterwards: {str(sync_exc).splitlines()[0][:120]}"
        raise RuntimeError(text) from exc
    torch.cuda.synchronize(device)
    ms, iters, _ = timer.measure(graph.replay)
    return ms / ops_per_graph, iters


# ------------------------------------------------------------------------ the peers -------

class Unavailable(Exception):
    pass


def import_or_reason(module, attr=None):
    try:
        m = importlib.import_module(module)
        return (getattr(m, attr) if attr else m), None
    except Exception as exc:  # any import failure is a reason to report, not to stop
        return None, f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def package_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


def hf_rope_inplace(q, k, cos_table, sin_table, positions):
    """HF Llama style: cos/sin rows gathered by position from [max_pos, D] tables in the
    activation dtype, q * cos + rotate_half(q) * sin, written back into q and k."""
    cos = cos_table[positions].unsqueeze(1)  # [T, 1, D]
    sin = sin_table[positions].unsqueeze(1)
    q.copy_(q * cos + rotate_half(q) * sin)
    k.copy_(k * cos + rotate_half(k) * sin)


def embed_torch(ids, table, pos, pos_table):
    return torch.nn.functional.embedding(ids, table) + torch.nn.functional.embedding(pos, pos_table)


def make_compiled(fn, device):
    if not hasattr(torch, "compile"):
        raise Unavailable("torch.compile missing in this torch")
    cfg = torch._dynamo.config
    # One compiled graph per shape and dtype; raise the recompile limit so that a sweep of
    # token counts does not fall back to eager silently.
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 256))
    return torch.compile(fn, dynamic=False, fullgraph=True)


# -------------------------------------------------------------------------- the runs -------

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


class Results:
    def __init__(self):
        self.rows = []

    def add(self, **row):
        self.rows.append(row)
        status = row.get("status")
        what = (f"{row['op']:<6} {row['dtype']:<5} T={row['tokens']:<6} "
                f"{row.get('extra', ''):<10} {row['impl']:<26}")
        if status == "ok":
            check = f"  check {row['max_ulp']:.2f} ulp" if "max_ulp" in row else ""
            print(f"{what} {row['median_ms'] * 1e3:10.2f} us {row['gbps']:9.1f} GB/s{check}",
                  flush=True)
        else:
            print(f"{what} {status}", flush=True)


def embrope_rope_call(lib, q, k, positions, cache, device):
    """embrope.apply_rope on q and k in place, on torch's current stream at each call (the
    capture stream inside a capture), reporting bad positions to the device's deferred status."""
    deferred = lib.deferred_status(device)
    apply_rope = lib.m.apply_rope

    def call():
        apply_rope(q, k, positions, cache, layout="neox", deferred=deferred)
    return call


def run_rope(args, lib, device, timer, results, peers, failures):
    hq, hk, d = args.q_heads, args.kv_heads, args.head_dim
    max_pos = args.max_positions
    cache = lib.rope_cache(d, max_pos, args.rope_base, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    cos_half, sin_half = lib.rope_cache_to_host(cache)
    # The cache must be the textbook table: float64 angles position * base^(-2i/D).
    inv = args.rope_base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    cache_err = max((cos_half.double() - ang.cos()).abs().max().item(),
                    (sin_half.double() - ang.sin()).abs().max().item())
    if cache_err > 1e-6:
        raise RuntimeError(f"embrope cos/sin cache deviates from float64 by {cache_err}")
    print(f"embrope cache [{max_pos}, {d}] on {device}: max |err| vs float64 = {cache_err:.2e}")

    # Peers read the same float32 values, so the comparison is about the kernels only.
    cos_sin_f32 = torch.cat((cos_half, sin_half), -1).to(device)  # FlashInfer's layout
    cos_half_dev, sin_half_dev = cos_half.to(device), sin_half.to(device)

    liger_fn, liger_reason = peers["liger"]
    flashinfer_fn, flashinfer_reason = peers["flashinfer"]
    compiled = {}
    embrope_graph_cases = []

    # Inputs drawn on the device: at 65536 tokens a host draw and upload takes seconds.
    gen = torch.Generator(device=device).manual_seed(args.seed)
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        cos_tab = torch.cat((cos_half, cos_half), -1).to(device=device, dtype=dtype)
        sin_tab = torch.cat((sin_half, sin_half), -1).to(device=device, dtype=dtype)
        for tokens in args.tokens:
            q0 = torch.randn(tokens, hq, d, generator=gen, device=device).to(dtype)
            k0 = torch.randn(tokens, hk, d, generator=gen, device=device).to(dtype)
            positions = torch.randint(0, args.position_range, (tokens,), generator=gen,
                                      dtype=torch.int64, device=device)
            ref_pos = positions
            if args.break_reference:
                # Off by one position: a reference that must make every check fail.
                ref_pos = (ref_pos + 1) % max_pos
            # float64 on the device itself: at 65536 tokens the host would need minutes.
            qref, qscale = rope_reference(q0, cos_half_dev, sin_half_dev, ref_pos)
            kref, kscale = rope_reference(k0, cos_half_dev, sin_half_dev, ref_pos)
            elems = tokens * (hq + hk) * d
            nbytes = 2 * elems * q0.element_size()  # in place: read + write of q and k

            impls = {}

            def embrope_impl(q, k):
                return embrope_rope_call(lib, q, k, positions, cache, device)

            impls["embrope"] = embrope_impl

            def eager_impl(q, k):
                return lambda: hf_rope_inplace(q, k, cos_tab, sin_tab, positions)

            impls["torch-eager (HF)"] = eager_impl

            def compile_impl(q, k):
                if "rope" not in compiled:
                    compiled["rope"] = make_compiled(hf_rope_inplace, device)
                fn = compiled["rope"]
                return lambda: fn(q, k, cos_tab, sin_tab, positions)

            impls["torch.compile (HF)"] = compile_impl

            def liger_views(q, k):
                # [T, H, D] -> [1, T, H, D] -> transpose to Liger's [B, H, S, D]: a free view
                # whose physical layout is [B, S, H, D], which Liger's kernel addresses
                # directly; its .contiguous() on the transposed-back tensor is a no-op, so
                # the rotation lands in q and k in place.
                return q.unsqueeze(0).transpose(1, 2), k.unsqueeze(0).transpose(1, 2)

            def liger_impl(q, k):
                if liger_fn is None:
                    raise Unavailable(liger_reason)
                if device.type != "cuda":
                    raise Unavailable("Triton kernel, CUDA only")
                qv, kv = liger_views(q, k)

                def call():
                    cos = cos_tab[positions].unsqueeze(0)  # [1, T, D], gathered per call
                    sin = sin_tab[positions].unsqueeze(0)
                    liger_fn(qv, kv, cos, sin)
                return call

            impls["liger (gather+kernel)"] = liger_impl

            def liger_kernel_impl(q, k):
                if liger_fn is None:
                    raise Unavailable(liger_reason)
                if device.type != "cuda":
                    raise Unavailable("Triton kernel, CUDA only")
                qv, kv = liger_views(q, k)
                # cos/sin gathered once outside the timed region, as a model that shares
                # them across layers would.
                cos = cos_tab[positions].unsqueeze(0).contiguous()
                sin = sin_tab[positions].unsqueeze(0).contiguous()
                return lambda: liger_fn(qv, kv, cos, sin)

            impls["liger (kernel only)"] = liger_kernel_impl

            def flashinfer_impl(q, k):
                if flashinfer_fn is None:
                    raise Unavailable(flashinfer_reason)
                if device.type != "cuda":
                    raise Unavailable("CUDA only")
                if dtype == torch.float32:
                    raise Unavailable("FlashInfer RoPE takes f16/bf16 only")
                qf, kf = q.view(tokens, hq * d), k.view(tokens, hk * d)  # free views
                return lambda: flashinfer_fn(positions, qf, kf, d, cos_sin_f32, True)

            impls["flashinfer"] = flashinfer_impl

            selected = [n for n in impls if not any(s in n for s in args.skip)]
            for name in selected:
                row = dict(op="rope", dtype=dname, tokens=tokens, impl=name, bytes=nbytes,
                           shape=f"q[{tokens},{hq},{d}] k[{tokens},{hk},{d}]")
                q, k = q0.clone(), k0.clone()
                try:
                    call = impls[name](q, k)
                    call()
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    lib.check_deferred(device)
                except Unavailable as exc:
                    results.add(**row, status=f"unavailable: {exc}")
                    continue
                except Exception as exc:
                    results.add(**row, status=f"error: {type(exc).__name__}: "
                                + str(exc).splitlines()[0][:300])
                    failures.append(f"rope {dname} T={tokens} {name}: {exc}")
                    continue
                err = max(max_ulp_error(q, qref, qscale, dtype),
                          max_ulp_error(k, kref, kscale, dtype))
                if not err <= args.rope_tol_ulps:
                    results.add(**row, status=f"check FAILED: max error {err:.3g} ulp > "
                                f"{args.rope_tol_ulps}", max_ulp=err)
                    failures.append(f"rope {dname} T={tokens} {name}: {err:.3g} ulp")
                    continue
                ms, iters, all_ms = timer.measure(call)
                lib.check_deferred(device)  # no bad position was recorded while timing
                results.add(**row, status="ok", median_ms=ms, iters=iters, reps_ms=all_ms,
                            gbps=nbytes / ms / 1e6, max_ulp=err)
            # the ceiling: a device copy moving the same bytes (read + write)
            src = torch.empty(elems, dtype=dtype, device=device).normal_()
            dst = torch.empty_like(src)
            ms, iters, all_ms = timer.measure(lambda: dst.copy_(src))
            results.add(op="rope", dtype=dname, tokens=tokens, impl="copy (ceiling)",
                        bytes=nbytes, status="ok", median_ms=ms, iters=iters, reps_ms=all_ms,
                        gbps=nbytes / ms / 1e6)

            if device.type == "cuda" and tokens in args.graph_tokens:
                if "embrope" in selected:
                    embrope_graph_cases.append(dict(
                        dname=dname, tokens=tokens, nbytes=nbytes, q0=q0, k0=k0,
                        positions=positions))
                for name in [n for n in selected if n != "embrope"]:
                    row = dict(op="rope", dtype=dname, tokens=tokens, impl=name + " [graph]",
                               bytes=nbytes, extra="graph")
                    q, k = q0.clone(), k0.clone()
                    try:
                        ms, iters = time_graph(timer, impls[name](q, k), device,
                                               args.graph_ops)
                    except Unavailable as exc:
                        results.add(**row, status=f"unavailable: {exc}")
                    except Exception as exc:
                        msg = str(exc) or type(exc).__name__
                        results.add(**row, status=f"graph: not capturable ({msg})")
                    else:
                        results.add(**row, status="ok", median_ms=ms, iters=iters,
                                    gbps=nbytes / ms / 1e6)

    def finish():
        embrope_graphs(args, lib, device, timer, results, cache, embrope_graph_cases)
    return finish


def embrope_graphs(args, lib, device, timer, results, cache, cases):
    """embrope under CUDA-graph capture, run last of all. With a deferred status in its options
    a call only enqueues kernels, so it can be captured; a failed capture may still leave state
    behind in torch (the capture stream's allocator pool), so it is attempted after every other
    measurement, and a failure's reason stands for all sizes."""
    reason = None
    for case in cases:
        row = dict(op="rope", dtype=case["dname"], tokens=case["tokens"],
                   impl="embrope [graph]", bytes=case["nbytes"], extra="graph")
        if reason is not None:
            results.add(**row, status=f"graph: not capturable ({reason})")
            continue
        q, k = case["q0"].clone(), case["k0"].clone()
        try:
            ms, iters = time_graph(
                timer, embrope_rope_call(lib, q, k, case["positions"], cache, device),
                device, args.graph_ops)
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            results.add(**row, status=f"graph: not capturable ({reason})")
        else:
            results.add(**row, status="ok", median_ms=ms, iters=iters,
                        gbps=case["nbytes"] / ms / 1e6)


def run_embed(args, lib, device, timer, results, failures):
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    stream_dtype = torch.bfloat16
    compiled = {}
    for hidden in args.hidden:
        max_tokens = max(args.embed_tokens)
        max_pos = max(args.max_positions, max_tokens)
        table = (torch.randn(args.vocab, hidden, generator=gen, device=device) * 0.02).to(
            stream_dtype)
        pos_table = (torch.randn(max_pos, hidden, generator=gen, device=device) * 0.02).to(
            stream_dtype)
        for tokens in args.embed_tokens:
            ids = torch.randint(0, args.vocab, (tokens,), generator=gen, dtype=torch.int64,
                                device=device)
            explicit = torch.randint(0, max_pos, (tokens,), generator=gen, dtype=torch.int64,
                                     device=device)
            implicit = torch.arange(tokens, dtype=torch.int64, device=device)
            nbytes = 3 * tokens * hidden * table.element_size()  # table + position rows, out
            for mode, pos in (("implicit", implicit), ("explicit", explicit)):
                ref_pos = pos
                if args.break_reference:
                    ref_pos = (ref_pos + 1) % max_pos
                ref = table[ids].double() + pos_table[ref_pos].double()
                impls = {}

                def embrope_impl(out, mode=mode, pos=pos):
                    # With no position_ids (and no offsets), 1-D ids take positions 0..N-1.
                    position_ids = pos if mode == "explicit" else None
                    deferred = lib.deferred_status(device)
                    embed = lib.m.embed

                    def call():
                        embed(table, ids, out=out, positions="learned", position_table=pos_table,
                              position_ids=position_ids, deferred=deferred)
                    return call, out

                impls["embrope"] = embrope_impl

                def eager_impl(out, pos=pos):
                    holder = {}

                    def call():
                        holder["out"] = embed_torch(ids, table, pos, pos_table)
                    return call, holder

                impls["torch-eager"] = eager_impl

                def compile_impl(out, pos=pos):
                    if "embed" not in compiled:
                        compiled["embed"] = make_compiled(embed_torch, device)
                    fn = compiled["embed"]
                    holder = {}

                    def call():
                        holder["out"] = fn(ids, table, pos, pos_table)
                    return call, holder

                impls["torch.compile"] = compile_impl

                for name in [n for n in impls if not any(s in n for s in args.skip)]:
                    row = dict(op="embed", dtype="bf16", tokens=tokens, impl=name,
                               extra=f"D{hidden}/{mode}", hidden=hidden, positions=mode,
                               bytes=nbytes, shape=f"ids[{tokens}] W[{args.vocab},{hidden}]")
                    out = torch.empty(tokens, hidden, dtype=stream_dtype, device=device)
                    try:
                        call, res = impls[name](out)
                        call()
                        if device.type == "cuda":
                            torch.cuda.synchronize(device)
                    except Unavailable as exc:
                        results.add(**row, status=f"unavailable: {exc}")
                        continue
                    except Exception as exc:
                        results.add(**row, status=f"error: {type(exc).__name__}: "
                                    + str(exc).splitlines()[0][:300])
                        failures.append(f"embed T={tokens} {name}: {exc}")
                        continue
                    got = res if isinstance(res, torch.Tensor) else res["out"]
                    err = max_ulp_error(got, ref, ref, stream_dtype)
                    if not err <= args.embed_tol_ulps:
                        results.add(**row, status=f"check FAILED: max error {err:.3g} ulp > "
                                    f"{args.embed_tol_ulps}", max_ulp=err)
                        failures.append(f"embed T={tokens} {mode} {name}: {err:.3g} ulp")
                        continue
                    ms, iters, all_ms = timer.measure(call)
                    lib.check_deferred(device)  # no bad position was recorded while timing
                    results.add(**row, status="ok", median_ms=ms, iters=iters, reps_ms=all_ms,
                                gbps=nbytes / ms / 1e6, max_ulp=err)
            src = torch.empty(nbytes // 2 // 2, dtype=stream_dtype, device=device).normal_()
            dst = torch.empty_like(src)
            ms, iters, all_ms = timer.measure(lambda: dst.copy_(src))
            results.add(op="embed", dtype="bf16", tokens=tokens, impl="copy (ceiling)",
                        extra=f"D{hidden}", hidden=hidden, bytes=nbytes, status="ok",
                        median_ms=ms, iters=iters, reps_ms=all_ms, gbps=nbytes / ms / 1e6)


# ------------------------------------------------------------------------ reporting -------

def run_embed_backward(args, lib, device, timer, results, failures):
    """The embedding gradient: embrope_embed_backward (deterministic: sorted ids, each row's
    sum in a fixed order, accumulated into a float32 gradient) against PyTorch's
    embedding_dense_backward (also sort-based and deterministic on CUDA; it returns a new,
    zero-filled [V, D] gradient in grad_out's dtype, which a training step then adds)."""
    gen = torch.Generator(device=device).manual_seed(args.seed + 2)
    dtype = torch.bfloat16
    for hidden in args.hidden:
        for tokens in args.embed_tokens:
            ids = torch.randint(0, args.vocab, (tokens,), generator=gen, dtype=torch.int64,
                                device=device)
            grad_out = (torch.randn(tokens, hidden, generator=gen, device=device) * 0.1).to(dtype)
            ref = torch.zeros(args.vocab, hidden, dtype=torch.float64, device=device)
            ref.index_add_(0, ids, grad_out.double())
            unique = int(torch.unique(ids).numel())
            # Minimal traffic: read grad_out and ids, read and write each touched float32 row.
            nbytes = tokens * hidden * 2 + tokens * 8 + 2 * unique * hidden * 4
            base = dict(op="embed_bwd", dtype="bf16", tokens=tokens, hidden=hidden,
                        bytes=nbytes)

            grad = torch.zeros(args.vocab, hidden, dtype=torch.float32, device=device)
            deferred = lib.deferred_status(device)
            embed_backward = lib.m.embed_backward

            def embrope_call():
                embed_backward(grad_out, ids, grad, deferred=deferred)

            def torch_call():
                return torch.ops.aten.embedding_dense_backward(grad_out, ids, args.vocab, -1,
                                                               False)
            for name, call, check in (
                    ("embrope (deterministic)", embrope_call, lambda: grad.double()),
                    ("torch embedding_dense_backward", torch_call,
                     lambda: torch_call().double())):
                row = dict(base, impl=name)
                try:
                    grad.zero_()
                    call()
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    lib.check_deferred(device)
                    got = check()
                except Exception as exc:
                    results.add(**row, status=f"error: {type(exc).__name__}: "
                                + str(exc).splitlines()[0][:300])
                    failures.append(f"embed_bwd T={tokens} {name}: {exc}")
                    continue
                # float32 sums are within tokens * 2^-24 of the largest partial sum. torch
                # returns bf16 (and on the CPU may also sum in bf16): its check only confirms
                # it computes the same gradient, within 4 bf16 ulps of the largest value.
                bound = ref.abs().max().item()
                tol = bound * (tokens * 2.0 ** -24 + (2.0 ** -6 if "torch" in name else 0.0))
                err = (got - ref).abs().max().item()
                if not err <= tol:
                    results.add(**row, status=f"check FAILED: max error {err:.3g} > {tol:.3g}")
                    failures.append(f"embed_bwd T={tokens} {name}: {err:.3g}")
                    continue
                ms, iters, all_ms = timer.measure(call)
                lib.check_deferred(device)
                results.add(**row, status="ok", median_ms=ms, iters=iters, reps_ms=all_ms,
                            gbps=nbytes / ms / 1e6)
            # The ceiling: a device copy moving the case's bytes (half read, half written),
            # as the other ops' ceilings; a copy of twice them could leave the L2 the case
            # fits in.
            src = torch.empty(nbytes // 8, dtype=torch.float32, device=device).normal_()
            dst = torch.empty_like(src)
            ms, iters, all_ms = timer.measure(lambda: dst.copy_(src))
            results.add(**dict(base, impl="copy (ceiling)"), status="ok", median_ms=ms,
                        iters=iters, reps_ms=all_ms, gbps=(nbytes // 8) * 8 / ms / 1e6)


def case_key(row):
    return (row["op"], row["dtype"], row["tokens"], row.get("hidden"),
            row.get("positions"), row.get("extra", "") == "graph")


def annotate(rows):
    """Adds % of the copy ceiling and speed ratios between implementations of one case."""
    ceilings = {}
    for r in rows:
        if r["impl"] == "copy (ceiling)" and r["status"] == "ok":
            ceilings[(r["op"], r["dtype"], r["tokens"], r.get("hidden"))] = r["gbps"]
    by_case = {}
    for r in rows:
        by_case.setdefault(case_key(r), []).append(r)
    for r in rows:
        if r["status"] != "ok":
            continue
        ceil = ceilings.get((r["op"], r["dtype"], r["tokens"], r.get("hidden")))
        if ceil:
            r["pct_of_copy"] = 100.0 * r["gbps"] / ceil
        # speedup_vs[p] > 1: this implementation is that many times faster than p
        r["speedup_vs"] = {o["impl"]: o["median_ms"] / r["median_ms"]
                           for o in by_case[case_key(r)]
                           if o is not r and o["status"] == "ok" and o["impl"] != "copy (ceiling)"
                           and r["impl"] != "copy (ceiling)"}


def write_markdown(path, meta, rows):
    lines = ["# embrope peer comparison", ""]
    lines.append(f"- device: {meta['device_name']} ({meta['device']})")
    lines.append(f"- embrope {meta['embrope_version']} (commit {meta.get('git_commit')}), "
                 f"torch {meta['torch']}, triton {meta.get('triton')}, "
                 f"liger-kernel {meta.get('liger_kernel')}, flashinfer {meta.get('flashinfer')}")
    lines.append(f"- timing: {meta['timing']}")
    lines.append("- GB/s counts the minimal traffic: RoPE read+write of q and k; embedding "
                 "table rows + position rows read, output written. 'vs embrope' is "
                 "peer time / embrope time (>1: embrope faster); graph rows compare with "
                 "embrope's graph row.")
    lines.append("")
    lines.append("| op | dtype | tokens | case | implementation | median us | GB/s | "
                 "% of copy | vs embrope | check (max ulp) |")
    lines.append("|---|---|---:|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        case = r.get("extra", "") or ""
        if r["status"] == "ok":
            pct = f"{r['pct_of_copy']:.0f}%" if "pct_of_copy" in r else ""
            emb = [v for k, v in r.get("speedup_vs", {}).items()
                   if k.startswith("embrope")]
            # embrope's time over this row's time inverted: peer ms / embrope ms
            vs = f"{1.0 / emb[0]:.2f}x" if emb and not r["impl"].startswith("embrope") else ""
            chk = f"{r['max_ulp']:.2f}" if "max_ulp" in r else "-"
            lines.append(f"| {r['op']} | {r['dtype']} | {r['tokens']} | {case} | {r['impl']} | "
                         f"{r['median_ms'] * 1e3:.2f} | {r['gbps']:.1f} | {pct} | {vs} | {chk} |")
        else:
            lines.append(f"| {r['op']} | {r['dtype']} | {r['tokens']} | {case} | {r['impl']} | "
                         f"{r['status']} | | | | |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(path, meta, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"matplotlib unavailable ({type(exc).__name__}: {exc}); compare.png not written"
    groups = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        panel = (r["op"], r["dtype"], r.get("hidden"), r.get("positions"))
        groups.setdefault(panel, {}).setdefault(r["impl"], []).append((r["tokens"], r["gbps"]))
    # copy ceilings of embedding runs carry no positions mode: share them with both panels
    for (op, dt, hid, posm), series in list(groups.items()):
        if op == "embed" and posm is None:
            for (op2, dt2, hid2, posm2), s2 in groups.items():
                if op2 == op and hid2 == hid and posm2 is not None:
                    s2.setdefault("copy (ceiling)", series.get("copy (ceiling)", []))
            del groups[(op, dt, hid, posm)]
    panels = sorted(groups, key=lambda p: (p[0] != "rope",) + tuple(str(x) for x in p))
    if not panels:
        return "no successful measurements; compare.png not written"
    ncols = min(3, len(panels))
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.8 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, panel in zip(axes.flat, panels):
        for impl, pts in sorted(groups[panel].items()):
            pts.sort()
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            style = dict(linestyle="--", color="black") if impl == "copy (ceiling)" else \
                dict(marker="o")
            ax.plot(xs, ys, label=impl, **style)
        ax.set_xscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("GB/s (minimal traffic)")
        op, dt, hid, posm = panel
        ax.set_title(f"{op} {dt}" + (f" D={hid} {posm} positions" if hid else ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{meta['device_name']}: {meta['timing']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return None


# ----------------------------------------------------------------------------- main -------

def parse_list(text, cast=int):
    return [cast(x) for x in text.split(",") if x.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", default="out/compare")
    ap.add_argument("--ops", default="rope,embed,embed_bwd",
                    help="any of rope, embed, embed_bwd (comma-separated)")
    ap.add_argument("--dtypes", default="bf16", help="RoPE dtypes: bf16[,f16][,f32]")
    ap.add_argument("--tokens", default="1,8,64,1024,16384,65536")
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rope-base", type=float, default=500000.0,
                    help="Llama 3 uses 500000 (without its scaling, which is not compared)")
    ap.add_argument("--max-positions", type=int, default=8192)
    ap.add_argument("--position-range", type=int, default=8192,
                    help="positions are uniform in [0, this)")
    ap.add_argument("--embed-tokens", default="1024,16384")
    ap.add_argument("--hidden", default="4096", help="embedding hidden sizes, e.g. 4096,8192")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--min-ms", type=float, default=25.0,
                    help="time per repetition the iteration count is chosen to cover")
    ap.add_argument("--iters", type=int, default=0, help="fixed iterations per repetition")
    ap.add_argument("--flush-l2", action="store_true",
                    help="cold L2: memset 256 MiB before each timed call (one event pair each)")
    ap.add_argument("--graph-tokens", default="1,8,64",
                    help="token counts also timed as CUDA-graph replays")
    ap.add_argument("--graph-ops", type=int, default=10,
                    help="calls captured per graph (time reported per call)")
    ap.add_argument("--rope-tol-ulps", type=float, default=2.0)
    ap.add_argument("--embed-tol-ulps", type=float, default=1.0)
    ap.add_argument("--skip", default="", help="comma-separated substrings of implementation "
                    "names not to run (e.g. 'compile')")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--break-reference", action="store_true",
                    help="shift the reference's positions by one: every check must then fail "
                         "(a test of the checks themselves)")
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)  # inference: no autograd bookkeeping in any timed call
    args.tokens = parse_list(args.tokens)
    args.embed_tokens = parse_list(args.embed_tokens)
    args.hidden = parse_list(args.hidden)
    args.graph_tokens = parse_list(args.graph_tokens)
    args.dtypes = parse_list(args.dtypes, str)
    args.skip = parse_list(args.skip, str)
    ops = parse_list(args.ops, str)
    for dt in args.dtypes:
        if dt not in DTYPES:
            ap.error(f"unknown dtype {dt}")
    if args.position_range > args.max_positions:
        ap.error("--position-range must not exceed --max-positions")

    if args.device == "cuda":
        if not torch.cuda.is_available():
            ap.error("--device cuda but torch sees no GPU (use --device cpu for the plumbing)")
        device = torch.device("cuda", torch.cuda.current_device())
        device_name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        device_name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        device_name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        device_name += f" ({torch.get_num_threads()} torch threads)"

    lib = Embrope()
    if device.type == "cuda" and lib.m.cuda_device_count() == 0:
        sys.exit(f"embrope at {lib.path} reports no CUDA device: build it with nvcc on the "
                 "PATH (the package then has the CUDA kernels)")

    liger, liger_reason = import_or_reason("liger_kernel.ops.rope", "LigerRopeFunction")
    liger_fn = (lambda q, k, c, s: liger.apply(q, k, c, s)) if liger else None
    flashinfer_fn, flashinfer_reason = import_or_reason(
        "flashinfer.rope", "apply_rope_with_cos_sin_cache_inplace")
    peers = {"liger": (liger_fn, liger_reason), "flashinfer": (flashinfer_fn, flashinfer_reason)}

    timer = Timer(device, args.reps, args.warmup, args.min_ms, args.iters, args.flush_l2)
    if device.type == "cuda":
        timing = (f"CUDA events around back-to-back calls, median of {args.reps} reps, "
                  + ("L2 flushed before each call (256 MiB memset, outside the events)"
                     if args.flush_l2 else "L2 not flushed (decode-size data stays in L2)"))
    else:
        timing = (f"time.perf_counter around back-to-back calls, median of {args.reps} reps "
                  "(CPU plumbing check, not a benchmark)")

    git_commit = None
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        git_commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"],
                                    capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        git_commit = (git_commit + ("-dirty" if dirty else "")) or None
    except Exception:
        pass  # a copy without .git: the embrope version still identifies the build
    triton_version = package_version("triton")
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=str(device), device_name=device_name, embrope_version=lib.version,
        embrope_package=lib.path, git_commit=git_commit,
        torch=torch.__version__, torch_cuda=torch.version.cuda, triton=triton_version,
        liger_kernel=package_version("liger-kernel") or (liger_reason and "unavailable"),
        flashinfer=package_version("flashinfer-python")
        or (flashinfer_reason and "unavailable"),
        liger_reason=liger_reason, flashinfer_reason=flashinfer_reason,
        python=platform.python_version(), timing=timing, flush_l2=timer.flush_l2,
        args={k: v for k, v in vars(args).items()},
    )
    print(f"embrope {lib.version} from {lib.path}; device {device_name}; torch {torch.__version__}")
    print(f"liger: {meta['liger_kernel'] if liger else 'unavailable: ' + str(liger_reason)}; "
          f"flashinfer: {meta['flashinfer'] if flashinfer_fn else 'unavailable: ' + str(flashinfer_reason)}")

    results = Results()
    failures = []
    finish_rope = None
    if "rope" in ops:
        finish_rope = run_rope(args, lib, device, timer, results, peers, failures)
    if "embed" in ops:
        run_embed(args, lib, device, timer, results, failures)
    if "embed_bwd" in ops:
        run_embed_backward(args, lib, device, timer, results, failures)
    if finish_rope is not None:
        finish_rope()  # embrope's graph-capture attempt, after everything else

    # Table order: op, dtype, hidden size, tokens, eager before graph (embrope's graph rows
    # were measured last).
    rows = sorted(results.rows, key=lambda r: (
        ["rope", "embed", "embed_bwd"].index(r["op"]), r["dtype"], r.get("hidden") or 0, r["tokens"],
        r.get("extra", "") == "graph"))
    annotate(rows)
    os.makedirs(args.out, exist_ok=True)
    meta["failures"] = failures
    with open(os.path.join(args.out, "compare.json"), "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1)
    write_markdown(os.path.join(args.out, "compare.md"), meta, rows)
    plot_note = write_plot(os.path.join(args.out, "compare.png"), meta, rows)
    if plot_note:
        print(plot_note)
    print(f"wrote {args.out}/compare.json, compare.md" + ("" if plot_note else ", compare.png"))
    if failures:
        print(f"{len(failures)} check(s) failed:")
        for f_ in failures:
            print("  " + f_)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
