"""torch.distributed with the gloo backend, two processes on loopback: the vocab-parallel
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
def test_vocab_and_context_parallel_with_two_gloo_ranks():
    torch.multiprocessing.spawn(distributed.run, args=(2, distributed.free_port(), "gloo"),
                                nprocs=2, join=True)
