"""Tiny Z-Image ControlNets for the demo model (models/z-image-tiny) and what diffusers computes
with them (models/reference/controlnet-*.safetensors).

The weights are not stored: every tensor is drawn from a counter-based generator keyed by its
name (`fill`), which the Rust tests repeat bit for bit (tests/common/controlnet.rs), so a
ControlNet of a few MB costs the repository only its config and the references. Every
projection is non-zero (before_proj and after_proj included), so the control changes the output.

Layouts (at the demo model's widths, dim 256, 2 layers, 2 refiner layers):
- `2.1`: control_in_dim 33, control blocks at layers [0, 1], a control noise refiner of control
  blocks (`add_control_noise_refiner: "control_noise_refiner"`) adding into refiner layers [0, 1];
- `2.0`: the same, the main control blocks also serving as the refiner (`"control_layers"`);
- `1.0`: control_in_dim 16, control blocks at [0, 1], a plain noise refiner for the control tokens.

The held-out model (models/z-image-heldout: dim 128, 4 heads, 3 layers, 1 refiner layer, a VAE
that halves twice) gets its own tiny ControlNets (`heldout-2.1`, `heldout-1.0`: control blocks at
layers [0, 2], so one layer between them takes no hint) and full-pipeline references at 96×80,
one with guidance, so a layout unlike the demo's is checked end to end.

Run from the repository root with the reference environment (torch 2.15, diffusers 0.42.1):

    python models/make_controlnet.py                 # forward references
    python models/make_controlnet.py --pipelines     # and the full-pipeline references
    python models/make_controlnet.py --heldout       # only the held-out model's references
    python models/make_controlnet.py --write DIR     # also keep the ControlNet directories in DIR
"""

import argparse
import json
import os
import shutil
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_DIR = os.path.join(HERE, "z-image-tiny")
REF_DIR = os.path.join(HERE, "reference")
CONFIG_DIR = os.path.join(HERE, "controlnet-tiny")

BASE = {
    "all_patch_size": [2],
    "all_f_patch_size": [1],
    "dim": 256,
    "n_refiner_layers": 2,
    "n_heads": 2,
    "n_kv_heads": 2,
    "norm_eps": 1e-05,
    "qk_norm": True,
}
LAYOUTS = {
    "2.1": dict(BASE, control_layers_places=[0, 1], control_refiner_layers_places=[0, 1],
                control_in_dim=33, add_control_noise_refiner="control_noise_refiner"),
    "2.0": dict(BASE, control_layers_places=[0, 1], control_refiner_layers_places=[0, 1],
                control_in_dim=33, add_control_noise_refiner="control_layers"),
    "1.0": dict(BASE, control_layers_places=[0, 1], control_refiner_layers_places=None,
                control_in_dim=16, add_control_noise_refiner=None),
}
SCALE = 0.75

# The held-out model's widths: one refiner layer, so one refiner hint for 2.1.
HELDOUT_BASE = dict(BASE, dim=128, n_heads=4, n_kv_heads=4, n_refiner_layers=1)
HELDOUT_LAYOUTS = {
    "2.1": dict(HELDOUT_BASE, control_layers_places=[0, 2], control_refiner_layers_places=[0],
                control_in_dim=33, add_control_noise_refiner="control_noise_refiner"),
    "1.0": dict(HELDOUT_BASE, control_layers_places=[0, 2], control_refiner_layers_places=None,
                control_in_dim=16, add_control_noise_refiner=None),
}

M64 = (1 << 64) - 1


def fnv1a(name):
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def uniform(name, n):
    """n values in [-1, 1) from splitmix64 over (hash(name) + (i + 1) * golden), in f32."""
    i = np.arange(1, n + 1, dtype=np.uint64)
    z = np.uint64(fnv1a(name)) + i * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    k = (z >> np.uint64(40)).astype(np.float32)
    return k / np.float32(1 << 23) - np.float32(1.0)


def fill(name, shape):
    """The value of tensor `name`: weights scaled by 1/sqrt(fan_in), norm weights near 1,
    biases small."""
    n = int(np.prod(shape))
    u = uniform(name, n)
    if len(shape) == 2:
        v = u * (np.float32(1.0) / np.sqrt(np.float32(shape[1])))
    elif "norm" in name:
        v = u * np.float32(0.25) + np.float32(1.0)
    else:
        v = u * np.float32(0.1)
    return torch.from_numpy(v.astype(np.float32).reshape(shape))


def build_controlnet(layout, out_dir, cfg=None, config_name=None):
    from diffusers.models.controlnets.controlnet_z_image import ZImageControlNetModel

    cfg = cfg or LAYOUTS[layout]
    config_name = config_name or layout
    model = ZImageControlNetModel(**cfg)
    state = {k: fill(k, tuple(v.shape)) for k, v in model.state_dict().items()}
    model.load_state_dict(state, strict=True)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    os.makedirs(os.path.join(CONFIG_DIR, config_name), exist_ok=True)
    shutil.copy(os.path.join(out_dir, "config.json"), os.path.join(CONFIG_DIR, config_name, "config.json"))
    return model


