"""End to end: HF transformers models as they run, and the same models after one
``embrope.transformers.patch(model)``, in the same run, on the CPU.

    python benchmarks/models.py --out models.json [--tokens 2048] [--decode 32] [--reps 3]

Two models built from configs with random weights (float32, two decoder layers, the
families' real head sizes): a Llama-shaped one (16 query / 4 KV heads of 128, llama3
scaling) and a Qwen3-shaped one (the same with qk-norm, which the patch fuses with RoPE). For
each: one prefill forward of a T-token prompt (with HF's dynamic cache, the last position's
logits, as generate() computes them), then `decode` greedy steps with that cache, timed
apart. Unpatched and patched runs alternate; medians of `reps` after a warm-up; both must
give the same tokens. RoPE is a small
part of a model's time: the row says how much of it the patch saved.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time


def _models(transformers, torch):
    common = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                  num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=4,
                  head_dim=128, tie_word_embeddings=False)
    llama = transformers.LlamaConfig(
        max_position_embeddings=131072,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8192), **common)
    qwen3 = transformers.Qwen3Config(
        max_position_embeddings=40960,
        rope_parameters=dict(rope_type="default", rope_theta=1e6), **common)
    for name, config in (("llama-shaped", llama), ("qwen3-shaped", qwen3)):
        config._attn_implementation = "sdpa"
        torch.manual_seed(0)
        yield name, transformers.AutoModelForCausalLM.from_config(config).eval()


def _prefill_and_decode(torch, model, ids, decode: int) -> tuple[float, float, list]:
    """Seconds of one prefill forward (with the cache, the last position's logits) and of
    `decode` greedy steps after it with that cache; and the tokens."""
    tokens = []
    with torch.no_grad():
        start = time.perf_counter()
        out = model(ids, use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - start
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        start = time.perf_counter()
        for step in range(decode):
            token = out.logits[:, -1:].argmax(-1)
            tokens.append(int(token))
            position = torch.tensor([[ids.shape[1] + step]])
            out = model(token, cache=cache, position_ids=position, use_cache=True)
        return prefill, time.perf_counter() - start, tokens


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        import torch
        import transformers

        import embrope.transformers
    except ImportError as e:
        print(f"models: {e.name} is not installed: no end-to-end rows", file=sys.stderr)
        return 0
    torch.set_num_threads(torch.get_num_threads())
    rows = []
    for name, hf in _models(transformers, torch):
        patched = copy.deepcopy(hf)
        embrope.transformers.patch(patched)
        ids = torch.randint(0, hf.config.vocab_size, (1, args.tokens),
                            generator=torch.Generator().manual_seed(0))
        times = {"hf": ([], []), "patched": ([], [])}
        tokens = {}
        for rep in range(args.reps + 1):  # the first is a warm-up
            for label, model in (("hf", hf), ("patched", patched)):
                prefill, decode, tokens[label] = _prefill_and_decode(torch, model, ids,
                                                                     args.decode)
                if rep:
                    times[label][0].append(prefill)
                    times[label][1].append(decode)
        for i, what in enumerate((f"prefill {args.tokens}", f"{args.decode} decode steps")):
            hf_s = statistics.median(times["hf"][i])
            patched_s = statistics.median(times["patched"][i])
            rows.append(dict(model=name, what=what, tokens=args.tokens,
                             hf_seconds=hf_s, patched_seconds=patched_s,
                             x_vs_hf=hf_s / patched_s, saved_seconds=hf_s - patched_s,
                             same_tokens=tokens["hf"] == tokens["patched"]))
            print(f"models: {name} {what}: HF {hf_s * 1e3:.1f} ms, patched "
                  f"{patched_s * 1e3:.1f} ms", file=sys.stderr)
    meta = dict(torch=torch.__version__, transformers=transformers.__version__,
                threads=torch.get_num_threads(), dtype="float32", layers=2)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
