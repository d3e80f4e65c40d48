"""A process forked after threaded calls (Python's multiprocessing, PyTorch's DataLoader
workers) runs embrope in the child: GCC's OpenMP runtime cannot start a team on the forking
thread there, so the library runs that thread's calls on one thread once it had called the
library (src/cpu/fork.cpp)."""

import os
import time

import numpy as np
import pytest

import embrope

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


def _calls():
    """One threaded call of each CPU op family (more than 2^15 elements), its outputs."""
    rng = np.random.default_rng(5)
    table = rng.standard_normal((1000, 256)).astype(np.float32)
    ids = rng.integers(0, 1000, 4096)
    cache = embrope.RopeCache(128, 4096, 10000.0)
    q = rng.standard_normal((512, 32, 128)).astype(np.float32)
    k = rng.standard_normal((512, 8, 128)).astype(np.float32)
    embrope.apply_rope(q, k, np.arange(512), cache)
    grad = np.zeros((1000, 256), np.float32)
    embrope.embed_backward(rng.standard_normal((4096, 256)).astype(np.float32), ids, grad)
    return [np.asarray(embrope.embed(table, ids)), q, k, grad]


def test_a_forked_child_runs_the_ops_and_gets_the_parents_bits():
    parent = _calls()  # the parent's threads have run: the forking thread has a pool
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery from here, only its answer and exit code
        code = 1
        try:
            os.close(read)
            child = _calls()
            same = all(np.array_equal(a, b) for a, b in zip(parent, child))
            os.write(write, b"same" if same else b"differ")
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's calls did not finish in 60 s (a hung OpenMP team)")
        assert os.waitstatus_to_exitcode(status) == 0, "the child's calls raised"
        assert os.read(read, 16) == b"same"
    finally:
        os.close(read)
