"""Builds the tiny random FLUX.3 [klein] in diffusers' modular layout (models/flux3-klein-tiny,
step-distilled with a flow map, and models/flux3-klein-tiny-base, its own transformer without the
target-timestep embedder) and dumps what diffusers 0.42.1 computes with it
(models/reference/flux3-*.safetensors).

The tiny model keeps every architectural feature of FLUX.3 [klein] but differs from the real one
in every size its configs state, so that a port which hard-codes a real size fails:
- text encoder: Qwen3-VL (`Qwen3VLForConditionalGeneration`, weights under
  `model.language_model.*`, a one-block vision tower that is never run), text width 8,
  36 layers (so hidden states 4..32 are intermediate and 36 is normed, as with the real one),
  4 query / 2 key-value heads of 8, MRoPE sections [2, 1, 1], the full Qwen vocabulary;
- transformer: 2 heads of 32 (D 64), RoPE axes 4/12/8/8 (unequal, sum 32), θ 7000, 2 mode
  blocks per mode and 3 joint blocks, MLP ratio 2.5, a 128-wide timestep sinusoid, 64 input
  channels, joint_attention_dim 64 (= 8 stacked layers x 8);
- VAE: the FLUX.2 [klein] tiny VAE (models/flux2-klein-tiny/vae, the same bytes): 3 levels, so
  4x instead of 8x, 16 latent channels (BatchNorm over 64 token channels).
Weights that default init leaves at 0 or 1 are randomised and projections drawn with variance
1/fan_in; all weights are stored in bf16, and the references run in f32 (bf16 -> f32 is exact).

Every reference runs from the seed alone, in f32, through diffusers' own modular blocks (the
prompt upsampler removed), captured with hooks.

Requires torch 2.15, diffusers 0.42.1, transformers 5.23.0, safetensors, pillow, numpy.
From the repository root:

    python models/make_flux3_tiny.py               # models and all references
    python models/make_flux3_tiny.py --skip-model  # only the references
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_DIR = os.path.join(HERE, "flux3-klein-tiny")
BASE_DIR = os.path.join(HERE, "flux3-klein-tiny-base")
KLEIN_DIR = os.path.join(HERE, "flux2-klein-tiny")
ZIMAGE_DIR = os.path.join(HERE, "z-image-tiny")
REF_DIR = os.path.join(HERE, "reference")
SEED = 20261129

TEXT = dict(hidden=8, intermediate=24, layers=36, heads=4, kv_heads=2, head_dim=8)
TRANSFORMER = dict(
    in_channels=64, cond_in_channels=64, num_layers=2, num_single_layers=3, attention_head_dim=32,
    num_attention_heads=2, joint_attention_dim=8 * TEXT["hidden"], timestep_channels=128, mlp_ratio=2.5,
    axes_dims_rope=(4, 12, 8, 8), rope_theta=7000, eps=1e-6,
)

# The Qwen3-VL-Instruct chat template's text part: no default system message, string content
# inserted as is, and the assistant turn opened without a think block.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def randomise_(module, std=0.3):
    """Moves 1-D weights (from 1) and biases (from 0) away from their default init, and draws
    every matrix with variance 1/fan_in."""
    with torch.no_grad():
        for n, p in module.named_parameters():
            if p.ndim == 1:
                base = 1.0 if n.endswith("weight") else 0.0
                p.copy_(base + std * torch.randn_like(p))
            else:
                p.normal_(0.0, (1.0 / (p[0].numel())) ** 0.5)


def build_text_encoder(out_dir):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    cfg = Qwen3VLConfig(
        text_config=dict(
            vocab_size=151936, hidden_size=TEXT["hidden"], intermediate_size=TEXT["intermediate"],
            num_hidden_layers=TEXT["layers"], num_attention_heads=TEXT["heads"],
            num_key_value_heads=TEXT["kv_heads"], head_dim=TEXT["head_dim"], rms_norm_eps=1e-6,
            rope_theta=5000000.0, max_position_embeddings=262144, attention_bias=False, hidden_act="silu",
            rope_scaling={"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        ),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=TEXT["hidden"],
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0]),
        tie_word_embeddings=True,
    )
    model = Qwen3VLForConditionalGeneration(cfg)
    randomise_(model)
    with torch.no_grad():
        model.model.language_model.embed_tokens.weight.normal_(0.0, 1.0)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    gc = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)


def build_processor(out_dir):
    """The Qwen3-VL processor's files in their saved layout: Qwen's BPE tokenizer (as in the real
    repo; Z-Image's copy here, the same bytes), the Instruct chat template, and the image
    processor's config (never used: the vision tower does not run)."""
    shutil.copytree(os.path.join(ZIMAGE_DIR, "tokenizer"), out_dir)
    write_json(os.path.join(out_dir, "chat_template.json"), {"chat_template": CHAT_TEMPLATE})
    write_json(os.path.join(out_dir, "preprocessor_config.json"), {
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen3VLProcessor",
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})


class Processor:
    """What the text-encoder step asks of the Qwen3-VL processor (its chat template and its inner
    tokenizer), without the video processor, which needs torchvision."""

    def __init__(self, path):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        with open(os.path.join(path, "chat_template.json")) as f:
            self.tokenizer.chat_template = json.load(f)["chat_template"]

    def apply_chat_template(self, messages, **kw):
        return self.tokenizer.apply_chat_template(messages, **kw)


def build_transformer(flow_map):
    from diffusers import Flux3Transformer2DModel

    t = Flux3Transformer2DModel(**TRANSFORMER, flow_map=flow_map)
    randomise_(t)
    return t


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def blocks(model):
    from diffusers.modular_pipelines import Flux3AutoBlocks, Flux3DistilledAutoBlocks

    b = Flux3DistilledAutoBlocks() if model == "distilled" else Flux3AutoBlocks()
    # The upsampler rewrites the prompt with a 9B model; zimage encodes the prompt as given.
    b.sub_blocks.pop("prompt_upsampler")
    return b


def build_model():
    torch.manual_seed(SEED)
    for d in (MODEL_DIR, BASE_DIR):
        if os.path.exists(d):
            shutil.rmtree(d)
        os.makedirs(d)
    build_processor(os.path.join(MODEL_DIR, "tokenizer"))
    build_text_encoder(os.path.join(MODEL_DIR, "text_encoder"))
    build_transformer(True).to(torch.bfloat16).save_pretrained(os.path.join(MODEL_DIR, "transformer"))
    # The FLUX.2 [klein] tiny VAE, the same files.
    shutil.copytree(os.path.join(KLEIN_DIR, "vae"), os.path.join(MODEL_DIR, "vae"))
    # The base model: the same text encoder, tokenizer and VAE, its own transformer.
    for sub in ("tokenizer", "text_encoder", "vae"):
        shutil.copytree(os.path.join(MODEL_DIR, sub), os.path.join(BASE_DIR, sub))
    build_transformer(False).to(torch.bfloat16).save_pretrained(os.path.join(BASE_DIR, "transformer"))
    for model, d in (("distilled", MODEL_DIR), ("base", BASE_DIR)):
        write_index(d, model)


def write_index(d, model):
    """The modular pipeline's index of the `model` ("distilled" or "base") in `d`."""
    index = {
        "_class_name": "Flux3DistilledModularPipeline" if model == "distilled" else "Flux3ModularPipeline",
        "_blocks_class_name": "Flux3DistilledAutoBlocks" if model == "distilled" else "Flux3AutoBlocks",
        "_diffusers_version": "0.42.1",
    }
    for name, lib, cls in (("text_encoder", "transformers", "Qwen3VLForConditionalGeneration"),
                           ("tokenizer", "transformers", "AutoProcessor"),
                           ("transformer", "diffusers", "Flux3Transformer2DModel"),
                           ("vae", "diffusers", "AutoencoderKLFlux2")):
        index[name] = [lib, cls, {"pretrained_model_name_or_path": None, "subfolder": name,
                                  "type_hint": [lib, cls], "revision": None, "variant": None}]
    write_json(os.path.join(d, "modular_model_index.json"), index)


def load_pipeline(model, dtype=torch.float32):
    d = MODEL_DIR if model == "distilled" else BASE_DIR
    pipe = blocks(model).init_pipeline(d)
    pipe.load_components(names=["text_encoder", "transformer", "vae"], torch_dtype=dtype)
    pipe.update_components(tokenizer=Processor(os.path.join(d, "tokenizer")))
    return pipe


def f32(x):
    return x.detach().float().clone()


# name: model, call arguments (images relative to models/reference), seed.
CASES = {
    "t2i": ("distilled", dict(prompt="a red fox in the snow", width=72, height=56, num_inference_steps=3), 42),
    "base-cfg": ("base", dict(prompt="a lighthouse at dusk on a rocky shore, oil painting with thick strokes of "
                                     "orange and blue, gulls circling over the grey sea, a small fishing boat with "
                                     "a red sail heading home, waves breaking white against the dark rocks, the "
                                     "first stars above the clouds, warm light in the keeper's window, a dog asleep on the "
                                     "steps of the tower and a bicycle leaning on the white fence",
                              width=64, height=48,
                              num_inference_steps=4), 3),
    "edit1": ("distilled", dict(prompt="make it snowy", image=["klein-inputs/picture-100x75.png"],
                                num_inference_steps=3), 5),
    "edit2": ("distilled", dict(prompt="the fox from the first picture in the second",
                                image=["klein-inputs/picture-100x75.png", "inputs/picture-128x128.png"],
                                num_inference_steps=3), 7),
    # The distilled text-to-image case with every component loaded in bf16 (q/k norms stay f32).
    "t2i-bf16": ("distilled-bf16", dict(prompt="a red fox in the snow", width=72, height=56,
                                        num_inference_steps=3), 42),
}


def run_case(pipe, args, seed):
    dump = {}
    step = {"i": 0}

    def enc_hook(module, a, kw, out):
        n = sum(1 for k in dump if k.endswith("input_ids"))
        prefix = "" if n == 0 else "negative_"
        dump[prefix + "input_ids"] = kw["input_ids"].clone()
        dump[prefix + "attention_mask"] = kw["attention_mask"].clone()
        dump[prefix + "position_ids"] = kw["position_ids"].clone()

    def transformer_hook(module, a, kw, out):
        i = step["i"]
        if f"step{i}.model_output" in dump:
            # CFG's second call: the unconditional velocity.
            dump[f"step{i}.model_output_neg"] = f32(out[0])
            dump.setdefault("negative_prompt_embeds", f32(kw["encoder_hidden_states"]))
            dump.setdefault("negative_txt_ids", kw["txt_ids"].clone())
            step["pending"] = False
            return
        dump[f"step{i}.timestep"] = f32(kw["timestep"])
        if kw.get("target_timestep") is not None:
            dump[f"step{i}.target_timestep"] = f32(kw["target_timestep"])
        dump[f"step{i}.model_input"] = f32(kw["hidden_states"])
        dump[f"step{i}.model_output"] = f32(out[0])
        dump.setdefault("prompt_embeds", f32(kw["encoder_hidden_states"]))
        dump.setdefault("txt_ids", kw["txt_ids"].clone())
        dump.setdefault("img_ids", kw["img_ids"].clone())
        if kw.get("image_cond_hidden_states") is not None:
            dump.setdefault("image_cond_latents", f32(kw["image_cond_hidden_states"]))
            dump.setdefault("image_cond_ids", kw["image_cond_ids"].clone())

    def step_hook(module, a, kw, out):
        pass

    orig_step = pipe.scheduler.step

    def scheduler_step(model_output, timestep, sample, *a, **kw):
        out = orig_step(model_output, timestep, sample, *a, **kw)
        i = step["i"]
        dump[f"step{i}.noise_pred"] = f32(model_output)
        dump[f"step{i}.latents"] = f32(out[0])
        step["i"] += 1
        return out

    orig_decode = pipe.vae.decode

    def decode(z, *a, **kw):
        out = orig_decode(z, *a, **kw)
        dump["vae_input"] = f32(z)
        dump["decoded"] = f32(out[0] if isinstance(out, tuple) else out.sample)
        return out

    hooks = [pipe.text_encoder.register_forward_hook(enc_hook, with_kwargs=True),
             pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True)]
    pipe.scheduler.step = scheduler_step
    pipe.vae.decode = decode
    call = dict(args)
    if "image" in call:
        call["image"] = [Image.open(os.path.join(REF_DIR, p)).convert("RGB") for p in call["image"]]
        if len(call["image"]) == 1:
            call["image"] = call["image"][0]
    try:
        with torch.no_grad():
            out = pipe(**call, generator=torch.Generator("cpu").manual_seed(seed), output=["images", "latents"])
    finally:
        for h in hooks:
            h.remove()
        del pipe.scheduler.step
        del pipe.vae.decode
    image = out["images"][0]
    dump["final_latents"] = f32(out["latents"])
    dump["sigmas"] = f32(pipe.scheduler.sigmas)
    dump["timesteps"] = f32(pipe.scheduler.timesteps)
    dump["image"] = torch.from_numpy(np.array(image).astype(np.uint8))
    ids = dump["input_ids"][0][dump["attention_mask"][0].bool()]
    meta = dict(args, seed=seed, steps_run=step["i"], width_out=image.width, height_out=image.height,
                token_ids=ids.tolist(), window=int(dump["input_ids"].shape[1]),
                guidance=float(pipe.guider.guidance_scale) if getattr(pipe, "guider", None) is not None else None)
    return dump, meta


