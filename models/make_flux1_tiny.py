"""Builds the tiny random FLUX.1 transformers in diffusers' layout (models/flux1-dev-tiny/transformer,
with the guidance embedder as in [dev] and Kontext, and models/flux1-schnell-tiny/transformer,
without it as in [schnell]) and dumps single forward passes of diffusers 0.42.1's
`FluxTransformer2DModel` on them (models/reference/flux1-transformer-*.safetensors), plus one
double-stream and one single-stream block at the real widths (flux1-transformer-blocks-real).

The tiny transformer keeps every architectural feature of FLUX.1's but differs from the real one
in every size its config states, so that a port which hard-codes a real size fails: 3 heads of 24
(D 72, real 24 of 128), RoPE axes 4/12/8 (unequal, sum 24; real 16/56/56), 2 double-stream and 3
single-stream blocks (real 19 and 38), joint_attention_dim 40 (real 4096), pooled_projection_dim
24 (real 768), in_channels 32 (real 64). 1-D weights are moved from 1 and biases from 0, matrices
drawn with variance 1/fan_in, and the modulation heads (`norm1`, `norm1_context`, `norm`,
`norm_out`) doubled so that shift, scale and gate each change the stream. Weights are stored in
bf16 like the real checkpoints; the f32 references read the same bf16 values (bf16 -> f32 is exact).

References (`__metadata__["case"]` holds the call as JSON: the schedule time `t` = sigma * 1000 the
model is given as `t / 1000`, the guidance, the text length and the token grids):
`hidden_states` [1, N, C] (the output grid's tokens, then any Kontext reference tokens),
`encoder_hidden_states` [1, T, J], `pooled_projections` [1, P], `img_ids` / `txt_ids`, the hooked
`double0_img` / `double0_txt` (block 0's outputs) and `single0_txt` / `single0_img` (single block 0's),
and `output` [1, N, C]. Cases: `dev` (guidance 3.5), `kontext` (the [dev] model with reference tokens
at ids (1, i, j)), `schnell` (no guidance), `dev-bf16` (`dev` with the model and inputs in bf16),
and `blocks-real` (1 + 1 blocks at the real widths, weights from make_controlnet.py's name-keyed
`fill`, modulation weights x16, so that the Rust test rebuilds them without a file).

Requires torch 2.15, diffusers 0.42.1, safetensors, numpy. From the repository root:

    python models/make_flux1_tiny.py               # models and references
    python models/make_flux1_tiny.py --skip-model  # only the references
"""

import argparse
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
DEV_DIR = os.path.join(HERE, "flux1-dev-tiny")
SCHNELL_DIR = os.path.join(HERE, "flux1-schnell-tiny")
REF_DIR = os.path.join(HERE, "reference")
SEED = 20261129

TRANSFORMER = dict(
    patch_size=1, in_channels=32, num_layers=2, num_single_layers=3, attention_head_dim=24,
    num_attention_heads=3, joint_attention_dim=40, pooled_projection_dim=24, axes_dims_rope=(4, 12, 8),
)
REAL = dict(
    patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=128,
    num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)


def is_modulation(name):
    """The adaLN heads: each block's `norm1(_context).linear` / `norm.linear`, and `norm_out.linear`."""
    return "norm" in name and ".linear." in name


def randomise_(module, std=0.3, gain=2.0):
    with torch.no_grad():
        for n, p in module.named_parameters():
            if p.ndim == 1:
                base = 1.0 if n.endswith("weight") else 0.0
                p.copy_(base + std * torch.randn_like(p))
            else:
                p.normal_(0.0, (1.0 / p[0].numel()) ** 0.5)
            if is_modulation(n):
                p.mul_(gain)


def build_transformer(guidance):
    from diffusers import FluxTransformer2DModel

    t = FluxTransformer2DModel(**TRANSFORMER, guidance_embeds=guidance)
    randomise_(t)
    return t


def build_models():
    torch.manual_seed(SEED)
    for d, guidance in ((DEV_DIR, True), (SCHNELL_DIR, False)):
        sub = os.path.join(d, "transformer")
        if os.path.exists(sub):
            shutil.rmtree(sub)
        os.makedirs(d, exist_ok=True)
        build_transformer(guidance).to(torch.bfloat16).save_pretrained(sub)


def f32(x):
    return x.detach().float().clone()


def grid_ids(h, w, first):
    return torch.tensor([[first, i, j] for i in range(h) for j in range(w)], dtype=torch.float32)


# name: model dir, dtype, call (t = sigma * 1000, guidance or None, text rows, output grid,
# reference grid or None), seed.
CASES = {
    "dev": (DEV_DIR, torch.float32, dict(t=904.530764, guidance=3.5, text=5, grid=(2, 3), reference=None), 1),
    "kontext": (DEV_DIR, torch.float32, dict(t=759.510934, guidance=2.5, text=4, grid=(2, 3), reference=(3, 2)), 2),
    "schnell": (SCHNELL_DIR, torch.float32, dict(t=750.0, guidance=None, text=6, grid=(3, 2), reference=None), 3),
    "dev-bf16": (DEV_DIR, torch.bfloat16, dict(t=904.530764, guidance=3.5, text=5, grid=(2, 3), reference=None), 1),
}


