"""benchmarks/call_overhead.py: its eager peer (vLLM's forward_native) rotates as embrope
does, and the script runs."""

import pathlib
import sys

import numpy as np
import pytest

import embrope

torch = pytest.importorskip("torch")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import call_overhead  # noqa: E402


def test_call_overhead_peer_rotates_as_embrope_and_the_script_runs(capsys):
    rng = np.random.default_rng(3)
    q = torch.from_numpy(rng.standard_normal((5, 4, 64)).astype(np.float32))
    k = torch.from_numpy(rng.standard_normal((5, 2, 64)).astype(np.float32))
    positions = torch.tensor([0, 3, 9, 200, 1023])
    cache = embrope.RopeCache(64, 1024, base=500000.0)
    expected = embrope.apply_rope(q, k, positions, cache, inplace=False)
    got = call_overhead.forward_native(q, k, positions, torch.from_numpy(np.array(cache.table)))
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    call_overhead.main(["--loops", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 9 and all(float(line.split()[-1]) > 0 for line in lines[1:])