def save(name, dump, meta):
    path = os.path.join(REF_DIR, f"flux3-{name}.safetensors")
    save_file({k: v.contiguous() for k, v in dump.items()}, path, metadata={"case": json.dumps(meta)})
    print(f"reference flux3-{name}: {len(dump)} tensors, {os.path.getsize(path) / 1e3:.0f} kB", file=sys.stderr)


# FLUX.3 [klein]'s real transformer widths (the diffusers defaults), one block of each kind.
REAL_BLOCKS = dict(
    in_channels=128, cond_in_channels=128, num_layers=1, num_single_layers=1, attention_head_dim=128,
    num_attention_heads=24, joint_attention_dim=20480, timestep_channels=256, mlp_ratio=3.0,
    axes_dims_rope=(32, 32, 32, 32), rope_theta=10000, eps=1e-6, flow_map=True,
)
# fill()'s matrices leave the time embedding small; as for klein, the modulations are scaled up
# so that the blocks change the stream.
MODULATION_GAIN = 16.0


def blocks_real():
    """One mode block of each mode and one joint block at the real widths, with the top-level
    layers, on 6 image tokens (2 x 3), 4 reference tokens (2 x 2) and 5 text rows; weights from
    make_controlnet.py's name-keyed generator."""
    from diffusers import Flux3Transformer2DModel

    sys.path.insert(0, HERE)
    from make_controlnet import fill

    with torch.device("meta"):
        model = Flux3Transformer2DModel(**REAL_BLOCKS)
    state = {k: fill(k, tuple(v.shape)) * (MODULATION_GAIN if "modulation" in k or k.startswith("norm_out.") else 1.0)
             for k, v in model.state_dict().items()}
    model.load_state_dict(state, assign=True, strict=True)
    model.eval()
    g = torch.Generator().manual_seed(31)
    hidden = torch.randn(1, 6, 128, generator=g)
    refs = torch.randn(1, 4, 128, generator=g)
    text = torch.randn(1, 5, 20480, generator=g)
    img_ids = torch.tensor([[0, i * 0.5, j * 0.5, 0] for i in range(2) for j in range(3)])
    ref_ids = torch.tensor([[0, i * 0.5, j * 0.5, -1] for i in range(2) for j in range(2)])
    txt_ids = torch.tensor([[0, 0, 0, s] for s in range(5)], dtype=torch.float32)
    timestep, target = torch.tensor([0.75]), torch.tensor([0.5])
    dump = {"hidden_states": hidden, "image_cond_hidden_states": refs, "encoder_hidden_states": text}

    def hook(name):
        def h(module, a, out):
            out = out[0] if isinstance(out, tuple) else out
            dump[name] = f32(out)
        return h

    hooks = [model.txt_mode_blocks[0].register_forward_hook(hook("txt_mode0")),
             model.mode_blocks["image"][0].register_forward_hook(hook("image_mode0")),
             model.mode_blocks["image_cond"][0].register_forward_hook(hook("image_cond_mode0"))]
    with torch.no_grad():
        dump["output"] = f32(model(hidden_states=hidden, encoder_hidden_states=text, timestep=timestep,
                                   img_ids=img_ids, txt_ids=txt_ids, image_cond_hidden_states=refs,
                                   image_cond_ids=ref_ids, target_timestep=target, return_dict=False)[0])
    for h in hooks:
        h.remove()
    meta = {"config": dict(REAL_BLOCKS, axes_dims_rope=list(REAL_BLOCKS["axes_dims_rope"])),
            "weights": "make_controlnet.fill(name, shape), times 16 for names containing 'modulation' or "
                       "starting with 'norm_out.'", "timestep": 0.75, "target_timestep": 0.5, "seed": 31}
    save("blocks-real", dump, meta)


