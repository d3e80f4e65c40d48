"""Draws docs/images/axial_rope.png: how axial RoPE splits a head's rotary features over the
axes of an image (Flux.1's axes_dim [16, 56, 56]) and where each token's coordinates come
from. Run: python docs/images/axial_rope.py (needs matplotlib and the embrope package)."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import embrope  # noqa: E402

cache = embrope.RopeCache.flux(max_positions=64)
axes_dim = cache.axes_dim
names = ["axis 0 (index / frame)", "axis 1 (row)", "axis 2 (column)"]
colors = ["#7f7f7f", "#1f77b4", "#d62728"]

fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.2), height_ratios=[1, 1.6])
start = 0
for dim, name, color in zip(axes_dim, names, colors):
    top.barh(0, dim, left=start, color=color, edgecolor="white")
    label = f"{name}\n{dim} features = {dim // 2} pairs" if dim > 32 else \
        f"axis 0\n{dim} features"
    top.text(start + dim / 2, 0, label, ha="center", va="center", color="white", fontsize=8)
    start += dim
top.set_xlim(0, start)
top.set_yticks([])
top.set_xlabel("feature of a head (D = 128; adjacent pairs (2i, 2i+1) rotate together)")
top.set_title("Axial RoPE: each axis owns a slice of the head and rotates it by its own "
              "coordinate", fontsize=10)

# The frequencies each pair rotates with: base^(-2j / axes_dim[a]) restarts in every slice.
inv_freq = cache.inv_freq
pairs = np.arange(len(inv_freq))
start = 0
for dim, name, color in zip(axes_dim, names, colors):
    sl = slice(start, start + dim // 2)
    bottom.semilogy(pairs[sl], inv_freq[sl], "o", ms=3, color=color, label=name)
    start += dim // 2
bottom.set_xlabel("pair i (the table's column)")
bottom.set_ylabel("frequency (rad per unit of the axis)")
bottom.legend(fontsize=8, title="a token at (index, row, col) = positions[:, t]",
              title_fontsize=8)
bottom.grid(alpha=0.3)
fig.tight_layout()
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "axial_rope.png")
fig.savefig(out, dpi=110)
print("wrote", out)
