"""What a one-token call costs from Python: each embrope entry point beside the PyTorch call
it replaces, in the same run (decode-sized calls, where the Python layer and not the kernel
sets the time).

    python benchmarks/call_overhead.py [--loops N] [--threads T]

Prints the fastest of seven loops of N calls per entry, in microseconds per call:
one bfloat16 row of D 4096 (Llama-3-8B) looked up, and Llama-3-8B's 32 + 8 heads of one token
rotated (bfloat16 through torch, float32 through NumPy), against ``F.embedding`` and vLLM's
``forward_native`` written in eager PyTorch (index_select of the cos/sin rows, then the neox
rotation). The working sets are a few KB to 64 MB (the table's rows are read one at a time):
this measures call paths, not memory.
"""

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import embrope
import embrope.torch as et


def per_call_us(f, loops: int) -> float:
    for _ in range(200):
        f()
    return min(timeit.repeat(f, number=loops, repeat=7)) / loops * 1e6


def forward_native(q, k, positions, cos_sin_cache):
    """vLLM's RotaryEmbedding.forward_native, neox style, for q and k [T, H, D]."""
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, -1)
    cos, sin = cos.unsqueeze(-2).to(q.dtype), sin.unsqueeze(-2).to(q.dtype)

    def rotate(x):
        x1, x2 = x.chunk(2, -1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)

    return rotate(q), rotate(k)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as is)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    table = torch.randn(8192, 4096).bfloat16()
    ids = torch.tensor([5])
    out = torch.empty(1, 4096, dtype=torch.bfloat16)
    head_dim, positions = 128, torch.tensor([7])
    cache = embrope.RopeCache(head_dim, 8192, base=500000.0)
    cos_sin_cache = torch.from_numpy(np.array(cache.table))  # [P, 128]: cos half, sin half
    q = torch.randn(1, 32, head_dim).bfloat16()
    k = torch.randn(1, 8, head_dim).bfloat16()
    q_np, k_np = q.float().numpy(), k.float().numpy()

    rows = [
        ("F.embedding (peer)", lambda: F.embedding(ids, table)),
        ("embrope.embed", lambda: embrope.embed(table, ids)),
        ("embrope.embed, out=", lambda: embrope.embed(table, ids, out=out)),
        ("embrope.torch.embed", lambda: et.embed(table, ids)),
        ("forward_native, eager (peer)", lambda: forward_native(q, k, positions, cos_sin_cache)),
        ("embrope.torch.apply_rope", lambda: et.apply_rope(q, k, positions, cache)),
        ("embrope.torch.apply_rope, in place",
         lambda: et.apply_rope(q, k, positions, cache, inplace=True)),
        ("embrope.apply_rope, NumPy float32, in place",
         lambda: embrope.apply_rope(q_np, k_np, np.array([7]), cache)),
    ]
    print(f"{'call':44s} {'us':>8s}  (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")
    for name, f in rows:
        print(f"{name:44s} {per_call_us(f, args.loops):8.2f}")


if __name__ == "__main__":
    main()
