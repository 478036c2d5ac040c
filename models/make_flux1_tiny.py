"""Builds three tiny random FLUX.1 pipelines in diffusers layout and dumps what diffusers 0.42.1
computes with them (models/reference/flux1-*.safetensors):

- models/flux1-dev-tiny: `FluxPipeline`, the transformer with the guidance embedder, the [dev]
  scheduler (dynamic shifting, base/max shift 0.5/1.15 over 256..4096 tokens);
- models/flux1-schnell-tiny: `FluxPipeline`, the transformer without the guidance embedder, the
  [schnell] scheduler (static shift 1.0, so sigmas are a linspace);
- models/flux1-kontext-tiny: `FluxKontextPipeline` with the [dev] transformer (the same files)
  and scheduler.

Each directory holds `model_index.json` (the real files' keys and classes), `scheduler/` (the
real keys), `transformer/`, `vae/` (the same files in all three) and the text encoders and
tokenizers of models/text-encoders-tiny (copied byte for byte, so the repository stores them once;
CLIP hidden 48 with a 32-token window, T5 d_model 40).

The tiny transformer keeps every architectural feature of FLUX.1's but differs from the real one
in every size its config states, so that a port which hard-codes a real size fails: 3 heads of 24
(D 72, real 24 of 128), RoPE axes 4/12/8 (unequal, sum 24; real 16/56/56), 2 double-stream and 3
single-stream blocks (real 19 and 38), joint_attention_dim 40 (real 4096; T5's d_model),
pooled_projection_dim 48 (real 768; CLIP's hidden size), in_channels 32 (real 64). 1-D weights are
moved from 1 and biases from 0, matrices drawn with variance 1/fan_in, and the modulation heads
(`norm1`, `norm1_context`, `norm`, `norm_out`) doubled so that shift, scale and gate each change
the stream. The VAE is an `AutoencoderKL` with 3 levels (so 4x instead of 8x, and image sides are
multiples of 8 instead of 16), channels 16/32/32, one resnet per level, 8 groups, 8 latent
channels (real 16), mid-block attention, no quant convolutions, scaling_factor 0.4131 and
shift_factor 0.0712 (real 0.3611 and 0.1159), randomised the same way. Weights are stored in bf16
like the real checkpoints; the f32 references read the same bf16 values (bf16 -> f32 is exact).

Pipeline references (`flux1-CASE`; f32 unless the name says bf16, from the seed alone with a CPU
generator; `__metadata__["case"]` holds the call as JSON plus the pipeline class, dtype,
steps_run, width_out / height_out, max_sequence_length, mu, the guidance tensor's dtype and the
unpadded CLIP and T5 ids, up to and including the first EOS):
- `t2i-dev`: [dev], "a red fox in the snow", 88x56, 4 steps, guidance 3.5, seed 42 (T5 512);
- `t2i-schnell`: [schnell], "a lighthouse at dusk, oil painting", 64x80, 3 steps, guidance 0,
  max_sequence_length 256, seed 3;
- `true-cfg`: [dev], "a cat on a sofa", negative "blurry, dark", true_cfg_scale 2, guidance 3.5,
  72x64, 3 steps, seed 7;
- `kontext`: Kontext, "make it snowy", reference inputs/picture-96x80.png, 80x64 with max_area
  80*64 and `_auto_resize=False` (so the reference keeps its 96x80), 3 steps, guidance 2.5, seed 5;
- `kontext-resize`: Kontext with auto-resize on klein-inputs/picture-100x75.png: only the picture
  as the pipeline feeds it to vae.encode (a wrapper ends the call there, so the 1 MP denoise never
  runs), written as the 8-bit PNG reference/flux1-kontext-resized.png it exactly is, its size in
  the metadata and in `size` (width, height);
- `img2img` / `inpaint`: `FluxImg2ImgPipeline` / `FluxInpaintPipeline` on [dev]'s components,
  klein-inputs/picture-100x75.png stretched to 80x64 (and klein-inputs/mask-100x75.png),
  strength 0.6 / 0.8, 5 steps (3 / 4 run), guidance 3.5, seed 11 / 13;
- `t2i-dev-bf16`: `t2i-dev` with every component in bf16, plus `math_sdpa.final_latents`.
Tensors, captured with hooks (the pipeline is not modified): `clip_ids` [1, 32] / `t5_ids` [1, T]
(i64, as fed to the encoders), `pooled_prompt_embeds` [1, 48], `prompt_embeds` [1, T, 40]
(`negative_*` for true CFG), `latents_init` [1, N, 32] (packed), every vae.encode's `encodeK.input`
and `encodeK.moments`, Kontext's `condition_latents` (packed reference tokens), `noise` and
`image_latents` (packed) for img2img / inpaint and inpaint's packed `mask`, `img_ids` (output then
reference rows), `sigmas` / `timesteps` (the full tables) and `mu`, per step `stepI.model_input`,
`stepI.timestep`, `stepI.guidance`, `stepI.model_output` (and `_neg`), `stepI.noise_pred` and
`stepI.latents` (inpaint: after the blend, `stepI.euler` before it), `final_latents`, `vae_input`,
`decoded` [1, 3, H, W] and `image` [H, W, 3] (u8).

Transformer references (`flux1-transformer-*`, one forward pass of `FluxTransformer2DModel` each;
the call in `__metadata__["case"]`: the schedule time `t` = sigma * 1000 the model is given as
`t / 1000`, the guidance, the text length and the token grids): `hidden_states` [1, N, C] (the
output grid's tokens, then any Kontext reference tokens), `encoder_hidden_states` [1, T, J],
`pooled_projections` [1, P], `img_ids` / `txt_ids`, the hooked `double0_img` / `double0_txt`
(block 0's outputs) and `single0_txt` / `single0_img` (single block 0's), and `output` [1, N, C].
Cases: `dev` (guidance 3.5), `kontext` (the [dev] model with reference tokens at ids (1, i, j)),
`schnell` (no guidance), `dev-bf16` (`dev` with the model and inputs in bf16), and `blocks-real`
(1 + 1 blocks at the real widths, weights from make_controlnet.py's name-keyed `fill`, modulation
weights x16, so that the Rust test rebuilds them without a file).

Requires torch 2.15, diffusers 0.42.1, transformers 5.23.0, safetensors, pillow, numpy, and reads
models/text-encoders-tiny and the input pictures under models/reference. From the repository root:

    python models/make_flux1_tiny.py                  # models and every reference
    python models/make_flux1_tiny.py --skip-model     # only the references
    python models/make_flux1_tiny.py --only t2i-dev   # one reference (or `transformer`, `blocks-real`)
    python models/make_flux1_tiny.py --big DIR        # the benchmarks' big model, in DIR

The benchmarks' big model (`--big`, benches/diffusers_compare.sh flux1) is a random FLUX.1 [dev]
(`FluxPipeline`, the guidance embedder, the [dev] scheduler) whose compute is of the order of the
big klein's: a transformer 512 wide (4 heads of 128, the real RoPE axes 16/56/56, MLP ratio 4)
with 2 double- and 4 single-stream blocks, 64 input channels, joint_attention_dim 1024 and
pooled_projection_dim 512; a T5 encoder (gated-gelu, d_model 1024, 16 heads of 64, d_ff 2816,
8 layers, the real 32 buckets / max distance 128 and vocabulary of 32128) read through the real
512-token window; a CLIP text model (512 wide, 8 heads, MLP 2048, 6 layers, the real 77 positions
and vocabulary of 49408); and the real FLUX.1 VAE's architecture (128/256/512/512 channels, two
resnets per level, 32 groups, 16 latent channels, scaling 0.3611, shift 0.1159), so that the
decode costs what the real one does. The tokenizers are models/text-encoders-tiny's, the CLIP
one with the real 77-token window. Weights are randomised as the tiny ones' and stored in bf16.
"""

