"""The Python walkthrough runs, its RoPE property holds, and it draws its plot."""

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"))
import attention_walkthrough  # noqa: E402


def test_walkthrough_scores_depend_only_on_relative_position():
    assert attention_walkthrough.walkthrough(verbose=False)


def test_relative_position_curves_coincide_for_every_offset():
    curves, decay = attention_walkthrough.relative_position_curves(
        10000.0, np.arange(64), [0, 7, 1000], np.random.default_rng(3))
    np.testing.assert_allclose(curves[1], curves[0], rtol=0, atol=1e-4)
    np.testing.assert_allclose(curves[2], curves[0], rtol=0, atol=1e-4)
    assert decay[0] == pytest.approx(1.0, abs=1e-6)  # cos(0) everywhere: q . k / D = 1


def test_walkthrough_writes_its_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plot.png"
    attention_walkthrough.plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
