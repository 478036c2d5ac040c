"""One FLUX.3 [klein] image with diffusers, as `zimage generate` makes it: a cold process that
loads the distilled modular pipeline from a diffusers directory in float32 (the prompt upsampler
left out, as zimage encodes the prompt as given), runs 4 steps at SIZE x SIZE from the seed and
writes the PNG. benches/diffusers_compare.sh times the whole process.

    python models/bench_flux3_reference.py MODEL_DIR SIZE OUT.png
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_flux3_tiny import Processor, blocks  # noqa: E402


def main():
    model, size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(2)
    pipe = blocks("distilled").init_pipeline(model)
    pipe.load_components(names=["text_encoder", "transformer", "vae"], torch_dtype=torch.float32)
    pipe.update_components(tokenizer=Processor(os.path.join(model, "tokenizer")))
    result = pipe(
        prompt="a red fox in the snow", height=size, width=size, num_inference_steps=4,
        generator=torch.Generator("cpu").manual_seed(42), output="images",
    )
    image = result[0] if isinstance(result, list) else result
    image.save(out)


if __name__ == "__main__":
    main()
