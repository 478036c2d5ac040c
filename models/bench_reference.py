"""Times diffusers' ZImagePipeline the way benches/pipeline.rs times zimage: per-step time, VAE
decode, total and peak RSS, median of 3 warm runs, 8 steps, guidance 0.

    python models/bench_reference.py MODEL_DIR [SIZE] [float32|bfloat16]
"""

import resource
import statistics
import sys
import time

import torch
from diffusers import ZImagePipeline


def main():
    model, size = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 256
    dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.float32
    torch.set_num_threads(2)
    pipe = ZImagePipeline.from_pretrained(model, torch_dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    marks = {}
    decode = pipe.vae.decode

    def timed_decode(*a, **k):
        t = time.perf_counter()
        out = decode(*a, **k)
        marks["vae"] = time.perf_counter() - t
        return out

    pipe.vae.decode = timed_decode
    steps = {"t": []}
    forward = pipe.transformer.forward

    def timed_forward(*a, **k):
        t = time.perf_counter()
        out = forward(*a, **k)
        steps["t"].append(time.perf_counter() - t)
        return out

    pipe.transformer.forward = timed_forward
    rows = []
    for run in range(4):
        steps["t"] = []
        t = time.perf_counter()
        pipe("a red fox in the snow", width=size, height=size, num_inference_steps=8, guidance_scale=0.0,
             generator=torch.Generator("cpu").manual_seed(42), output_type="np")
        total = time.perf_counter() - t
        if run:
            rows.append((statistics.mean(steps["t"]), marks["vae"], total))
    med = lambda i: statistics.median(r[i] for r in rows)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"diffusers {model} at {size}x{size}, 8 steps, {dtype}: step {med(0):.4f} s | VAE decode {med(1):.3f} s "
          f"| total {med(2):.3f} s | peak RSS {rss:.0f} MB")


if __name__ == "__main__":
    main()
