"""torch.distributed with the gloo backend, two and three processes on loopback: the vocab-parallel
embedding equals the unsharded lookup, context-parallel RoPE equals the full call (both
bitwise; the ranks assert it, and a failing rank fails the spawn)."""

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"))
import distributed  # noqa: E402


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("world", [2, 3])  # 3 does not divide the vocabulary of 1000
def test_vocab_and_context_parallel_with_gloo_ranks(world):
    torch.multiprocessing.spawn(distributed.run, args=(world, distributed.free_port(), "gloo"),
                                nprocs=world, join=True)