import argparse
import functools
import json
import os
import shutil
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
DEV_DIR = os.path.join(HERE, "flux1-dev-tiny")
SCHNELL_DIR = os.path.join(HERE, "flux1-schnell-tiny")
KONTEXT_DIR = os.path.join(HERE, "flux1-kontext-tiny")
TEXT_DIR = os.path.join(HERE, "text-encoders-tiny")
TEXT_PARTS = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
REF_DIR = os.path.join(HERE, "reference")
# Kontext's picture as the pipeline stretched it, relative to REF_DIR.
RESIZED_PNG = "flux1-kontext-resized.png"
SEED = 20261129

TRANSFORMER = dict(
    patch_size=1, in_channels=32, num_layers=2, num_single_layers=3, attention_head_dim=24,
    num_attention_heads=3, joint_attention_dim=40, pooled_projection_dim=48, axes_dims_rope=(4, 12, 8),
)
VAE = dict(
    in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 3,
    up_block_types=["UpDecoderBlock2D"] * 3, block_out_channels=[16, 32, 32], layers_per_block=1,
    act_fn="silu", latent_channels=8, norm_num_groups=8, sample_size=128, scaling_factor=0.4131,
    shift_factor=0.0712, force_upcast=True, use_quant_conv=False, use_post_quant_conv=False,
    mid_block_add_attention=True,
)
REAL = dict(
    patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=128,
    num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
# The keys of the real scheduler_config.json files.
SCHEDULER_DEV = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.42.1",
                 "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
                 "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True}
SCHEDULER_SCHNELL = dict(SCHEDULER_DEV, shift=1.0, use_dynamic_shifting=False)


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


def build_transformer(guidance, config=TRANSFORMER):
    from diffusers import FluxTransformer2DModel

    t = FluxTransformer2DModel(**config, guidance_embeds=guidance)
    randomise_(t)
    return t


def build_vae(config=VAE):
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(**config)
    randomise_(vae, gain=1.0)
    return vae


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def model_index(pipeline):
    """model_index.json as the real repositories have it (diffusers' `save_config` would write
    transformers 5's class name `T5Tokenizer` for the T5 tokenizer, and null IP-adapter slots)."""
    return {
        "_class_name": pipeline, "_diffusers_version": "0.42.1",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"],
    }


def build_models():
    torch.manual_seed(SEED)
    for d in (DEV_DIR, SCHNELL_DIR, KONTEXT_DIR):
        if os.path.exists(d):
            shutil.rmtree(d)
        os.makedirs(d)
    build_transformer(True).to(torch.bfloat16).save_pretrained(os.path.join(DEV_DIR, "transformer"))
    build_transformer(False).to(torch.bfloat16).save_pretrained(os.path.join(SCHNELL_DIR, "transformer"))
    build_vae().to(torch.bfloat16).save_pretrained(os.path.join(DEV_DIR, "vae"))
    # Kontext [dev] is the [dev] architecture: the same transformer files. The VAE and the text
    # components are the same files everywhere (git stores identical files once).
    shutil.copytree(os.path.join(DEV_DIR, "transformer"), os.path.join(KONTEXT_DIR, "transformer"))
    for d, pipeline, scheduler in ((DEV_DIR, "FluxPipeline", SCHEDULER_DEV),
                                   (SCHNELL_DIR, "FluxPipeline", SCHEDULER_SCHNELL),
                                   (KONTEXT_DIR, "FluxKontextPipeline", SCHEDULER_DEV)):
        if d != DEV_DIR:
            shutil.copytree(os.path.join(DEV_DIR, "vae"), os.path.join(d, "vae"))
        for part in TEXT_PARTS:
            shutil.copytree(os.path.join(TEXT_DIR, part), os.path.join(d, part))
        os.makedirs(os.path.join(d, "scheduler"))
        write_json(os.path.join(d, "scheduler", "scheduler_config.json"), scheduler)
        write_json(os.path.join(d, "model_index.json"), model_index(pipeline))


def f32(x):
    return x.detach().float().clone()


def grid_ids(h, w, first):
    return torch.tensor([[first, i, j] for i in range(h) for j in range(w)], dtype=torch.float32)


# Transformer-level cases. name: model dir, dtype, call (t = sigma * 1000, guidance or None, text
# rows, output grid, reference grid or None), seed.
TRANSFORMER_CASES = {
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
    path = os.path.join(REF_DIR, f"flux1-{name}.safetensors")
    save_file({k: v.contiguous() for k, v in dump.items()}, path, metadata={"case": json.dumps(meta)})
    print(f"reference flux1-{name}: {len(dump)} tensors, {os.path.getsize(path) / 1e3:.0f} kB", file=sys.stderr)


def transformer_cases():
    from diffusers import FluxTransformer2DModel

    for name, (d, dtype, call, seed) in TRANSFORMER_CASES.items():
        model = FluxTransformer2DModel.from_pretrained(os.path.join(d, "transformer"), torch_dtype=dtype).eval()
        c = TRANSFORMER
        dump = run(model, dtype, call, seed, c["in_channels"], c["joint_attention_dim"], c["pooled_projection_dim"])
        save(f"transformer-{name}", dump, dict(call, case=name, model=os.path.basename(d), dtype=str(dtype), seed=seed))


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
    save("transformer-blocks-real", dump, meta)


def input_path(name):
    """`name` as recorded in a case: relative to models/reference."""
    return os.path.join(REF_DIR, name)


# Pipeline cases. name: kind (text / kontext / kontext-resize / img2img / inpaint), model (dev /
# schnell / kontext), call arguments. Images are paths relative to models/reference; every run is
# f32 (or bf16, BF16_CASES) with a CPU generator seeded with `seed`. `kontext-resize` stops at the
# first vae.encode: only the auto-resized reference is kept (the 1 MP denoise never runs).
PICTURE = "klein-inputs/picture-100x75.png"
CASES = {
    "t2i-dev": ("text", "dev", dict(prompt="a red fox in the snow", width=88, height=56, num_inference_steps=4,
                                    guidance_scale=3.5, seed=42)),
    "t2i-schnell": ("text", "schnell", dict(prompt="a lighthouse at dusk, oil painting", width=64, height=80,
                                            num_inference_steps=3, guidance_scale=0.0, max_sequence_length=256,
                                            seed=3)),
    "true-cfg": ("text", "dev", dict(prompt="a cat on a sofa", negative_prompt="blurry, dark", true_cfg_scale=2.0,
                                     guidance_scale=3.5, width=72, height=64, num_inference_steps=3, seed=7)),
    "kontext": ("kontext", "kontext", dict(prompt="make it snowy", image="inputs/picture-96x80.png", width=80,
                                           height=64, max_area=80 * 64, _auto_resize=False, num_inference_steps=3,
                                           guidance_scale=2.5, seed=5)),
    "kontext-resize": ("kontext-resize", "kontext", dict(prompt="make it snowy", image=PICTURE, seed=5)),
    "img2img": ("img2img", "dev", dict(prompt="a red fox in the snow", image=PICTURE, width=80, height=64,
                                       strength=0.6, num_inference_steps=5, guidance_scale=3.5, seed=11)),
    "inpaint": ("inpaint", "dev", dict(prompt="a red fox in the snow", image=PICTURE,
                                       mask_image="klein-inputs/mask-100x75.png", width=80, height=64,
                                       strength=0.8, num_inference_steps=5, guidance_scale=3.5, seed=13)),
}

# Cases also run with every component in bf16, as the real checkpoints run: name -> f32 case.
BF16_CASES = {"t2i-dev-bf16": "t2i-dev"}
MODEL_DIRS = {"dev": DEV_DIR, "schnell": SCHNELL_DIR, "kontext": KONTEXT_DIR}


def load_pipelines(dtype, models):
    from diffusers import FluxImg2ImgPipeline, FluxInpaintPipeline, FluxKontextPipeline, FluxPipeline

    pipes = {}
    for model in models:
        if model == "kontext":
            kontext = FluxKontextPipeline.from_pretrained(KONTEXT_DIR, dtype=dtype)
            pipes[(model, "kontext")] = pipes[(model, "kontext-resize")] = kontext
            continue
        text = FluxPipeline.from_pretrained(MODEL_DIRS[model], dtype=dtype)
        pipes[(model, "text")] = text
        pipes[(model, "img2img")] = FluxImg2ImgPipeline(**text.components)
        pipes[(model, "inpaint")] = FluxInpaintPipeline(**text.components)
    return pipes


class _Stop(Exception):
    """Raised by the vae.encode wrapper to end a `kontext-resize` call at its first encode."""


def unpadded(ids, eos):
    """The ids up to and including the first `eos` (CLIP pads with its EOS, T5 with 0)."""
    ids = ids[0].tolist()
    return ids[:ids.index(eos) + 1] if eos in ids else ids


def run_case(pipe, kind, args):
    """One hooked run. Returns the dump and the request as recorded in the file."""
    dump = {}
    undo = []
    seen = {}
    step = {"i": 0}

    def wrap(obj, name, after=None, before=None):
        orig = getattr(obj, name)

        @functools.wraps(orig)  # the pipelines inspect set_timesteps' signature
        def wrapper(*a, **kw):
            if before is not None:
                before(*a, **kw)
            out = orig(*a, **kw)
            if after is not None:
                after(out, *a, **kw)
            return out

        setattr(obj, name, wrapper)
        undo.append((obj, name))

    def ids_hook(name):
        def hook(module, a, kw):
            prefix = "" if name not in dump else "negative_"
            dump[prefix + name] = (a[0] if a else kw["input_ids"]).clone()
        return hook

    def prompt_hook(out, *a, **kw):
        prefix = "" if "prompt_embeds" not in dump else "negative_"
        dump[prefix + "prompt_embeds"] = f32(out[0])
        dump[prefix + "pooled_prompt_embeds"] = f32(out[1])

    def encode_before(x, *a, **kw):
        dump[f"encode{seen.setdefault('encodes', 0)}.input"] = f32(x)
        if kind == "kontext-resize":
            raise _Stop

    def encode_after(out, x, *a, **kw):
        dump[f"encode{seen['encodes']}.moments"] = f32(out.latent_dist.parameters)
        seen["encodes"] += 1

    def latents_before(*a, **kw):
        # ([image, [timestep,]] batch, channels, height, width, ...): the output size after the
        # pipeline's own adjustments.
        hw = {"text": a[2:4], "kontext": a[3:5], "kontext-resize": a[3:5]}.get(kind, a[4:6])
        seen["height"], seen["width"] = int(hw[0]), int(hw[1])

    def latents_hook(out, *a, **kw):
        dump["latents_init"] = f32(out[0])
        if kind == "kontext":
            dump["condition_latents"] = f32(out[1])
        elif kind == "inpaint":
            dump["noise"], dump["image_latents"] = f32(out[1]), f32(out[2])

    def scale_noise_hook(out, sample, timestep, noise=None):
        # img2img's start: sigma * noise + (1 - sigma) * x0, both still unpacked.
        if "noise" not in dump:
            b, c, h, w = sample.shape
            dump["noise"] = f32(pipe._pack_latents(noise, b, c, h, w))
            dump["image_latents"] = f32(pipe._pack_latents(sample, b, c, h, w))

    def mask_hook(out, *a, **kw):
        dump["mask"] = f32(out[0])

    def timesteps_hook(out, *a, **kw):
        seen["mu"] = kw.get("mu")

    def transformer_hook(module, a, kw, out):
        # Only the output tokens' rows: the reference rows of the input are `condition_latents`
        # at every step, and the pipeline drops those rows of the output.
        i, n = step["i"], dump["latents_init"].shape[1]
        if f"step{i}.model_output" in dump:
            dump[f"step{i}.model_output_neg"] = f32(out[0][:, :n])
            return
        dump[f"step{i}.model_input"] = f32(kw["hidden_states"][:, :n])
        dump[f"step{i}.timestep"] = f32(kw["timestep"])
        if kw["guidance"] is not None:
            dump[f"step{i}.guidance"] = f32(kw["guidance"])
            seen["guidance_dtype"] = str(kw["guidance"].dtype).replace("torch.", "")
        dump[f"step{i}.model_output"] = f32(out[0][:, :n])
        dump.setdefault("img_ids", f32(kw["img_ids"]))  # integers, exact in f32 (bf16 in a bf16 run)

    def scheduler_hook(out, model_output, *a, **kw):
        i = step["i"]
        dump[f"step{i}.noise_pred"] = f32(model_output)
        dump[f"step{i}.latents" if kind != "inpaint" else f"step{i}.euler"] = f32(out[0])
        step["i"] += 1

    def unpack_hook(out, x, *a, **kw):
        dump["final_latents"] = f32(x)

    def decode_hook(out, z, *a, **kw):
        dump["vae_input"] = f32(z)
        dump["decoded"] = f32(out[0])

    hooks = [pipe.text_encoder.register_forward_pre_hook(ids_hook("clip_ids"), with_kwargs=True),
             pipe.text_encoder_2.register_forward_pre_hook(ids_hook("t5_ids"), with_kwargs=True),
             pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True)]
    wrap(pipe, "encode_prompt", prompt_hook)
    wrap(pipe.vae, "encode", encode_after, encode_before)
    wrap(pipe, "prepare_latents", latents_hook, latents_before)
    if kind == "img2img":
        wrap(pipe.scheduler, "scale_noise", scale_noise_hook)
    if kind == "inpaint":
        wrap(pipe, "prepare_mask_latents", mask_hook)
    wrap(pipe.scheduler, "set_timesteps", timesteps_hook)
    wrap(pipe.scheduler, "step", scheduler_hook)
    wrap(pipe, "_unpack_latents", unpack_hook)
    wrap(pipe.vae, "decode", decode_hook)

    call = {k: v for k, v in args.items() if k != "seed"}
    for key in ("image", "mask_image"):
        if key in call:
            call[key] = Image.open(input_path(call[key]))
    image = None
    try:
        with torch.no_grad():
            image = pipe(**call, generator=torch.Generator("cpu").manual_seed(args["seed"]),
                         output_type="pil").images[0]
    except _Stop:
        pass
    finally:
        for h in hooks:
            h.remove()
        for obj, name in undo:
            delattr(obj, name)

    n = step["i"]
    meta = dict(args, pipeline=type(pipe).__name__, dtype=str(pipe.transformer.dtype).replace("torch.", ""),
                steps_run=n, width_out=seen["width"], height_out=seen["height"],
                max_sequence_length=args.get("max_sequence_length", 512),
                clip_ids=unpadded(dump["clip_ids"], pipe.tokenizer.eos_token_id),
                t5_ids=unpadded(dump["t5_ids"], pipe.tokenizer_2.eos_token_id))
    if "negative_clip_ids" in dump:
        meta["negative_clip_ids"] = unpadded(dump["negative_clip_ids"], pipe.tokenizer.eos_token_id)
        meta["negative_t5_ids"] = unpadded(dump["negative_t5_ids"], pipe.tokenizer_2.eos_token_id)
    if kind == "kontext-resize":
        # Only what the pipeline prepared from the picture, as the 8-bit picture it was (exact:
        # the tensor is u8/255·2 − 1): a PNG beside the reference, which holds its size.
        x = dump["encode0.input"][0].permute(1, 2, 0)
        u8 = torch.round((x + 1) / 2 * 255).to(torch.uint8)
        assert torch.equal(2 * (u8.float() / 255) - 1, x)
        Image.fromarray(u8.numpy(), "RGB").save(os.path.join(REF_DIR, RESIZED_PNG), optimize=True)
        size = torch.tensor([x.shape[1], x.shape[0]], dtype=torch.int64)
        return {"size": size}, dict(meta, reference_width=x.shape[1], reference_height=x.shape[0],
                                    resized=RESIZED_PNG)
    if kind == "kontext":
        x = dump["encode0.input"]
        meta.update(reference_width=x.shape[3], reference_height=x.shape[2])
    if kind == "inpaint":
        # After each Euler step the pipeline blends in the picture outside the mask: the blended
        # latents are what the next step sees (and, after the last, what is decoded).
        for i in range(n):
            nxt = dump[f"step{i + 1}.model_input"] if i + 1 < n else dump["final_latents"]
            dump[f"step{i}.latents"] = nxt.clone()
    dump["sigmas"] = f32(pipe.scheduler.sigmas)
    dump["timesteps"] = f32(pipe.scheduler.timesteps)
    if seen.get("mu") is not None:
        dump["mu"] = torch.tensor(seen["mu"], dtype=torch.float32)
        meta["mu"] = seen["mu"]
    if "guidance_dtype" in seen:
        meta["guidance_dtype"] = seen["guidance_dtype"]
    dump["image"] = torch.from_numpy(np.array(image).astype(np.uint8))
    assert (image.width, image.height) == (seen["width"], seen["height"])
    return dump, meta


def pipeline_cases(names):
    for dtype, cases in ((torch.float32, {n: n for n in CASES}), (torch.bfloat16, BF16_CASES)):
        todo = [n for n in names if n in cases]
        if not todo:
            continue
        pipes = load_pipelines(dtype, sorted({CASES[cases[n]][1] for n in todo}))
        for name in todo:
            kind, model, call = CASES[cases[name]]
            pipe = pipes[(model, kind)]
            dump, meta = run_case(pipe, kind, call)
            if dtype == torch.bfloat16:
                # The same run with torch's other SDPA kernel: how far two faithful bf16
                # executions of diffusers land apart, the yardstick for a port's bf16 drift.
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel(SDPBackend.MATH):
                    alt, _ = run_case(pipe, kind, call)
                dump["math_sdpa.final_latents"] = alt["final_latents"]
            save(name, dump, dict(meta, case=name, model=os.path.basename(MODEL_DIRS[model])))


# The benchmarks' "big" model (benches/diffusers_compare.sh flux1); see the top of this file.
BIG_TRANSFORMER = dict(
    TRANSFORMER, in_channels=64, num_layers=2, num_single_layers=4, attention_head_dim=128,
    num_attention_heads=4, joint_attention_dim=1024, pooled_projection_dim=512, axes_dims_rope=(16, 56, 56),
)
BIG_CLIP = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=8,
                max_position_embeddings=77, projection_dim=512)