def run(model, dtype, call, seed, channels, joint, pooled_dim):
    """One forward pass with the pipeline's conventions (timestep t/1000 in the latents' dtype, an
    f32 guidance tensor, ids in the prompt's dtype), hooked at block 0 of each kind."""
    g = torch.Generator().manual_seed(seed)
    (h, w), ref = call["grid"], call["reference"]
    n = h * w + (ref[0] * ref[1] if ref else 0)
    hidden = torch.randn(1, n, channels, generator=g)
    text = torch.randn(1, call["text"], joint, generator=g)
    pooled = torch.randn(1, pooled_dim, generator=g)
    img_ids = grid_ids(h, w, 0)
    if ref:
        img_ids = torch.cat([img_ids, grid_ids(ref[0], ref[1], 1)])
    txt_ids = torch.zeros(call["text"], 3)
    dump = {"hidden_states": hidden, "encoder_hidden_states": text, "pooled_projections": pooled,
            "img_ids": img_ids, "txt_ids": txt_ids}
    timestep = torch.tensor([call["t"]], dtype=torch.float32).to(dtype) / 1000
    guidance = None if call["guidance"] is None else torch.full([1], call["guidance"], dtype=torch.float32)

    def hook(*names):
        def h(module, a, out):
            for name, o in zip(names, out if isinstance(out, tuple) else (out,)):
                dump[name] = f32(o)
        return h

    hooks = [model.transformer_blocks[0].register_forward_hook(hook("double0_txt", "double0_img")),
             model.single_transformer_blocks[0].register_forward_hook(hook("single0_txt", "single0_img"))]
    with torch.no_grad():
        out = model(hidden_states=hidden.to(dtype), encoder_hidden_states=text.to(dtype),
                    pooled_projections=pooled.to(dtype), timestep=timestep, img_ids=img_ids.to(dtype),
                    txt_ids=txt_ids.to(dtype), guidance=guidance, return_dict=False)[0]
    for hk in hooks:
        hk.remove()
    dump["output"] = f32(out)
    return dump


def save(name, dump, meta):
    path = os.path.join(REF_DIR, f"flux1-transformer-{name}.safetensors")
    save_file({k: v.contiguous() for k, v in dump.items()}, path, metadata={"case": json.dumps(meta)})
    print(f"reference flux1-transformer-{name}: {len(dump)} tensors, {os.path.getsize(path) / 1e3:.0f} kB",
          file=sys.stderr)


def tiny_cases():
    from diffusers import FluxTransformer2DModel

    for name, (d, dtype, call, seed) in CASES.items():
        model = FluxTransformer2DModel.from_pretrained(os.path.join(d, "transformer"), torch_dtype=dtype).eval()
        c = TRANSFORMER
        dump = run(model, dtype, call, seed, c["in_channels"], c["joint_attention_dim"], c["pooled_projection_dim"])
        save(name, dump, dict(call, case=name, model=os.path.basename(d), dtype=str(dtype), seed=seed))


def blocks_real():
    """One double-stream and one single-stream block at the real widths, with the top-level
    layers and the guidance embedder, on 6 image tokens (2 x 3), 4 reference tokens (2 x 2, ids
    (1, i, j)) and 5 text rows; weights from make_controlnet.py's name-keyed generator."""
    from diffusers import FluxTransformer2DModel

    sys.path.insert(0, HERE)
    from make_controlnet import fill

    with torch.device("meta"):
        model = FluxTransformer2DModel(**REAL)
    state = {}
    for k, v in model.state_dict().items():
        w = fill(k, tuple(v.shape))
        state[k] = w * 16.0 if is_modulation(k) and k.endswith(".weight") else w
    model.load_state_dict(state, assign=True, strict=True)
    model.eval()
    call = dict(t=750.0, guidance=3.5, text=5, grid=(2, 3), reference=(2, 2))
    dump = run(model, torch.float32, call, 31, REAL["in_channels"], REAL["joint_attention_dim"],
               REAL["pooled_projection_dim"])
    meta = dict(call, case="blocks-real", config=dict(REAL, axes_dims_rope=list(REAL["axes_dims_rope"])),
                weights="make_controlnet.fill(name, shape), weights of the modulation heads (names containing "
                        "'norm' and '.linear.') times 16", seed=31)
    save("blocks-real", dump, meta)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-model", action="store_true", help="keep the model directories as they are")
    ap.add_argument("--only", choices=["tiny", "blocks-real"])
    args = ap.parse_args()
    torch.set_num_threads(2)
    if not args.skip_model and args.only != "blocks-real":
        build_models()
    if args.only != "blocks-real":
        tiny_cases()
    if args.only != "tiny":
        blocks_real()


if __name__ == "__main__":
    main()
