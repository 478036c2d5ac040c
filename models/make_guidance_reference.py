"""Dumps what diffusers 0.42.1 computes with the base model's two guidance options,
`cfg_normalization` and `cfg_truncation`, each on and both together, for text to image
(`ZImagePipeline`), image to image, inpainting and ControlNet, on the demo model and on the
held-out model (models/reference/guided-*.safetensors). Every run is f32 from the seed alone,
with guidance above 1; a truncation of 0.3 leaves the last steps of each run unguided.

The image-to-image and inpaint cases reuse make_image_reference.py's hooks (the encoder's input
and moments, the initial latents, the VAE input); the ControlNet case reuses make_controlnet.py's
tiny held-out ControlNet 2.1 and its hooks.

Requires torch 2.15, diffusers 0.42.1, transformers 5.23.0, safetensors, pillow, numpy.
From the repository root:

    python models/make_guidance_reference.py
"""

import json
import os
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from make_image_reference import DEMO_DIR, HELDOUT_DIR, REF_DIR, assemble, run_case  # noqa: E402

NORM = {"cfg_normalization": True}
TRUNC = {"cfg_truncation": 0.3}
BOTH = {"cfg_normalization": True, "cfg_truncation": 0.3}

# name: model, prompt, negative, width, height, steps, guidance, seed, options
TEXT_CASES = {
    "guided-norm": ("demo", "a red fox in the snow", "blurry", 96, 64, 6, 4.0, 3, NORM),
    "guided-trunc": ("demo", "a red fox in the snow", "blurry", 96, 64, 6, 4.0, 3, TRUNC),
    "guided-both": ("demo", "a lighthouse at dusk", "", 64, 80, 6, 5.0, 9, BOTH),
    "guided-heldout-norm": ("heldout", "an old stone bridge", "", 96, 80, 6, 4.0, 12, NORM),
    "guided-heldout-trunc": ("heldout", "an old stone bridge", "", 96, 80, 6, 4.0, 12, TRUNC),
    "guided-heldout-both": ("heldout", "a cat on a sofa", "blurry", 80, 96, 6, 3.5, 4, BOTH),
}
# As make_image_reference.CASES, with the options.
IMAGE_CASES = {
    "guided-img2img-both": (("demo", "img2img", "128x128", "a lighthouse at dusk", "blurry", 6, 3.0, 0.8, 5), BOTH),
    "guided-heldout-inpaint-both": (("heldout", "inpaint", "96x80", "an old stone bridge", "", 7, 4.0, 0.9, 19), BOTH),
}
CONTROL_CASE = {"prompt": "an old stone bridge", "negative_prompt": "", "width": 96, "height": 80,
                "steps": 6, "guidance": 3.0, "seed": 7, "scale": 0.6, **BOTH}


def text_case(pipe, case):
    model, prompt, negative, width, height, steps, guidance, seed, options = case
    dump = {}
    decode = pipe.vae.decode

    def decode_hook(z, *args, **kwargs):
        dump["vae_input"] = z.float().clone()
        return decode(z, *args, **kwargs)

    pipe.vae.decode = decode_hook
    try:
        with torch.no_grad():
            image = pipe(prompt=prompt, negative_prompt=negative, width=width, height=height,
                         num_inference_steps=steps, guidance_scale=guidance,
                         generator=torch.Generator("cpu").manual_seed(seed), max_sequence_length=512,
                         **options).images[0]
    finally:
        pipe.vae.decode = decode
    dump["image"] = torch.from_numpy(np.array(image).astype(np.uint8))
    meta = {"model": model, "kind": "text", "prompt": prompt, "negative_prompt": negative,
            "width": width, "height": height, "steps": steps, "guidance": guidance, "seed": seed,
            **options}
    return dump, meta


def save(name, dump, meta):
    path = os.path.join(REF_DIR, f"{name}.safetensors")
    save_file({k: v.contiguous() for k, v in dump.items()}, path, metadata={"case": json.dumps(meta)})
    print(f"reference {name}: {sorted(dump)}", file=sys.stderr)


def main():
    torch.set_num_threads(2)
    from diffusers import ZImageImg2ImgPipeline, ZImageInpaintPipeline, ZImagePipeline

    import make_controlnet

    with tempfile.TemporaryDirectory() as tmp:
        heldout = os.path.join(tmp, "heldout")
        assemble(HELDOUT_DIR, heldout)
        dirs = {"demo": DEMO_DIR, "heldout": heldout}
        for name, case in TEXT_CASES.items():
            pipe = ZImagePipeline.from_pretrained(dirs[case[0]], torch_dtype=torch.float32)
            save(name, *text_case(pipe, case))
        for name, (case, options) in IMAGE_CASES.items():
            model, kind = case[0], case[1]
            cls = ZImageImg2ImgPipeline if kind == "img2img" else ZImageInpaintPipeline
            pipes = {(model, kind): cls.from_pretrained(dirs[model], torch_dtype=torch.float32)}
            dump, meta = run_case(pipes, name, case, options)
            save(name, dump, dict(meta, **options))
        cn_dir = os.path.join(tmp, "controlnet-heldout-2.1")
        make_controlnet.build_controlnet("2.1", cn_dir, cfg=make_controlnet.HELDOUT_LAYOUTS["2.1"],
                                         config_name="heldout-2.1")
        make_controlnet.write_pipeline_references("2.1", cn_dir, {"guided-controlnet-heldout": CONTROL_CASE},
                                                  heldout, "heldout")


if __name__ == "__main__":
    main()
