"""Makes a LoRA for the demo model with peft and dumps what diffusers draws with it, for the
LoRA parity test (tests/lora.rs).

A rank-4 LoRA (lora_alpha 8, so alpha/r = 2) on every attention (`to_q`, `to_k`, `to_v`,
`to_out.0`) and feed-forward (`w1`, `w2`, `w3`) linear layer of the transformer, the main
blocks and both refiners, with A and B drawn from a fixed seed (peft would start B at zero),
saved by `ZImagePipeline.save_lora_weights` in the diffusers/peft layout with its adapter
metadata (where the alpha is). A fresh f32 pipeline then loads the file with
`load_lora_weights` and draws the `square` case of make_tiny.py (same prompt, size, steps and
seed). Written to models/reference/:

    lora-peft.safetensors   the LoRA file, as diffusers wrote it
    lora.safetensors        `image_u8` (the uint8 image) and the request in
                            `__metadata__["case"]`, as the other references hold them

Requires what make_tiny.py requires, plus peft (0.21). Run from the repository root:

    python models/make_lora_reference.py
"""

import json
import os
import sys
import shutil
import tempfile

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_tiny import CASES, MODEL_DIR, REF_DIR  # noqa: E402

SEED = 20261123
RANK = 4
ALPHA = 8
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "w1", "w2", "w3"]
CASE = "square"


def make_lora(path):
    """Adds a peft adapter to the demo transformer, draws its weights and saves it as diffusers
    saves trained LoRAs."""
    from diffusers import ZImagePipeline, ZImageTransformer2DModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    transformer = ZImageTransformer2DModel.from_pretrained(
        os.path.join(MODEL_DIR, "transformer"), torch_dtype=torch.float32)
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, init_lora_weights=True)
    transformer.add_adapter(config)
    generator = torch.Generator("cpu").manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(transformer.named_parameters()):
            if ".lora_A." in name:
                # A row of A reads the input at about unit gain.
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5 / p.shape[1] ** 0.5)
            elif ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    layers = get_peft_model_state_dict(transformer)
    assert len(layers) == 2 * len(TARGETS) * 6, len(layers)
    metadata = transformer.peft_config["default"].to_dict()
    directory = os.path.dirname(path)
    ZImagePipeline.save_lora_weights(directory, transformer_lora_layers=layers,
                                     weight_name=os.path.basename(path),
                                     transformer_lora_adapter_metadata=metadata)
    return len(layers) // 2


def draw(lora_path):
    """The case's image by a fresh f32 pipeline with the LoRA loaded, as uint8."""
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(MODEL_DIR, torch_dtype=torch.float32)
    pipe.load_lora_weights(lora_path)
    prompt, negative, width, height, steps, guidance, seed = CASES[CASE]
    image = pipe(prompt=prompt, negative_prompt=negative, width=width, height=height,
                 num_inference_steps=steps, guidance_scale=guidance,
                 generator=torch.Generator("cpu").manual_seed(seed), max_sequence_length=512,
                 output_type="np").images[0]
    meta = {"prompt": prompt, "negative_prompt": negative, "width": width, "height": height,
            "steps": steps, "guidance": guidance, "seed": seed, "dtype": "float32",
            "lora": "lora-peft.safetensors", "lora_scale": 1.0, "rank": RANK, "lora_alpha": ALPHA,
            "targets": TARGETS, "lora_seed": SEED}
    return torch.from_numpy((image * 255).round().astype("uint8")), meta


def main():
    torch.set_num_threads(2)
    os.makedirs(REF_DIR, exist_ok=True)
    lora_path = os.path.join(REF_DIR, "lora-peft.safetensors")
    with tempfile.TemporaryDirectory() as tmp:
        written = os.path.join(tmp, "lora-peft.safetensors")
        pairs = make_lora(written)
        image, meta = draw(written)
        shutil.move(written, lora_path)
    save_file({"image_u8": image.contiguous()}, os.path.join(REF_DIR, "lora.safetensors"),
              metadata={"case": json.dumps(meta)})
    print(f"lora reference: {pairs} pairs, image {tuple(image.shape)}", file=sys.stderr)


if __name__ == "__main__":
    main()
