"""From a sentence to attention scores, with embrope and NumPy, and a plot of RoPE's scores
against relative position.

    python examples/python/attention_walkthrough.py [output.png]

1. A toy vocabulary turns "What can I hold you with?" into token ids.
2. An embedding table turns ids into vectors, with sinusoidal positions added in the same
   pass (embed).
3. Rotary positions: q and k are rotated by their positions (apply_rope), and the attention
   score q_m . k_n then depends only on m - n, whatever the absolute positions.
4. The plot: the score of one query/key pair placed at many absolute positions against their
   distance m - n (all offsets fall on one curve), and the mean score of all-ones vectors,
   which decays with distance (Su et al. 2021, section 3.4.3), for two RoPE bases.
"""

from __future__ import annotations

import pathlib
import re
import sys

import numpy as np

import embrope

DIM = 64  # model width = head dim (one head)


def tokenize(text: str, vocab: list[str]) -> np.ndarray:
    words = re.findall(r"[a-z]+|\?", text.lower())
    return np.array([vocab.index(w) for w in words], dtype=np.int64)


def scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """q [T, 1, D], k [T, 1, D] -> q_m . k_n for every (m, n)."""
    return q[:, 0] @ k[:, 0].T


def walkthrough(verbose: bool = True) -> bool:
    vocab = ["<pad>", "what", "can", "i", "hold", "you", "with", "?"]
    ids = tokenize("What can I hold you with?", vocab)
    rng = np.random.default_rng(0)
    table = rng.standard_normal((len(vocab), DIM)).astype(np.float32)
    x = embrope.embed(table, ids, positions="sinusoidal")  # [T, D]: token + position
    if verbose:
        print(f"ids {ids.tolist()} -> embeddings {x.shape}, {x.dtype}")

    w_q = (rng.standard_normal((DIM, DIM)) / np.sqrt(DIM)).astype(np.float32)
    w_k = (rng.standard_normal((DIM, DIM)) / np.sqrt(DIM)).astype(np.float32)
    q = (x @ w_q)[:, None, :]  # [T, 1 head, D]
    k = (x @ w_k)[:, None, :]
    cache = embrope.RopeCache(DIM, 4096)
    # the same q and k at positions 0..T-1, and shifted by 1000: RoPE's scores are the same
    near = np.arange(len(ids))
    q0, k0 = embrope.apply_rope(q, k, near, cache, inplace=False)
    q1, k1 = embrope.apply_rope(q, k, near + 1000, cache, inplace=False)
    same = np.allclose(scores(q0, k0), scores(q1, k1), rtol=1e-4, atol=1e-4)
    # The same scores from the formula in float64: pairs (a, b) = (i, i + D/2) rotated by
    # position * theta_i, theta_i = 10000^(-2i/D), make q_m . k_n a function of n - m alone:
    #   sum_i (q_a k_a + q_b k_b) cos((n - m) theta_i) + (q_b k_a - q_a k_b) sin((n - m) theta_i)
    # (an identity rotation, the wrong direction or other frequencies pass the shift test
    # above; they fail this one).
    theta = 10000.0 ** (-2.0 * np.arange(DIM // 2) / DIM)
    angle = (near[None, :] - near[:, None])[..., None] * theta  # [m, n, i]
    q64, k64 = q[:, 0].astype(np.float64), k[:, 0].astype(np.float64)
    qa, qb = q64[:, None, :DIM // 2], q64[:, None, DIM // 2:]  # [m, 1, i]
    ka, kb = k64[None, :, :DIM // 2], k64[None, :, DIM // 2:]  # [1, n, i]
    formula = ((qa * ka + qb * kb) * np.cos(angle) + (qb * ka - qa * kb) * np.sin(angle)).sum(-1)
    exact = np.allclose(scores(q0, k0), formula, rtol=1e-5, atol=1e-5 * np.abs(formula).max())
    if verbose:
        print("scores depend only on the relative position:", "yes" if same else "NO")
        print("scores equal that formula in float64:", "yes" if exact else "NO")
    return same and exact


def relative_position_curves(base: float, distances: np.ndarray, offsets: list[int],
                             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(scores [len(offsets), len(distances)] of one random q/k pair with the query at
    offset + d and the key at offset; the all-ones score normalised to 1 at d = 0)."""
    cache = embrope.RopeCache(DIM, int(distances.max()) + max(offsets) + 1, base=base)
    q = rng.standard_normal((1, 1, DIM)).astype(np.float32)
    k = rng.standard_normal((1, 1, DIM)).astype(np.float32)
    curves = []
    for offset in offsets:
        qs = np.repeat(q, len(distances), 0)
        embrope.apply_rope(qs, None, distances + offset, cache)
        ks = np.repeat(k, len(distances), 0)
        embrope.apply_rope(ks, None, np.full(len(distances), offset), cache)
        curves.append(np.einsum("thd,thd->t", qs, ks))
    ones = np.ones((len(distances), 1, DIM), np.float32)
    q1, _ = embrope.apply_rope(ones, None, distances, cache, inplace=False)
    decay = q1[:, 0].sum(-1) / DIM  # (R(d) 1) . 1 / D: k = 1 at position 0
    return np.array(curves), decay


def plot(path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(1)
    distances = np.arange(0, 512)
    offsets = [0, 100, 3000]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    curves, _ = relative_position_curves(10000.0, distances, offsets, rng)
    for offset, curve, style in zip(offsets, curves, ["-", "--", ":"]):
        left.plot(distances, curve, style, lw=1.2, label=f"key at position {offset}")
    left.set(title="One q/k pair, placed anywhere: one curve", xlabel="relative position m - n",
             ylabel="attention score q_m . k_n")
    left.legend()
    long_distances = np.arange(0, 8192, 4)
    for base in (10000.0, 500000.0):
        _, decay = relative_position_curves(base, long_distances, [0], rng)
        right.plot(long_distances, decay, lw=1, label=f"base {base:g}")
    right.set(title="Long-term decay (all-ones q and k)", xlabel="relative position m - n",
              ylabel="score / D")
    right.set_xscale("symlog", linthresh=16)
    right.legend()
    fig.suptitle(f"RoPE attention scores against relative position (head dim {DIM}, embrope)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv: list[str]) -> int:
    ok = walkthrough()
    default = pathlib.Path(__file__).resolve().parents[2] / "docs" / "images" / \
        "attention_vs_relative_position.png"
    plot(pathlib.Path(argv[1]) if len(argv) > 1 else default)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