def forward_case():
    g = torch.Generator().manual_seed(30)
    return {
        "latents": torch.randn(16, 10, 14, generator=g),
        "caption": torch.randn(7, 16, generator=g),
        "control": torch.randn(16, 10, 14, generator=g),
        "t": 0.375,
    }


def pad_control(control, in_dim):
    if control.shape[0] == in_dim:
        return control
    zeros = torch.zeros(in_dim - control.shape[0], *control.shape[1:])
    return torch.cat([control, zeros], 0)


def write_forward_reference(layout, controlnet, transformer):
    from diffusers import ZImageControlNetModel

    case = forward_case()
    controlnet = ZImageControlNetModel.from_transformer(controlnet, transformer)
    x = [case["latents"][:, None]]
    t = torch.tensor([case["t"]])
    cap = [case["caption"]]
    ctrl = [pad_control(case["control"], controlnet.config.control_in_dim)[:, None]]
    out = {k: case[k].contiguous() for k in ("latents", "caption", "control")}
    with torch.no_grad():
        plain = transformer(x, t, cap, return_dict=False)[0][0][:, 0]
        hints = controlnet(x, t, cap, ctrl, conditioning_scale=SCALE)
        controlled = transformer(x, t, cap, return_dict=False, controlnet_block_samples=hints)[0][0][:, 0]
    out["plain"] = plain.contiguous()
    out["output"] = controlled.contiguous()
    for layer, hint in hints.items():
        out[f"hint.{layer}"] = hint[0].contiguous()
    meta = {"case": json.dumps({"t": case["t"], "scale": SCALE, "layout": layout})}
    save_file(out, os.path.join(REF_DIR, f"controlnet-{layout}-forward.safetensors"), metadata=meta)
    delta = (controlled - plain).abs().max().item()
    print(f"{layout}: forward reference written, |controlled - plain| max {delta:.4f}")


