"""Dumps what diffusers 0.42.1 computes for image-to-image and inpainting, the references that
zimage's img2img and inpaint tests compare against (models/reference/img2img-*.safetensors,
models/reference/inpaint-*.safetensors), and builds the held-out components they also run on.

Two models:
- the demo model (models/z-image-tiny);
- a held-out model unlike it: the demo's text encoder and tokenizer with another transformer
  (dim 128, 4 heads of 32, RoPE axes 8/12/12, 3 layers, 1 + 1 refiners, adaLN width 128) and
  another VAE (3 levels, so 4x instead of 8x, channels 16/32/32, 2 resnets per level, 4 groups),
  stored in models/z-image-heldout/ (only those two components; the tests assemble the rest).

The input images are drawn from fixed formulas and written as PNG next to the references, so the
pipeline and zimage read the same pixels. Every reference runs in f32 from the seed alone.

Requires torch 2.15, diffusers 0.42.1, transformers 5.23.0, safetensors, pillow, numpy.
From the repository root:

    python models/make_image_reference.py             # held-out model, inputs and references
    python models/make_image_reference.py --skip-model
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO_DIR = os.path.join(HERE, "z-image-tiny")
HELDOUT_DIR = os.path.join(HERE, "z-image-heldout")
REF_DIR = os.path.join(HERE, "reference")
INPUT_DIR = os.path.join(REF_DIR, "inputs")
SEED = 20261125


def randomise_(module, std=0.3):
    """Moves norm weights and biases away from the exact 0 and 1 default init leaves."""
    for n, p in module.named_parameters():
        if p.ndim == 1 and n.split(".")[-1] in ("weight", "bias"):
            with torch.no_grad():
                base = 1.0 if n.endswith("weight") else 0.0
                p.copy_(base + std * torch.randn_like(p))


def build_heldout():
    from diffusers import AutoencoderKL, ZImageTransformer2DModel

    torch.manual_seed(SEED)
    if os.path.exists(HELDOUT_DIR):
        shutil.rmtree(HELDOUT_DIR)
    t = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=128, n_layers=3,
        n_refiner_layers=1, n_heads=4, n_kv_heads=4, norm_eps=1e-5, qk_norm=True, cap_feat_dim=16,
        rope_theta=256.0, t_scale=1000.0, axes_dims=[8, 12, 12], axes_lens=[1536, 512, 512],
    )
    with torch.no_grad():
        t.x_pad_token.normal_(0.0, 1.0)
        t.cap_pad_token.normal_(0.0, 1.0)
        for n, p in t.named_parameters():
            if "adaLN_modulation" in n:
                p.mul_(4.0)
    randomise_(t)
    t.to(torch.bfloat16).save_pretrained(os.path.join(HELDOUT_DIR, "transformer"))
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 3,
        up_block_types=["UpDecoderBlock2D"] * 3, block_out_channels=[16, 32, 32], layers_per_block=2,
        latent_channels=16, norm_num_groups=4, sample_size=96, scaling_factor=0.41,
        shift_factor=-0.05, use_quant_conv=False, use_post_quant_conv=False,
        mid_block_add_attention=True, force_upcast=True,
    )
    randomise_(vae)
    vae.to(torch.bfloat16).save_pretrained(os.path.join(HELDOUT_DIR, "vae"))


def assemble(components_dir, into):
    """A whole diffusers directory: the demo's files with `components_dir`'s components."""
    shutil.copytree(DEMO_DIR, into, dirs_exist_ok=True)
    for c in ("transformer", "vae"):
        shutil.rmtree(os.path.join(into, c))
        shutil.copytree(os.path.join(components_dir, c), os.path.join(into, c))


def write_inputs():
    """A picture with smooth gradients and hard edges, and masks with a soft border (so the
    binarisation threshold matters)."""
    os.makedirs(INPUT_DIR, exist_ok=True)
    for name, (w, h) in {"picture-128x128": (128, 128), "picture-96x80": (96, 80)}.items():
        y, x = np.mgrid[0:h, 0:w].astype(np.float64)
        r = 127.5 + 127.5 * np.sin(x / 9.0) * np.cos(y / 13.0)
        g = 255.0 * x / (w - 1)
        b = 255.0 * (1.0 - y / (h - 1))
        disc = (x - 0.6 * w) ** 2 + (y - 0.4 * h) ** 2 < (0.22 * min(w, h)) ** 2
        rgb = np.stack([r, g, b], axis=-1)
        rgb[disc] = [250.0, 240.0, 30.0]
        Image.fromarray(np.clip(np.rint(rgb), 0, 255).astype(np.uint8), "RGB").save(
            os.path.join(INPUT_DIR, f"{name}.png"))
        # White (repaint) on the right part, with a ramp of greys across the threshold.
        ramp = np.clip((x - 0.45 * w) / (0.2 * w), 0.0, 1.0) * 255.0
        band = (y > 0.2 * h) & (y < 0.85 * h)
        mask = np.where(band, ramp, 0.0)
        Image.fromarray(np.rint(mask).astype(np.uint8), "L").save(
            os.path.join(INPUT_DIR, name.replace("picture", "mask") + ".png"))


CASES = {
    # name: model, kind, input, prompt, negative, steps, guidance, strength, seed
    "img2img": ("demo", "img2img", "128x128", "a red fox in the snow", None, 8, 0.0, 0.6, 42),
    "img2img-cfg": ("demo", "img2img", "128x128", "a lighthouse at dusk", "blurry", 6, 3.0, 0.8, 5),
    "inpaint": ("demo", "inpaint", "128x128", "a red fox in the snow", None, 8, 0.0, 1.0, 11),
    "inpaint-partial": ("demo", "inpaint", "128x128", "a cat on a sofa", "", 6, 2.5, 0.7, 23),
    "heldout-img2img-cfg": ("heldout", "img2img", "96x80", "a red fox in the snow", "", 5, 3.0, 0.75, 8),
    "heldout-inpaint": ("heldout", "inpaint", "96x80", "an old stone bridge", None, 7, 0.0, 0.9, 19),
}


def run_case(pipes, name, case, options=None):
    """One hooked run; `options` are further pipeline arguments (the guidance options)."""
    model, kind, size, prompt, negative, steps, guidance, strength, seed = case
    pipe = pipes[(model, kind)]
    image = Image.open(os.path.join(INPUT_DIR, f"picture-{size}.png"))
    dump = {}
    encode = pipe.vae.encode

    def encode_hook(x, *args, **kwargs):
        out = encode(x, *args, **kwargs)
        n = sum(1 for k in dump if k.endswith(".moments"))
        dump[f"encode{n}.input"] = x.float().clone()
        dump[f"encode{n}.moments"] = out.latent_dist.parameters.float().clone()
        return out

    pipe.vae.encode = encode_hook
    prepare = pipe.prepare_latents

    def prepare_hook(*args, **kwargs):
        out = prepare(*args, **kwargs)
        latents = out[0] if isinstance(out, tuple) else out
        dump["latents_init"] = latents.float().clone()
        if isinstance(out, tuple):
            dump["noise"] = out[1].float().clone()
            dump["image_latents"] = out[2].float().clone()
        return out

    pipe.prepare_latents = prepare_hook
    decode = pipe.vae.decode

    def decode_hook(z, *args, **kwargs):
        dump["vae_input"] = z.float().clone()
        return decode(z, *args, **kwargs)

    pipe.vae.decode = decode_hook
    args = dict(prompt=prompt, image=image, strength=strength, num_inference_steps=steps,
                guidance_scale=guidance, generator=torch.Generator("cpu").manual_seed(seed),
                max_sequence_length=512)
    if negative is not None:
        args["negative_prompt"] = negative
    args.update(options or {})
    if kind == "inpaint":
        args["mask_image"] = Image.open(os.path.join(INPUT_DIR, f"mask-{size}.png"))
    with torch.no_grad():
        out = pipe(**args).images[0]
    pipe.vae.encode, pipe.vae.decode, pipe.prepare_latents = encode, decode, prepare
    dump["image"] = torch.from_numpy(np.array(out).astype(np.uint8))
    meta = {"model": model, "kind": kind, "image": f"inputs/picture-{size}.png",
            "mask": f"inputs/mask-{size}.png" if kind == "inpaint" else None, "prompt": prompt,
            "negative_prompt": negative, "steps": steps, "guidance": guidance, "strength": strength,
            "seed": seed, "width": image.width, "height": image.height}
    return dump, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-model", action="store_true", help="keep models/z-image-heldout as it is")
    args = ap.parse_args()
    torch.set_num_threads(2)
    from diffusers import ZImageImg2ImgPipeline, ZImageInpaintPipeline

    if not args.skip_model:
        build_heldout()
    write_inputs()
    with tempfile.TemporaryDirectory() as tmp:
        heldout = os.path.join(tmp, "heldout")
        assemble(HELDOUT_DIR, heldout)
        pipes = {}
        for model, path in (("demo", DEMO_DIR), ("heldout", heldout)):
            for kind, cls in (("img2img", ZImageImg2ImgPipeline), ("inpaint", ZImageInpaintPipeline)):
                pipes[(model, kind)] = cls.from_pretrained(path, torch_dtype=torch.float32)
        for name, case in CASES.items():
            dump, meta = run_case(pipes, name, case)
            tensors = {k: v.contiguous() for k, v in dump.items()}
            save_file(tensors, os.path.join(REF_DIR, f"{name}.safetensors"),
                      metadata={"case": json.dumps(meta)})
            print(f"reference {name}: {sorted(tensors)}", file=sys.stderr)


if __name__ == "__main__":
    main()
