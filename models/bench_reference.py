"""Times diffusers the way benches/pipeline.rs times zimage.

    python models/bench_reference.py MODEL_DIR [SIZE] [float32|bfloat16]
    python models/bench_reference.py --real MODEL_DIR [SIDES]
    python models/bench_reference.py --encode MODEL_DIR [SIDES]

The first form runs ZImagePipeline: per-step time, VAE decode, total and peak RSS, median of 3
warm runs, 8 steps, guidance 0. The second is the `real` case: the transformer alone in f32 (for
the synthetic real-width model), a 32-token caption of random features, one step at each side in
SIDES (default 256,512), median of 3 warm steps. The third times the VAE encoder alone
(`vae.encode` of a picture in [-1, 1], f32), median of 3 warm runs per side.
"""

import resource
import statistics
import sys
import time

import torch
from diffusers import ZImagePipeline


def real(model, sides):
    from diffusers import ZImageTransformer2DModel

    torch.set_num_threads(2)
    transformer = ZImageTransformer2DModel.from_pretrained(model, subfolder="transformer", torch_dtype=torch.float32)
    transformer.eval()
    cfg = transformer.config
    gen = torch.Generator("cpu").manual_seed(3)
    caption = torch.randn(32, cfg.cap_feat_dim, generator=gen)
    print(f"diffusers real: transformer of {model} (dim {cfg.dim}, {cfg.n_heads} heads, {cfg.n_layers} layers), float32")
    for side in sides:
        latent = torch.randn(cfg.in_channels, 1, side // 8, side // 8, generator=gen)
        times = []
        with torch.inference_mode():
            for i in range(4):
                t = time.perf_counter()
                transformer([latent], torch.tensor([0.5]), [caption], return_dict=False)
                if i:
                    times.append(time.perf_counter() - t)
        print(f"  {side}x{side}: step {statistics.median(times):.3f} s (caption refiner included, as diffusers runs it)")


def encode(model, sides):
    from diffusers import AutoencoderKL

    torch.set_num_threads(2)
    vae = AutoencoderKL.from_pretrained(model, subfolder="vae", torch_dtype=torch.float32)
    vae.eval()
    gen = torch.Generator("cpu").manual_seed(3)
    for side in sides:
        image = torch.rand(1, 3, side, side, generator=gen) * 2 - 1
        times = []
        with torch.inference_mode():
            for i in range(4):
                t = time.perf_counter()
                vae.encode(image).latent_dist.sample(gen)
                if i:
                    times.append(time.perf_counter() - t)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"diffusers encode {side}x{side}: {statistics.median(times):.3f} s | peak RSS {rss:.0f} MB")


def main():
    if sys.argv[1] == "--encode":
        sides = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else [512]
        return encode(sys.argv[2], sides)
    if sys.argv[1] == "--real":
        sides = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else [256, 512]
        return real(sys.argv[2], sides)
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
