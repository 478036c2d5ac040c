"""Makes two LoRAs for the tiny FLUX.2 [klein] (models/flux2-klein-tiny) and dumps what diffusers
draws with each loaded, for the klein LoRA parity tests (tests/klein_cli.rs).

- `klein-lora-peft.safetensors`: a rank-4 LoRA (lora_alpha 8, so alpha/r = 2) made with peft
  on every linear layer of both kinds of block (q, k, v and output of both streams, both
  feed-forwards, the single blocks' fused projection and output) and on `x_embedder`,
  `context_embedder` and `proj_out`, saved by `Flux2KleinPipeline.save_lora_weights` in the
  diffusers/peft layout with its adapter metadata (where the alpha is).
- `klein-lora-bfl.safetensors`: a rank-4 LoRA in the original (BFL) names under
  `diffusion_model.`, as ai-toolkit and ComfyUI write them: a double block's `img_attn.qkv` and
  `txt_attn.qkv` one fused pair each (q, k and v share A; B's rows are q's, k's, v's), `proj`,
  `img_mlp.0/2`, `txt_mlp.0/2`, a single block's `linear1`/`linear2`, and `img_in`, `txt_in`,
  `time_in.in_layer`, `final_layer.linear`. No alpha (diffusers' converter takes none) and no
  `final_layer.adaLN_modulation.1` (diffusers 0.42.1 maps it onto `norm_out.linear` without
  swapping its shift and scale halves, as its base-weight conversion does).

A and B are drawn from a fixed seed (peft would start B at zero). A fresh f32 pipeline loads
each file with `load_lora_weights` and draws the case below; the image without a LoRA is kept
too. Written to models/reference/:

    klein-lora-peft.safetensors, klein-lora-bfl.safetensors   the LoRA files
    klein-lora.safetensors   `base_u8`, `peft_u8`, `bfl_u8` (uint8 images) and the request in
                             `__metadata__["case"]`

Requires what make_klein_tiny.py requires, plus peft (0.21). From the repository root:

    python models/make_klein_lora_reference.py
"""

import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_klein_tiny import MODEL_DIR, REF_DIR  # noqa: E402

SEED = 20261127
RANK = 4
ALPHA = 8
# Every linear layer of the blocks, and three outside them, by their full names.
PEFT_TARGETS = (r"^(x_embedder|context_embedder|proj_out"
                r"|transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj"
                r"|add_v_proj|to_add_out)|ff\.linear_in|ff\.linear_out|ff_context\.linear_in"
                r"|ff_context\.linear_out)"
                r"|single_transformer_blocks\.\d+\.attn\.(to_qkv_mlp_proj|to_out))$")
CASE = dict(prompt="a red fox in the snow", width=96, height=64, num_inference_steps=4,
            guidance_scale=1.0, seed=42)


def draw_a(generator, shape):
    # A row of A reads the input at about unit gain.
    return torch.randn(shape, generator=generator) * 0.5 / shape[1] ** 0.5


def draw_b(generator, shape):
    return torch.randn(shape, generator=generator) * 0.05


def make_peft(path):
    """Adds a peft adapter to the tiny transformer, draws its weights and saves it as diffusers
    saves trained LoRAs. Returns the number of pairs."""
    from diffusers import Flux2KleinPipeline, Flux2Transformer2DModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    transformer = Flux2Transformer2DModel.from_pretrained(
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
    Flux2KleinPipeline.save_lora_weights(os.path.dirname(path), transformer_lora_layers=layers,
                                         weight_name=os.path.basename(path),
                                         transformer_lora_adapter_metadata=metadata)
    return len(layers) // 2


def make_bfl(path):
    """A LoRA in the original names, fused qkv pairs included. Returns the number of pairs."""
    cfg = json.load(open(os.path.join(MODEL_DIR, "transformer", "config.json")))
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    m = int(d * cfg["mlp_ratio"])
    layers = [("img_in", cfg["in_channels"], d), ("txt_in", cfg["joint_attention_dim"], d),
              ("time_in.in_layer", cfg["timestep_guidance_channels"], d),
              ("final_layer.linear", d, cfg["in_channels"])]
    for b in range(cfg["num_layers"]):
        for s in ("img", "txt"):
            layers += [(f"double_blocks.{b}.{s}_attn.qkv", d, 3 * d), (f"double_blocks.{b}.{s}_attn.proj", d, d),
                       (f"double_blocks.{b}.{s}_mlp.0", d, 2 * m), (f"double_blocks.{b}.{s}_mlp.2", m, d)]
    for b in range(cfg["num_single_layers"]):
        layers += [(f"single_blocks.{b}.linear1", d, 3 * d + 2 * m), (f"single_blocks.{b}.linear2", d + m, d)]
    generator = torch.Generator("cpu").manual_seed(SEED + 1)
    tensors = {}
    for name, inp, out in layers:
        tensors[f"diffusion_model.{name}.lora_A.weight"] = draw_a(generator, (RANK, inp))
        tensors[f"diffusion_model.{name}.lora_B.weight"] = draw_b(generator, (out, RANK))
    save_file(tensors, path)
    return len(layers)


def draw(lora_path):
    """The case's image by a fresh f32 pipeline (with the LoRA loaded, if any), as uint8."""
    import numpy as np
    from diffusers import Flux2KleinPipeline

    pipe = Flux2KleinPipeline.from_pretrained(MODEL_DIR, dtype=torch.float32)
    if lora_path:
        pipe.load_lora_weights(lora_path)
    call = {k: v for k, v in CASE.items() if k != "seed"}
    with torch.no_grad():
        image = pipe(**call, generator=torch.Generator("cpu").manual_seed(CASE["seed"]),
                     output_type="pil").images[0]
    return torch.from_numpy(np.array(image).astype(np.uint8))


def main():
    torch.set_num_threads(2)
    os.makedirs(REF_DIR, exist_ok=True)
    images = {"base_u8": draw(None)}
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, make in (("peft", make_peft), ("bfl", make_bfl)):
            name = f"klein-lora-{kind}.safetensors"
            written = os.path.join(tmp, name)
            counts[kind] = make(written)
            images[f"{kind}_u8"] = draw(written)
            shutil.move(written, os.path.join(REF_DIR, name))
    for kind in ("peft", "bfl"):
        changed = (images[f"{kind}_u8"] != images["base_u8"]).float().mean().item()
        print(f"{kind}: {counts[kind]} pairs, {changed:.1%} of values changed", file=sys.stderr)
    meta = dict(CASE, dtype="float32", lora_scale=1.0, rank=RANK, peft_alpha=ALPHA, lora_seed=SEED,
                peft="klein-lora-peft.safetensors", bfl="klein-lora-bfl.safetensors",
                model=os.path.basename(MODEL_DIR))
    save_file({k: v.contiguous() for k, v in images.items()}, os.path.join(REF_DIR, "klein-lora.safetensors"),
              metadata={"case": json.dumps(meta)})


if __name__ == "__main__":
    main()
