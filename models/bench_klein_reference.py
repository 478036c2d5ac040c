"""One FLUX.2 [klein] image with diffusers, as `zimage generate` makes it: a cold process that
loads the pipeline from a diffusers directory in float32, runs the distilled model's 4 steps at
SIZE x SIZE from the seed and writes the PNG. benches/diffusers_compare.sh klein times the whole process.

    python models/bench_klein_reference.py MODEL_DIR SIZE OUT.png
"""

import sys

import torch
from diffusers import Flux2KleinPipeline


def main():
    model, size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(2)
    pipe = Flux2KleinPipeline.from_pretrained(model, torch_dtype=torch.float32)
    image = pipe(
        prompt="a red fox in the snow", height=size, width=size, num_inference_steps=4,
        generator=torch.Generator("cpu").manual_seed(42),
    ).images[0]
    image.save(out)


if __name__ == "__main__":
    main()
