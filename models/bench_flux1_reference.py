"""One FLUX.1 [dev] image with diffusers, as `zimage generate` makes it: a cold process that
loads the pipeline from a diffusers directory in float32, runs 4 steps at SIZE x SIZE with
guidance 3.5 and the 512-token T5 window from the seed and writes the PNG.
benches/diffusers_compare.sh flux1 times the whole process.

    python models/bench_flux1_reference.py MODEL_DIR SIZE OUT.png
"""

import sys

import torch
from diffusers import FluxPipeline


def main():
    model, size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(2)
    pipe = FluxPipeline.from_pretrained(model, torch_dtype=torch.float32)
    image = pipe(
        prompt="a red fox in the snow", height=size, width=size, num_inference_steps=4, guidance_scale=3.5,
        max_sequence_length=512, generator=torch.Generator("cpu").manual_seed(42),
    ).images[0]
    image.save(out)


if __name__ == "__main__":
    main()
