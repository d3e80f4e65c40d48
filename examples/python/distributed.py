"""embrope under torch.distributed: a vocab-parallel embedding and context-parallel RoPE.

    python examples/python/distributed.py            # 2 processes: NCCL on GPUs, else gloo

Each rank holds a shard of the embedding table (rows [r V / world, (r + 1) V / world), rounded
down: any world size, the shards within a row of each other); ids outside its shard give zero
rows (vocab_shard=True), so the all_reduce sum of the ranks' outputs is the full lookup. For
context parallelism each rank rotates its own slice of the tokens (24 per rank: all_gather
takes slices of one size) with those tokens' explicit positions; gathering the slices gives
the full call.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import embrope
import embrope.torch as et


def vocab_parallel_embed(table_shard: torch.Tensor, ids: torch.Tensor,
                         vocab_start: int) -> torch.Tensor:
    """The full lookup from one shard per rank: local rows, then a sum over ranks."""
    out = et.embed(table_shard, ids, vocab_start=vocab_start, vocab_shard=True)
    dist.all_reduce(out)  # exactly one rank contributes each row; the others add zeros
    return out


def context_parallel_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                          cache: embrope.RopeCache) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's tokens (with their own positions) rotated, then every rank's gathered."""
    q_local, k_local = et.apply_rope(q, k, positions, cache)
    world = dist.get_world_size()
    q_all = [torch.empty_like(q_local) for _ in range(world)]
    k_all = [torch.empty_like(k_local) for _ in range(world)]
    dist.all_gather(q_all, q_local.contiguous())
    dist.all_gather(k_all, k_local.contiguous())
    return torch.cat(q_all), torch.cat(k_all)


def run(rank: int, world: int, port: int, backend: str) -> None:
    """One rank: both parallel computations, each checked against the unsharded call."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group(backend, rank=rank, world_size=world)
    device = torch.device(f"cuda:{rank}" if backend == "nccl" else "cpu")
    try:
        generator = torch.Generator().manual_seed(0)  # the same data on every rank
        vocab, dim, part = 1000, 64, 24
        tokens = part * world
        table = torch.randn(vocab, dim, generator=generator).to(device)
        ids = torch.randint(0, vocab, (4, tokens // 4), generator=generator)
        ids[0, 0] = vocab - 1  # the last row: in the last rank's shard whatever the world size
        ids = ids.to(device)
        start, end = rank * vocab // world, (rank + 1) * vocab // world
        sharded = vocab_parallel_embed(table[start:end], ids, start)
        assert torch.equal(sharded, et.embed(table, ids)), "vocab-parallel embedding differs"

        cache = embrope.RopeCache.from_preset("llama-3.1-8b", max_positions=4096, device=device)
        q = torch.randn(tokens, 8, 128, generator=generator).to(device)
        k = torch.randn(tokens, 2, 128, generator=generator).to(device)
        positions = torch.randperm(4096, generator=generator)[:tokens].to(device)
        mine = slice(rank * part, (rank + 1) * part)
        q_cp, k_cp = context_parallel_rope(q[mine], k[mine], positions[mine], cache)
        q_full, k_full = et.apply_rope(q, k, positions, cache)
        assert torch.equal(q_cp, q_full) and torch.equal(k_cp, k_full), "context-parallel differs"
        if rank == 0:
            print(f"{backend}, {world} ranks: vocab-parallel embedding and context-parallel "
                  "RoPE equal the unsharded calls")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(world: int = 2) -> None:
    backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    mp.spawn(run, args=(world, free_port(), backend), nprocs=world, join=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
