"""Makes a LoRA for the tiny FLUX.3 [klein] (models/flux3-klein-tiny) in two namings and dumps
what diffusers draws with each loaded, for the FLUX.3 LoRA parity test (tests/flux3_lora.rs).

- `flux3-lora-peft.safetensors`: a rank-4 LoRA (lora_alpha 8, so alpha/r = 2) made with peft on
  every linear layer of every block kind (the image, reference and text mode blocks and the
  joint blocks: q, k, v, the attention output and both feed-forward layers), saved by
  `Flux3ModularPipeline.save_lora_weights` in the diffusers/peft layout with its adapter
  metadata (where the alpha is).
- `flux3-lora-bfl.safetensors`: the same pairs in Black Forest Labs' names under
  `diffusion_model.` (`content_mode_blocks.image.0.q_proj`, `txt_mode_blocks.1.mlp_in`,
  `single_blocks.2.attn_out`, …), as BFL's and ComfyUI's trainers write them. Such a file has no
  alpha (diffusers' converter reads none, so its scale is 1): B is stored times alpha/r = 2, an
  exact product, so both files make the same update. Block layers only: diffusers' converter
  renames nothing outside the blocks (those keys would match no layer there and be ignored).

A and B are drawn from a fixed seed (peft would start B at zero). A fresh f32 pipeline (the
modular blocks without the prompt upsampler, as make_flux3_tiny.py loads them) loads each file
with `load_lora_weights` and draws the case below; the image without a LoRA is kept too.
Written to models/reference/:

    flux3-lora-peft.safetensors, flux3-lora-bfl.safetensors   the LoRA files
    flux3-lora.safetensors   `base_u8`, `peft_u8`, `bfl_u8` (uint8 images) and the request in
                             `__metadata__["case"]`

Requires what make_flux3_tiny.py requires, plus peft (0.21). From the repository root:

    python models/make_flux3_lora_reference.py
"""

import json
import os
import re
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_flux3_tiny import MODEL_DIR, REF_DIR, load_pipeline  # noqa: E402

SEED = 20261130
RANK = 4
ALPHA = 8
BLOCK = r"(mode_blocks\.(image|image_cond)|txt_mode_blocks|single_transformer_blocks)\.\d+\."
PEFT_TARGETS = rf"^{BLOCK}(attn\.(to_q|to_k|to_v|to_out\.0)|ff\.(linear_in|linear_out))$"
CASE = dict(prompt="a red fox in the snow", width=72, height=56, num_inference_steps=3, seed=42)

# Block-internal diffusers suffixes and block prefixes, each with BFL's (the spec §10.2).
SUFFIXES = {"attn.to_q": "q_proj", "attn.to_k": "k_proj", "attn.to_v": "v_proj",
            "attn.to_out.0": "attn_out", "ff.linear_in": "mlp_in", "ff.linear_out": "mlp_out"}
PREFIXES = {"mode_blocks.": "content_mode_blocks.", "txt_mode_blocks.": "txt_mode_blocks.",
            "single_transformer_blocks.": "single_blocks."}


def draw_a(generator, shape):
    # A row of A reads the input at about unit gain.
    return torch.randn(shape, generator=generator) * 0.5 / shape[1] ** 0.5


def draw_b(generator, shape):
    return torch.randn(shape, generator=generator) * 0.05


def make_peft(path):
    """Adds a peft adapter to the tiny transformer, draws its weights and saves it as diffusers
    saves trained LoRAs. Returns the number of pairs."""
    from diffusers import Flux3Transformer2DModel
    from diffusers.modular_pipelines import Flux3ModularPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    transformer = Flux3Transformer2DModel.from_pretrained(
        os.path.join(MODEL_DIR, "transformer"), torch_dtype=torch.float32)
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=PEFT_TARGETS, init_lora_weights=True)
    transformer.add_adapter(config)
    generator = torch.Generator("cpu").manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(transformer.named_parameters()):
            if ".lora_A." in name:
                p.copy_(draw_a(generator, p.shape))
            elif ".lora_B." in name:
                p.copy_(draw_b(generator, p.shape))
    layers = get_peft_model_state_dict(transformer)
    metadata = transformer.peft_config["default"].to_dict()
    Flux3ModularPipeline.save_lora_weights(os.path.dirname(path), transformer_lora_layers=layers,
                                           weight_name=os.path.basename(path),
                                           transformer_lora_adapter_metadata=metadata)
    return len(layers) // 2


def bfl_key(key):
    """A saved diffusers key (`transformer.<module>.lora_A.weight`) in BFL's names."""
    module, part = re.fullmatch(r"transformer\.(.+)\.(lora_[AB]\.weight)", key).groups()
    prefix = next(p for p in PREFIXES if module.startswith(p))
    head, index, rest = re.fullmatch(r"((?:image_cond|image)\.)?(\d+)\.(.+)", module[len(prefix):]).groups()
    return f"diffusion_model.{PREFIXES[prefix]}{head or ''}{index}.{SUFFIXES[rest]}.{part}"


def make_bfl(peft_path, path):
    """The peft file's pairs renamed to BFL's names, B times alpha/r. Returns the pair count."""
    tensors = {}
    for key, value in load_file(peft_path).items():
        scale = ALPHA / RANK if ".lora_B." in key else 1.0
        tensors[bfl_key(key)] = (value * scale).contiguous()
    save_file(tensors, path)
    return len(tensors) // 2


def draw(lora_path):
    """The case's image by a fresh f32 pipeline (with the LoRA loaded, if any), as uint8."""
    import numpy as np

    pipe = load_pipeline("distilled")
    if lora_path:
        pipe.load_lora_weights(lora_path)
    call = {k: v for k, v in CASE.items() if k != "seed"}
    with torch.no_grad():
        out = pipe(**call, generator=torch.Generator("cpu").manual_seed(CASE["seed"]), output=["images"])
    image = out["images"][0]
    return torch.from_numpy(np.array(image).astype(np.uint8))


def main():
    torch.set_num_threads(2)
    os.makedirs(REF_DIR, exist_ok=True)
    images = {"base_u8": draw(None)}
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        peft = os.path.join(tmp, "flux3-lora-peft.safetensors")
        bfl = os.path.join(tmp, "flux3-lora-bfl.safetensors")
        counts["peft"] = make_peft(peft)
        counts["bfl"] = make_bfl(peft, bfl)
        for kind, written in (("peft", peft), ("bfl", bfl)):
            images[f"{kind}_u8"] = draw(written)
        for written in (peft, bfl):
            shutil.move(written, os.path.join(REF_DIR, os.path.basename(written)))
    for kind in ("peft", "bfl"):
        changed = (images[f"{kind}_u8"] != images["base_u8"]).float().mean().item()
        print(f"{kind}: {counts[kind]} pairs, {changed:.1%} of values changed", file=sys.stderr)
    same = (images["peft_u8"] == images["bfl_u8"]).float().mean().item()
    print(f"diffusers draws the two namings {same:.2%} alike", file=sys.stderr)
    meta = dict(CASE, dtype="float32", lora_scale=1.0, rank=RANK, peft_alpha=ALPHA, lora_seed=SEED,
                peft="flux3-lora-peft.safetensors", bfl="flux3-lora-bfl.safetensors",
                model=os.path.basename(MODEL_DIR))
    save_file({k: v.contiguous() for k, v in images.items()}, os.path.join(REF_DIR, "flux3-lora.safetensors"),
              metadata={"case": json.dumps(meta)})


if __name__ == "__main__":
    main()