BIG_CLIP_VOCAB = 49408
BIG_T5 = dict(d_model=1024, d_kv=64, num_heads=16, d_ff=2816, num_layers=8, relative_attention_num_buckets=32,
              relative_attention_max_distance=128)
BIG_T5_VOCAB = 32128
BIG_VAE = dict(
    VAE, down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
    block_out_channels=[128, 256, 512, 512], layers_per_block=2, latent_channels=16, norm_num_groups=32,
    sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159,
)


def build_big_text(out_dir):
    """The big model's CLIP and T5 encoders, randomised and laid out as make_text_encoders_tiny.py
    writes the tiny ones, and the tiny tokenizers, the CLIP one with a 77-token window."""
    from safetensors.torch import load_file
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    sys.path.insert(0, HERE)
    import make_text_encoders_tiny as te

    gen = torch.Generator().manual_seed(SEED)
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=BIG_CLIP_VOCAB, **dict(te.CLIP, **BIG_CLIP))).eval()
    te.randomise(clip, gen)
    out = os.path.join(out_dir, "text_encoder")
    clip.to(torch.bfloat16).save_pretrained(out)
    # the FLUX.1 checkpoint names every tensor under `text_model.`; transformers 5 saves without it
    tensors = load_file(os.path.join(out, "model.safetensors"))
    tensors = {(k if k.startswith("text_model.") else "text_model." + k): v for k, v in tensors.items()}
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    t5 = T5EncoderModel(T5Config(vocab_size=BIG_T5_VOCAB, **dict(te.T5, **BIG_T5))).eval()
    te.randomise(t5, gen)
    t5.to(torch.bfloat16).save_pretrained(os.path.join(out_dir, "text_encoder_2"))
    for part in ("tokenizer", "tokenizer_2"):
        shutil.copytree(os.path.join(TEXT_DIR, part), os.path.join(out_dir, part))
    path = os.path.join(out_dir, "tokenizer", "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["model_max_length"] = BIG_CLIP["max_position_embeddings"]
    te.write_json(path, config)


def build_big(out_dir):
    """The benchmarks' big random FLUX.1 [dev] in diffusers layout under `out_dir`."""
    torch.manual_seed(SEED)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    build_big_text(out_dir)
    build_transformer(True, BIG_TRANSFORMER).to(torch.bfloat16).save_pretrained(os.path.join(out_dir, "transformer"))
    build_vae(BIG_VAE).to(torch.bfloat16).save_pretrained(os.path.join(out_dir, "vae"))
    os.makedirs(os.path.join(out_dir, "scheduler"))
    write_json(os.path.join(out_dir, "scheduler", "scheduler_config.json"), SCHEDULER_DEV)
    write_json(os.path.join(out_dir, "model_index.json"), model_index("FluxPipeline"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", metavar="DIR", help="only write the benchmarks' big model to DIR")
    ap.add_argument("--skip-model", action="store_true", help="keep the model directories as they are")
    every = list(CASES) + list(BF16_CASES) + ["transformer", "blocks-real"]
    ap.add_argument("--only", metavar="CASE", choices=every,
                    help="one reference: " + ", ".join(every) + " (`transformer`: the tiny transformer-level ones)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.big:
        build_big(args.big)
        return
    if not args.skip_model and not args.only:
        build_models()
    names = [args.only] if args.only else every
    pipeline_cases(names)
    if "transformer" in names:
        transformer_cases()
    if "blocks-real" in names:
        blocks_real()


if __name__ == "__main__":
    main()