# The benchmarks' "big" model (benches/flux3_compare.sh): a transformer 512 wide (4 heads of 128,
# the real RoPE axes, θ and MLP ratio) with 1 mode block per mode and 4 joint blocks, Qwen3-VL's
# language model 256 wide with the real 36 layers (so that the eight stacked states are
# intermediate ones), and the real FLUX.2 VAE's sizes (128/256/512/512 channels, 32 latent
# channels), so that encoding and decoding cost what the real ones do.
BIG_TEXT = dict(hidden=256, intermediate=768, layers=36, heads=4, kv_heads=2, head_dim=64)
BIG_TRANSFORMER = dict(
    REAL_BLOCKS, num_layers=1, num_single_layers=4, num_attention_heads=4,
    joint_attention_dim=8 * BIG_TEXT["hidden"],
)


def build_big(out_dir):
    """The benchmarks' big random FLUX.3 [klein] (distilled) in the modular layout under
    `out_dir`; its VAE is the FLUX.2 [klein] benchmark model's (written by
    make_klein_tiny.py --big), copied."""
    global TEXT, TRANSFORMER
    TEXT, TRANSFORMER = BIG_TEXT, {k: v for k, v in BIG_TRANSFORMER.items() if k != "flow_map"}
    torch.manual_seed(SEED)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    build_processor(os.path.join(out_dir, "tokenizer"))
    build_text_encoder(os.path.join(out_dir, "text_encoder"))
    build_transformer(True).to(torch.bfloat16).save_pretrained(os.path.join(out_dir, "transformer"))
    sys.path.insert(0, HERE)
    import make_klein_tiny

    vae = dict(make_klein_tiny.BIG_VAE)
    make_klein_tiny.VAE = vae
    make_klein_tiny.build_vae().to(torch.bfloat16).save_pretrained(os.path.join(out_dir, "vae"))
    write_index(out_dir, "distilled")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", metavar="DIR", help="only write the benchmarks' big model to DIR")
    ap.add_argument("--skip-model", action="store_true", help="keep the model directories as they are")
    ap.add_argument("--only", metavar="CASE", choices=list(CASES) + ["blocks-real"])
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.big:
        build_big(args.big)
        return
    if not args.skip_model and not args.only:
        build_model()
    pipes = {}
    if args.only == "blocks-real":
        blocks_real()
        return
    for name in [args.only] if args.only else list(CASES):
        model, call, seed = CASES[name]
        if model not in pipes:
            base, _, bf16 = model.partition("-")
            pipes[model] = load_pipeline(base, torch.bfloat16 if bf16 else torch.float32)
        dump, meta = run_case(pipes[model], call, seed)
        model_dir = MODEL_DIR if model.startswith("distilled") else BASE_DIR
        save(name, dump, dict(meta, case=name, model=os.path.basename(model_dir)))
    if not args.only:
        blocks_real()


if __name__ == "__main__":
    main()
