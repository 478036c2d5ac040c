"""Builds the tiny random FLUX.2 [klein] in diffusers layout (models/flux2-klein-tiny, distilled,
and models/flux2-klein-tiny-base, the same weights marked as a base model) and dumps what
diffusers 0.42.1 computes with it (models/reference/klein-*.safetensors).

The tiny model keeps every architectural feature of klein but differs from the real one in every
size its configs state, so that a port which hard-codes a real size fails:
- text encoder: Qwen3, hidden 16, 28 layers (so hidden state 27 is an intermediate layer, as with
  the real 36), 4 query / 2 key-value heads of 8, the full Qwen vocabulary with the token
  embedding of models/z-image-tiny (the same bytes, so the repository stores them once);
- transformer: 2 heads of 64 (D 128), RoPE axes 8/24/16/16 (unequal, sum 64), 2 double-stream
  and 3 single-stream blocks, MLP ratio 2.5, a 128-wide timestep sinusoid, 64 input channels,
  joint_attention_dim 48 (= 3 x 16);
- VAE: 3 levels (so 4x instead of 8x, and image sides are multiples of 8 instead of 16),
  channels 16/32/32, one resnet per encoder level, 8 groups, 16 latent channels (BatchNorm over
  64 token channels).
Weights that default init leaves at 0 or 1 (norm weights, biases, the BatchNorm statistics) are
randomised and projections are drawn with variance 1/fan_in; all weights are stored in bf16 like
the real checkpoints, and the references run in f32 (bf16 -> f32 is exact).

Every reference runs from the seed alone, in f32 (two cases also in bf16), captured with hooks
(the pipeline is not modified). Also `klein-blocks-real`: one double-stream and one single-stream
block at klein 4B's real widths, weights from make_controlnet.py's name-keyed generator.

Requires torch 2.15, diffusers 0.42.1, transformers 5.23.0, safetensors, pillow, numpy.
From the repository root:

    python models/make_klein_tiny.py               # model, inputs and all references
    python models/make_klein_tiny.py --skip-model  # only the inputs and references
    python models/make_klein_tiny.py --only t2i    # one reference case (or `blocks-real`)
    python models/make_klein_tiny.py --big DIR     # the benchmarks' big model, in DIR
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from make_controlnet import fill  # noqa: E402

MODEL_DIR = os.path.join(HERE, "flux2-klein-tiny")
BASE_DIR = os.path.join(HERE, "flux2-klein-tiny-base")
ZIMAGE_DIR = os.path.join(HERE, "z-image-tiny")
REF_DIR = os.path.join(HERE, "reference")
KLEIN_INPUT_DIR = os.path.join(REF_DIR, "klein-inputs")
SEED = 20261127

TEXT = dict(hidden=16, intermediate=40, layers=28, heads=4, kv_heads=2, head_dim=8)
TRANSFORMER = dict(
    patch_size=1, in_channels=64, out_channels=None, num_layers=2, num_single_layers=3,
    attention_head_dim=64, num_attention_heads=2, joint_attention_dim=3 * TEXT["hidden"],
    timestep_guidance_channels=128, mlp_ratio=2.5, axes_dims_rope=(8, 24, 16, 16), rope_theta=2000,
    eps=1e-6, guidance_embeds=False,
)
VAE = dict(
    in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 3,
    up_block_types=["UpDecoderBlock2D"] * 3, block_out_channels=[16, 32, 32], layers_per_block=1,
    act_fn="silu", latent_channels=16, norm_num_groups=8, sample_size=256, use_quant_conv=True,
    use_post_quant_conv=True, mid_block_add_attention=True, batch_norm_eps=1e-4, batch_norm_momentum=0.1,
    patch_size=[2, 2],
)
# klein 4B's real transformer widths, one block of each kind.
REAL_BLOCKS = dict(
    patch_size=1, in_channels=128, out_channels=None, num_layers=1, num_single_layers=1,
    attention_head_dim=128, num_attention_heads=24, joint_attention_dim=7680,
    timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32), rope_theta=2000,
    eps=1e-6, guidance_embeds=False,
)
SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.42.1",
             "num_train_timesteps": 1000, "use_dynamic_shifting": True, "shift": 3.0,
             "time_shift_type": "exponential"}


def randomise_(module, std=0.3):
    """Moves 1-D weights (from 1) and biases (from 0) away from their default init, and draws
    every matrix and convolution kernel with variance 1/fan_in."""
    with torch.no_grad():
        for n, p in module.named_parameters():
            if p.ndim == 1:
                base = 1.0 if n.endswith("weight") else 0.0
                p.copy_(base + std * torch.randn_like(p))
            else:
                p.normal_(0.0, (1.0 / (p[0].numel())) ** 0.5)


def build_text_encoder(out_dir):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=151936, hidden_size=TEXT["hidden"], intermediate_size=TEXT["intermediate"],
        num_hidden_layers=TEXT["layers"], num_attention_heads=TEXT["heads"],
        num_key_value_heads=TEXT["kv_heads"], head_dim=TEXT["head_dim"], rms_norm_eps=1e-6,
        rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=True,
        attention_bias=False, hidden_act="silu", torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(cfg)
    randomise_(model)
    # The Z-Image demo's token embedding (N(0, 1), same vocabulary and width): the first shard
    # holds only this tensor, so both models share that file's bytes.
    zimage = load_file(os.path.join(ZIMAGE_DIR, "text_encoder", "model-00001-of-00002.safetensors"))
    embedding = zimage["model.embed_tokens.weight"]
    if embedding.shape == model.model.embed_tokens.weight.shape:
        with torch.no_grad():
            model.model.embed_tokens.weight.copy_(embedding.float())
    model = model.to(torch.bfloat16)
    model.save_pretrained(out_dir, max_shard_size="3MB", safe_serialization=True)
    gc = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)


def build_transformer():
    from diffusers import Flux2Transformer2DModel

    t = Flux2Transformer2DModel(**TRANSFORMER)
    randomise_(t)
    return t


def build_vae():
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(**VAE)
    randomise_(vae)
    with torch.no_grad():
        vae.bn.running_mean.normal_(0.0, 0.5)
        vae.bn.running_var.uniform_(0.2, 2.2)
    return vae


def model_index(distilled):
    return {
        "_class_name": "Flux2KleinPipeline", "_diffusers_version": "0.42.1", "is_distilled": distilled,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"], "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"], "vae": ["diffusers", "AutoencoderKLFlux2"],
    }


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def build_model():
    torch.manual_seed(SEED)
    for d in (MODEL_DIR, BASE_DIR):
        if os.path.exists(d):
            shutil.rmtree(d)
    os.makedirs(MODEL_DIR)
    # klein uses Qwen3's tokenizer and chat template, as Z-Image does (with enable_thinking=False).
    shutil.copytree(os.path.join(ZIMAGE_DIR, "tokenizer"), os.path.join(MODEL_DIR, "tokenizer"))
    build_text_encoder(os.path.join(MODEL_DIR, "text_encoder"))
    build_transformer().to(torch.bfloat16).save_pretrained(os.path.join(MODEL_DIR, "transformer"))
    build_vae().to(torch.bfloat16).save_pretrained(os.path.join(MODEL_DIR, "vae"))
    # The real config carries `force_upcast`, which this class no longer takes (nor do the
    # klein pipelines read it); keep it so the file looks like the real one.
    vae_config = os.path.join(MODEL_DIR, "vae", "config.json")
    with open(vae_config) as f:
        config = json.load(f)
    write_json(vae_config, dict(config, force_upcast=True))
    os.makedirs(os.path.join(MODEL_DIR, "scheduler"))
    write_json(os.path.join(MODEL_DIR, "scheduler", "scheduler_config.json"), SCHEDULER)
    write_json(os.path.join(MODEL_DIR, "model_index.json"), model_index(True))
    # The base model: the same files (git stores identical files once), not distilled.
    shutil.copytree(MODEL_DIR, BASE_DIR)
    write_json(os.path.join(BASE_DIR, "model_index.json"), model_index(False))


def write_inputs():
    """A picture whose sides are not multiples of 8 (references are centre-cropped, inpaint
    images resized) and a mask for it with a ramp of greys across the binarisation threshold."""
    os.makedirs(KLEIN_INPUT_DIR, exist_ok=True)
    w, h = 100, 75
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255.0 * (0.5 + 0.5 * np.cos(x / 7.0 + y / 11.0))
    g = 255.0 * y / (h - 1)
    b = 255.0 * (0.5 + 0.5 * np.sin((x - y) / 5.0))
    rgb = np.stack([r, g, b], axis=-1)
    rgb[(np.abs(x - 0.3 * w) < 12) & (np.abs(y - 0.55 * h) < 9)] = [20.0, 30.0, 220.0]
    Image.fromarray(np.clip(np.rint(rgb), 0, 255).astype(np.uint8), "RGB").save(
        os.path.join(KLEIN_INPUT_DIR, f"picture-{w}x{h}.png"))
    ramp = np.clip((0.7 * w - x) / (0.25 * w), 0.0, 1.0) * 255.0
    mask = np.where((y > 0.15 * h) & (y < 0.8 * h), ramp, 0.0)
    Image.fromarray(np.rint(mask).astype(np.uint8), "L").save(os.path.join(KLEIN_INPUT_DIR, f"mask-{w}x{h}.png"))
    # A rectangle whose edges fall inside token cells (8 pixels here): the left and right edges
    # split their cells' centre pixels, the top edge misses its cell's centre.
    w, h = 96, 80
    rect = np.zeros((h, w), np.uint8)
    rect[21:52, 12:60] = 255
    Image.fromarray(rect, "L").save(os.path.join(KLEIN_INPUT_DIR, f"mask-rect-{w}x{h}.png"))
    # The same kind of rectangle on the 100x75 picture, which is resized to 96x72: the edges
    # land inside cells only after the resize, so they binarise as Pillow's LANCZOS leaves them.
    w, h = 100, 75
    rect = np.zeros((h, w), np.uint8)
    rect[21:54, 12:62] = 255
    Image.fromarray(rect, "L").save(os.path.join(KLEIN_INPUT_DIR, f"mask-rect-{w}x{h}.png"))


def input_path(name):
    """`name` as recorded in a case: relative to models/reference."""
    return os.path.join(REF_DIR, name)


# name: kind (text / inpaint), model (distilled / base), call arguments. Images are paths
# relative to models/reference; every run is f32 (or bf16, BF16_CASES) with a CPU generator
# seeded with `seed`.
CASES = {
    "t2i": ("text", "distilled", dict(prompt="a red fox in the snow", width=88, height=56,
                                      num_inference_steps=4, guidance_scale=1.0, seed=42)),
    "base-cfg": ("text", "base", dict(prompt="a lighthouse at dusk, oil painting", width=64, height=80,
                                      num_inference_steps=6, guidance_scale=4.0, seed=3)),
    "edit1": ("text", "distilled", dict(prompt="make it snowy", image=["inputs/picture-96x80.png"],
                                        num_inference_steps=4, guidance_scale=1.0, seed=5)),
    "edit2": ("text", "distilled", dict(prompt="the fox from the first picture in the second",
                                        image=["klein-inputs/picture-100x75.png", "inputs/picture-128x128.png"],
                                        width=80, height=64, num_inference_steps=4, guidance_scale=1.0, seed=7)),
    "inpaint": ("inpaint", "distilled", dict(prompt="a red fox in the snow", image="klein-inputs/picture-100x75.png",
                                             mask_image="klein-inputs/mask-100x75.png", strength=0.8,
                                             num_inference_steps=6, guidance_scale=1.0, seed=11)),
    "inpaint-offgrid": ("inpaint", "distilled", dict(prompt="a red fox in the snow", image="inputs/picture-96x80.png",
                                                     mask_image="klein-inputs/mask-rect-96x80.png", strength=1.0,
                                                     num_inference_steps=4, guidance_scale=1.0, seed=13)),
    "inpaint-resized": ("inpaint", "distilled", dict(prompt="a red fox in the snow", image="klein-inputs/picture-100x75.png",
                                                     mask_image="klein-inputs/mask-rect-100x75.png", strength=0.8,
                                                     num_inference_steps=6, guidance_scale=1.0, seed=11)),
    "inpaint-ref-cfg": ("inpaint", "base", dict(prompt="a cat on a sofa", image="inputs/picture-96x80.png",
                                                mask_image="inputs/mask-96x80.png",
                                                image_reference="inputs/picture-128x128.png", strength=0.6,
                                                num_inference_steps=5, guidance_scale=3.5, seed=19)),
}


# Cases also run with every component in bf16, as the real checkpoints run: name -> f32 case.
BF16_CASES = {"t2i-bf16": "t2i", "edit1-bf16": "edit1"}


def load_pipelines(dtype):
    from diffusers import Flux2KleinInpaintPipeline, Flux2KleinPipeline

    pipes = {}
    for model, path in (("distilled", MODEL_DIR), ("base", BASE_DIR)):
        text = Flux2KleinPipeline.from_pretrained(path, dtype=dtype)
        assert text.config.is_distilled == (model == "distilled")
        inpaint = Flux2KleinInpaintPipeline(**text.components, is_distilled=text.config.is_distilled)
        pipes[(model, "text")] = text
        pipes[(model, "inpaint")] = inpaint
    return pipes


def f32(x):
    return x.detach().float().clone()


def run_case(pipe, kind, args):
    """One hooked run. Returns the dump and the request as recorded in the file."""
    dump = {}
    undo = []
    step = {"i": 0}

    def wrap(obj, name, after):
        orig = getattr(obj, name)

        def wrapper(*a, **kw):
            out = orig(*a, **kw)
            after(out, *a, **kw)
            return out

        setattr(obj, name, wrapper)
        undo.append((obj, name))

    def enc_hook(module, a, kw, out):
        prefix = "" if "input_ids" not in dump else "negative_"
        dump[prefix + "input_ids"] = kw["input_ids"].clone()
        dump[prefix + "attention_mask"] = kw["attention_mask"].clone()

    def prompt_hook(out, *a, **kw):
        prefix = "" if "prompt_embeds" not in dump else "negative_"
        dump[prefix + "prompt_embeds"] = f32(out[0])
        dump[prefix + "text_ids"] = out[1].clone()

    def encode_hook(out, x, *a, **kw):
        n = sum(1 for k in dump if k.endswith(".moments"))
        dump[f"encode{n}.input"] = f32(x)
        dump[f"encode{n}.moments"] = f32(out.latent_dist.parameters)

    def latents_hook(out, *a, **kw):
        if kind == "text":
            dump["latents_init"], dump["latent_ids"] = f32(out[0]), out[1].clone()
        else:
            dump["latents_init"], dump["noise"], dump["image_latents"] = f32(out[0]), f32(out[1]), f32(out[2])
            dump["latent_ids"] = out[4].clone()

    def image_latents_hook(out, *a, **kw):
        dump["condition_latents"], dump["condition_ids"] = f32(out[0]), out[1].clone()

    def mask_hook(out, *a, **kw):
        dump["mask"] = f32(out)

    def transformer_hook(module, a, kw, out):
        # Only the output tokens' rows: the reference rows of the input are `condition_latents`
        # at every step, and the pipeline drops those rows of the output.
        i, n = step["i"], dump["latents_init"].shape[1]
        if f"step{i}.model_output" in dump:
            dump[f"step{i}.model_output_neg"] = f32(out[0][:, :n])
            return
        dump[f"step{i}.timestep"] = f32(kw["timestep"])
        dump[f"step{i}.model_input"] = f32(kw["hidden_states"][:, :n])
        dump[f"step{i}.model_output"] = f32(out[0][:, :n])
        dump.setdefault("img_ids", kw["img_ids"].clone())

    def scheduler_hook(out, model_output, *a, **kw):
        i = step["i"]
        dump[f"step{i}.noise_pred"] = f32(model_output)
        dump[f"step{i}.latents" if kind == "text" else f"step{i}.euler"] = f32(out[0])
        step["i"] += 1

    def unpack_hook(out, x, *a, **kw):
        dump["final_latents"] = f32(x)

    def decode_hook(out, z, *a, **kw):
        dump["vae_input"] = f32(z)
        dump["decoded"] = f32(out[0])

    def sinusoid_hook(module, a, out):
        dump.setdefault(f"step{step['i']}.sinusoid", f32(out))

    hooks = [pipe.text_encoder.register_forward_hook(enc_hook, with_kwargs=True),
             pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True),
             pipe.transformer.time_guidance_embed.time_proj.register_forward_hook(sinusoid_hook)]
    wrap(pipe, "encode_prompt", prompt_hook)
    wrap(pipe.vae, "encode", encode_hook)
    wrap(pipe, "prepare_latents", latents_hook)
    wrap(pipe, "prepare_image_latents", image_latents_hook)
    if kind == "inpaint":
        wrap(pipe, "prepare_mask_latents", mask_hook)
    wrap(pipe.scheduler, "step", scheduler_hook)
    wrap(pipe, "_unpack_latents_with_ids", unpack_hook)
    wrap(pipe.vae, "decode", decode_hook)

    call = {k: v for k, v in args.items() if k != "seed"}
    for key in ("image", "mask_image", "image_reference"):
        if key in call:
            paths = call[key]
            call[key] = ([Image.open(input_path(p)) for p in paths] if isinstance(paths, list)
                         else Image.open(input_path(paths)))
    try:
        with torch.no_grad():
            image = pipe(**call, generator=torch.Generator("cpu").manual_seed(args["seed"]),
                         output_type="pil").images[0]
    finally:
        for h in hooks:
            h.remove()
        for obj, name in undo:
            delattr(obj, name)

    n = step["i"]
    if kind == "inpaint":
        # After each Euler step the pipeline blends in the picture outside the mask: the blended
        # latents are what the next step sees (and, after the last, what is decoded).
        for i in range(n):
            nxt = dump[f"step{i + 1}.model_input"] if i + 1 < n else dump["final_latents"]
            dump[f"step{i}.latents"] = nxt.clone()
    dump["sigmas"] = f32(pipe.scheduler.sigmas)
    dump["timesteps"] = f32(pipe.scheduler.timesteps)
    dump["image"] = torch.from_numpy(np.array(image).astype(np.uint8))
    ids = dump["input_ids"][0][dump["attention_mask"][0].bool()]
    dump["token_ids"] = ids.clone()
    dtype = str(pipe.transformer.dtype).replace("torch.", "")
    meta = dict(args, pipeline=type(pipe).__name__, is_distilled=bool(pipe.config.is_distilled), dtype=dtype,
                steps_run=n, width_out=image.width, height_out=image.height, token_ids=ids.tolist())
    return dump, meta


def save(name, dump, meta):
    path = os.path.join(REF_DIR, f"klein-{name}.safetensors")
    save_file({k: v.contiguous() for k, v in dump.items()}, path, metadata={"case": json.dumps(meta)})
    print(f"reference klein-{name}: {len(dump)} tensors, {os.path.getsize(path) / 1e3:.0f} kB", file=sys.stderr)


# fill()'s matrices have std 1/sqrt(3 fan_in), which leaves the time embedding so small that the
# modulation (gates included) would be about 0.04 and the blocks would barely change the stream.
MODULATION_GAIN = 16.0


def is_modulation(name):
    return "modulation" in name or name.startswith("norm_out.")


def blocks_real():
    """klein 4B's first double-stream and single-stream blocks with the top-level layers, at the
    real widths, on 6 image tokens (a 2 x 3 grid) and 5 text tokens."""
    from diffusers import Flux2Transformer2DModel

    with torch.device("meta"):
        model = Flux2Transformer2DModel(**REAL_BLOCKS)
    state = {k: fill(k, tuple(v.shape)) * (MODULATION_GAIN if is_modulation(k) else 1.0)
             for k, v in model.state_dict().items()}
    model.load_state_dict(state, assign=True, strict=True)
    model.eval()
    g = torch.Generator().manual_seed(31)
    hidden = torch.randn(1, 6, 128, generator=g)
    text = torch.randn(1, 5, 7680, generator=g)
    timestep = torch.tensor([0.75])
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(2), torch.arange(3), torch.arange(1))[None]
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(5))[None]
    dump = {"hidden_states": hidden, "encoder_hidden_states": text, "timestep": timestep,
            "img_ids": img_ids, "txt_ids": txt_ids}

    def block_hook(name):
        def hook(module, a, kw, out):
            if isinstance(out, tuple):
                dump[f"{name}.encoder_hidden_states"], dump[f"{name}.hidden_states"] = f32(out[0]), f32(out[1])
            else:
                dump[f"{name}.hidden_states"] = f32(out)
        return hook

    def embed_hook(name):
        def hook(module, a, out):
            dump[name] = f32(out)
        return hook

    hooks = [model.transformer_blocks[0].register_forward_hook(block_hook("double0"), with_kwargs=True),
             model.single_transformer_blocks[0].register_forward_hook(block_hook("single0"), with_kwargs=True),
             model.time_guidance_embed.time_proj.register_forward_hook(embed_hook("sinusoid")),
             model.time_guidance_embed.register_forward_hook(embed_hook("temb"))]
    with torch.no_grad():
        dump["output"] = f32(model(hidden_states=hidden, encoder_hidden_states=text, timestep=timestep,
                                   img_ids=img_ids, txt_ids=txt_ids, guidance=None, return_dict=False)[0])
    for h in hooks:
        h.remove()
    meta = {"config": dict(REAL_BLOCKS, axes_dims_rope=list(REAL_BLOCKS["axes_dims_rope"])),
            "weights": "make_controlnet.fill(name, shape), times 16 for names containing 'modulation' or "
                       "starting with 'norm_out.'", "timestep": 0.75, "seed": 31}
    save("blocks-real", dump, meta)


# The "big" model of the benchmarks (benches/diffusers_compare.sh klein): a transformer 512 wide (4 heads
# of 128, real RoPE axes) with 2 double- and 4 single-stream blocks, a 28-layer text encoder 256
# wide, and the real FLUX.2 VAE's sizes (128/256/512/512 channels, 32 latent channels), so that
# the decode costs what the real one does.
BIG_TEXT = dict(hidden=256, intermediate=768, layers=28, heads=4, kv_heads=2, head_dim=64)
BIG_TRANSFORMER = dict(
    REAL_BLOCKS, num_layers=2, num_single_layers=4, num_attention_heads=4,
    joint_attention_dim=3 * BIG_TEXT["hidden"],
)
BIG_VAE = dict(
    VAE, down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
    block_out_channels=[128, 256, 512, 512], layers_per_block=2, latent_channels=32,
    norm_num_groups=32, sample_size=1024,
)


def build_big(out_dir):
    """The benchmarks' big random klein in diffusers layout under `out_dir`."""
    global TEXT, TRANSFORMER, VAE
    TEXT, TRANSFORMER, VAE = BIG_TEXT, BIG_TRANSFORMER, BIG_VAE
    torch.manual_seed(SEED)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    shutil.copytree(os.path.join(ZIMAGE_DIR, "tokenizer"), os.path.join(out_dir, "tokenizer"))
    build_text_encoder(os.path.join(out_dir, "text_encoder"))
    build_transformer().to(torch.bfloat16).save_pretrained(os.path.join(out_dir, "transformer"))
    build_vae().to(torch.bfloat16).save_pretrained(os.path.join(out_dir, "vae"))
    os.makedirs(os.path.join(out_dir, "scheduler"))
    write_json(os.path.join(out_dir, "scheduler", "scheduler_config.json"), SCHEDULER)
    write_json(os.path.join(out_dir, "model_index.json"), model_index(True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-model", action="store_true", help="keep the model directories as they are")
    ap.add_argument("--big", metavar="DIR", help="only write the benchmarks' big model to DIR")
    every = list(CASES) + list(BF16_CASES) + ["blocks-real"]
    ap.add_argument("--only", metavar="CASE", choices=every, help="one case: " + ", ".join(every))
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.big:
        build_big(args.big)
        return
    if not args.skip_model and not args.only:
        build_model()
    write_inputs()
    names = [args.only] if args.only else every
    for dtype, cases in ((torch.float32, {n: n for n in CASES}), (torch.bfloat16, BF16_CASES)):
        todo = [n for n in names if n in cases]
        pipes = load_pipelines(dtype) if todo else None
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
            model_dir = MODEL_DIR if model == "distilled" else BASE_DIR
            save(name, dump, dict(meta, case=name, model=os.path.basename(model_dir)))
    if "blocks-real" in names:
        blocks_real()


if __name__ == "__main__":
    main()