def control_image(width, height):
    from PIL import Image

    ys, xs = np.mgrid[0:height, 0:width]
    r = ((xs * 255) // max(width - 1, 1)).astype(np.uint8)
    g = ((ys * 255) // max(height - 1, 1)).astype(np.uint8)
    b = (((xs // 16 + ys // 16) % 2) * 255).astype(np.uint8)
    return Image.fromarray(np.stack([r, g, b], -1), "RGB")


def mask_image(width, height):
    from PIL import Image

    m = np.zeros((height, width), np.uint8)
    m[height // 4: 3 * height // 4, width // 4: 3 * width // 4] = 255
    return Image.fromarray(m, "L")


PIPELINE_CASES = {
    "controlnet": {"prompt": "a red fox in the snow", "width": 128, "height": 128, "steps": 8,
                   "guidance": 0.0, "seed": 42, "scale": SCALE},
    "controlnet-inpaint": {"prompt": "a red fox in the snow", "width": 128, "height": 128, "steps": 8,
                           "guidance": 0.0, "seed": 42, "scale": SCALE, "strength": 1.0},
}
# Non-square, few steps, guidance on in one (both branches steered), scales off the default.
HELDOUT_CASES = {
    "controlnet-heldout": {"prompt": "an old stone bridge", "negative_prompt": "", "width": 96,
                           "height": 80, "steps": 4, "guidance": 3.0, "seed": 7, "scale": 0.6},
    "controlnet-inpaint-heldout": {"prompt": "an old stone bridge", "width": 96, "height": 80,
                                   "steps": 4, "guidance": 0.0, "seed": 19, "scale": 1.3,
                                   "strength": 1.0},
}


def run_pipeline(pipe, case, inpaint):
    """One pipeline run from the seed, hooked (never modified) to dump what it computes."""
    from diffusers.utils.torch_utils import randn_tensor

    dump, calls = {}, {"i": 0}
    orig_cn, orig_tr, orig_step, orig_decode = (pipe.controlnet.forward, pipe.transformer.forward,
                                                pipe.scheduler.step, pipe.vae.decode)

    def cn_hook(x, t, cap_feats, control_context, *args, **kwargs):
        hints = orig_cn(x, t, cap_feats, control_context, *args, **kwargs)
        i = calls["i"]
        if i == 0:  # the first step's hints alone, to keep the file small
            dump["control_latents"] = control_context[0][:, 0].float().clone()
            for layer, h in hints.items():
                dump[f"step0.hint.{layer}"] = h[0].float().clone()
        return hints

    def tr_hook(x, t, cap_feats, *args, **kwargs):
        out = orig_tr(x, t, cap_feats, *args, **kwargs)
        i = calls["i"]
        dump[f"step{i}.t_model"] = t.float().reshape(-1)[:1].clone()
        dump[f"step{i}.model_input"] = x[0][:, 0].float().clone()
        dump[f"step{i}.model_output"] = out[0][0][:, 0].float().clone()
        return out

    def step_hook(model_output, timestep, sample, *args, **kwargs):
        res = orig_step(model_output, timestep, sample, *args, **kwargs)
        dump[f"step{calls['i']}.latents"] = res[0].float().clone()
        calls["i"] += 1
        return res

    def decode_hook(z, *args, **kwargs):
        dump["vae_input"] = z.float().clone()
        res = orig_decode(z, *args, **kwargs)
        dump["decoded"] = res[0].float().clone()
        return res

    pipe.controlnet.forward, pipe.transformer.forward = cn_hook, tr_hook
    pipe.scheduler.step, pipe.vae.decode = step_hook, decode_hook
    w, h, seed = case["width"], case["height"], case["seed"]
    cell = 2 * pipe.vae_scale_factor
    dump["latents_init"] = randn_tensor((1, 16, 2 * (h // cell), 2 * (w // cell)),
                                        generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
    kwargs = dict(prompt=case["prompt"], width=w, height=h, num_inference_steps=case["steps"],
                  guidance_scale=case["guidance"], control_image=control_image(w, h),
                  controlnet_conditioning_scale=case["scale"], negative_prompt=case.get("negative_prompt"),
                  generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
    for option in ("cfg_normalization", "cfg_truncation"):
        if option in case:
            kwargs[option] = case[option]
    if inpaint:
        # The image to repaint is the control image mirrored, so the two differ.
        kwargs["image"] = control_image(w, h).transpose(0)
        kwargs["mask_image"] = mask_image(w, h)
    try:
        with torch.no_grad():
            image = pipe(**kwargs).images[0]
    finally:
        pipe.controlnet.forward, pipe.transformer.forward = orig_cn, orig_tr
        pipe.scheduler.step, pipe.vae.decode = orig_step, orig_decode
    dump["sigmas"] = pipe.scheduler.sigmas.float().clone()
    dump["image_u8"] = torch.from_numpy((image * 255).round().clip(0, 255).astype(np.uint8))
    return dump


def write_pipeline_references(layout, controlnet_dir, cases=None, model_dir=MODEL_DIR, model="demo"):
    from diffusers import ZImageControlNetInpaintPipeline, ZImageControlNetModel, ZImageControlNetPipeline

    for name, case in (cases or PIPELINE_CASES).items():
        inpaint = "inpaint" in name
        controlnet = ZImageControlNetModel.from_pretrained(controlnet_dir, torch_dtype=torch.float32)
        if inpaint and controlnet.config.control_in_dim != 33:
            continue  # the inpaint pipeline needs the 33-channel control input of 2.x
        cls = ZImageControlNetInpaintPipeline if inpaint else ZImageControlNetPipeline
        pipe = cls.from_pretrained(model_dir, controlnet=controlnet, torch_dtype=torch.float32)
        dump = run_pipeline(pipe, case, inpaint)
        meta = {"case": json.dumps(dict(case, layout=layout, model=model, control_image="gradient+checks",
                                        image="gradient+checks mirrored" if inpaint else None,
                                        mask="centre half" if inpaint else None))}
        path = os.path.join(REF_DIR, f"{name}-{layout}.safetensors")
        save_file({k: v.contiguous() for k, v in dump.items()}, path, metadata=meta)
        print(f"{name} {layout}: {path} ({len(dump)} tensors)")


def write_heldout_references(root):
    import sys

    sys.path.insert(0, HERE)
    from make_image_reference import HELDOUT_DIR, assemble

    model_dir = os.path.join(root, "z-image-heldout")
    assemble(HELDOUT_DIR, model_dir)
    for layout, cfg in HELDOUT_LAYOUTS.items():
        out_dir = os.path.join(root, f"controlnet-heldout-{layout}")
        build_controlnet(layout, out_dir, cfg=cfg, config_name=f"heldout-{layout}")
        write_pipeline_references(layout, out_dir, HELDOUT_CASES, model_dir, "heldout")


def main():
    from diffusers import ZImageTransformer2DModel

    ap = argparse.ArgumentParser()
    ap.add_argument("--pipelines", action="store_true", help="also the full-pipeline references")
    ap.add_argument("--heldout", action="store_true", help="only the held-out model's references")
    ap.add_argument("--write", help="keep the ControlNet directories under this folder")
    args = ap.parse_args()
    torch.manual_seed(0)
    root = args.write or tempfile.mkdtemp(prefix="zimage-controlnet-")
    if args.pipelines or args.heldout:
        write_heldout_references(root)
    if args.heldout:
        return
    transformer = ZImageTransformer2DModel.from_pretrained(
        os.path.join(MODEL_DIR, "transformer"), torch_dtype=torch.float32)
    for layout in LAYOUTS:
        out_dir = os.path.join(root, f"controlnet-{layout}")
        controlnet = build_controlnet(layout, out_dir)
        write_forward_reference(layout, controlnet, transformer)
        if args.pipelines and layout != "2.0":  # 2.0 is checked at the forward
            write_pipeline_references(layout, out_dir)


if __name__ == "__main__":
    main()
