"""Makes one LoRA for the tiny FLUX.1 [dev] (models/flux1-dev-tiny) in three namings and dumps what
diffusers draws with each loaded, for the FLUX.1 LoRA parity tests.

The LoRA is rank 4 and targets exactly the layers XLabs' naming can express, so that all three
files hold the same update: in every double block the image and text q, k, v (`attn.to_q/to_k/
to_v`, `attn.add_q_proj/add_k_proj/add_v_proj`) and both attention outputs (`attn.to_out.0`,
`attn.to_add_out`); in every single block q, k, v (`attn.to_q/to_k/to_v`) and `proj_out`. Within
a block the three projections of one stream share their A (kohya's and XLabs' fused q|k|v pair has
one down matrix; diffusers' converters copy it to each of q, k, v and split the up matrix by rows)
and each has its own B.

- `flux1-lora-peft.safetensors`: the pairs put into a peft adapter on the tiny transformer
  (`lora_alpha` 4 = rank, so the scale is 1) and saved by `FluxPipeline.save_lora_weights` in the
  diffusers/peft layout (`transformer.<module>.lora_A.weight` / `lora_B.weight`) with its adapter
  metadata (where the alpha is). q, k and v each carry a copy of the shared A.
- `flux1-lora-kohya.safetensors`: kohya's (sd-scripts') names, `lora_down` / `lora_up` / `alpha`
  (alpha 4 = rank): `lora_unet_double_blocks_{i}_img_attn_qkv` and `_txt_attn_qkv` (down the
  shared A, up B_q, B_k, B_v stacked by rows), `_img_attn_proj`, `_txt_attn_proj`,
  `lora_unet_single_blocks_{i}_linear1` (it covers q, k, v and the MLP input: up is B_q, B_k, B_v
  and zero rows for the MLP part) and `_linear2` (`proj_out`).
- `flux1-lora-xlabs.safetensors`: XLabs' names, no alpha (scale 1):
  `double_blocks.{i}.processor.qkv_lora1` (image q|k|v), `qkv_lora2` (text q|k|v), `proj_lora1`
  (`to_out.0`), `proj_lora2` (`to_add_out`), `single_blocks.{i}.processor.qkv_lora` (q|k|v, up
  B_q, B_k, B_v only) and `proj_lora` (`proj_out`), each `.down.weight` / `.up.weight`.

diffusers 0.42.1's kohya converter splits `linear1`'s up matrix at the real model's widths
(3072, 3072, 3072, 12288, hard-coded) and so fails an assertion on any other width: the kohya
file is loaded through that same converter with those four numbers set to the tiny model's (72,
72, 72, 288), nothing else changed; the stock converter's failure is recorded in the metadata.

A and B are drawn from a fixed seed. A fresh f32 `FluxPipeline` loads each file with
`load_lora_weights` and runs make_flux1_tiny.py's `t2i-dev` case (same hooks); then
`fuse_lora` folds the LoRA in and the fused weights of the three namings are compared with each
other and with W + B·A. Written to models/reference/:

    flux1-lora-peft.safetensors, flux1-lora-kohya.safetensors, flux1-lora-xlabs.safetensors
                          the LoRA files (f32)
    flux1-lora.safetensors   with the peft file loaded: `image` [H, W, 3] (u8) and
                             `final_latents` [1, N, 32] (packed); the same with the kohya and
                             XLabs files as `kohya.image`, `kohya.final_latents`, `xlabs.image`,
                             `xlabs.final_latents`; in `__metadata__["case"]` the call as
                             make_flux1_tiny.py records `t2i-dev`'s, the LoRA's description, the
                             fraction of pixel values that differ from `flux1-t2i-dev`'s image,
                             and whether each other naming's picture is identical to the peft one

Requires what make_flux1_tiny.py requires, plus peft (0.21). From the repository root:

    python models/make_flux1_lora_reference.py
"""

import contextlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import traceback

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_flux1_tiny import CASES, DEV_DIR, REF_DIR, run_case  # noqa: E402

SEED = 20261201
RANK = 4
ALPHA = RANK
B_STD = 0.1
CASE = "t2i-dev"
QKV = {"img": ("attn.to_q", "attn.to_k", "attn.to_v"),
       "txt": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")}
PEFT_TARGETS = (r"^(transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj"
                r"|to_out\.0|to_add_out)"
                r"|single_transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v)|proj_out))$")
# What diffusers 0.42.1's kohya converter splits `linear1`'s up matrix into.
REAL_LINEAR1 = "dims=[3072, 3072, 3072, 12288]"


def draw_a(generator, shape):
    # A row of A reads the input at about unit gain.
    return torch.randn(shape, generator=generator) * 0.5 / shape[1] ** 0.5


def draw_b(generator, shape):
    return torch.randn(shape, generator=generator) * B_STD


def sizes():
    """(double blocks, single blocks, width D, MLP width M) of the tiny transformer."""
    cfg = json.load(open(os.path.join(DEV_DIR, "transformer", "config.json")))
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    return cfg["num_layers"], cfg["num_single_layers"], d, 4 * d  # diffusers' mlp_ratio is 4


def draw_pairs():
    """{diffusers module: (A, B)}, the q, k and v of one stream of one block sharing A."""
    n_double, n_single, d, m = sizes()
    generator = torch.Generator("cpu").manual_seed(SEED)
    pairs = {}

    def qkv(prefix, names):
        a = draw_a(generator, (RANK, d))
        for name in names:
            pairs[f"{prefix}.{name}"] = (a, draw_b(generator, (d, RANK)))

    def one(name, inp):
        pairs[name] = (draw_a(generator, (RANK, inp)), draw_b(generator, (d, RANK)))

    for i in range(n_double):
        p = f"transformer_blocks.{i}"
        qkv(p, QKV["img"])
        qkv(p, QKV["txt"])
        one(f"{p}.attn.to_out.0", d)
        one(f"{p}.attn.to_add_out", d)
    for i in range(n_single):
        p = f"single_transformer_blocks.{i}"
        qkv(p, QKV["img"])
        one(f"{p}.proj_out", d + m)
    return pairs


def make_peft(pairs, path):
    """The pairs in a peft adapter on the tiny transformer, saved as diffusers saves trained
    LoRAs. Returns the number of pairs."""
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    transformer = FluxTransformer2DModel.from_pretrained(os.path.join(DEV_DIR, "transformer"),
                                                         torch_dtype=torch.float32)
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=PEFT_TARGETS, init_lora_weights=True)
    transformer.add_adapter(config)
    targets = {n[:-len(".lora_A")] for n, _ in transformer.named_modules() if n.endswith(".lora_A")}
    assert targets == set(pairs), sorted(targets ^ set(pairs))
    with torch.no_grad():
        for name, (a, b) in pairs.items():
            module = transformer.get_submodule(name)
            module.lora_A["default"].weight.copy_(a)
            module.lora_B["default"].weight.copy_(b)
    layers = get_peft_model_state_dict(transformer)
    metadata = transformer.peft_config["default"].to_dict()
    FluxPipeline.save_lora_weights(os.path.dirname(path), transformer_lora_layers=layers,
                                   weight_name=os.path.basename(path),
                                   transformer_lora_adapter_metadata=metadata)
    return len(layers) // 2


def fused_qkv(pairs, prefix, names, extra_rows=0):
    """The shared A and B_q, B_k, B_v stacked by rows (then `extra_rows` zero rows)."""
    a = pairs[f"{prefix}.{names[0]}"][0]
    assert all(pairs[f"{prefix}.{n}"][0] is a for n in names)
    bs = [pairs[f"{prefix}.{n}"][1] for n in names] + [torch.zeros(extra_rows, RANK)]
    return a, torch.cat(bs)


def make_kohya(pairs, path):
    """kohya's names, alpha = rank. Returns the number of pairs."""
    n_double, n_single, d, m = sizes()
    modules = {}
    for i in range(n_double):
        p, k = f"transformer_blocks.{i}", f"lora_unet_double_blocks_{i}"
        modules[f"{k}_img_attn_qkv"] = fused_qkv(pairs, p, QKV["img"])
        modules[f"{k}_txt_attn_qkv"] = fused_qkv(pairs, p, QKV["txt"])
        modules[f"{k}_img_attn_proj"] = pairs[f"{p}.attn.to_out.0"]
        modules[f"{k}_txt_attn_proj"] = pairs[f"{p}.attn.to_add_out"]
    for i in range(n_single):
        p, k = f"single_transformer_blocks.{i}", f"lora_unet_single_blocks_{i}"
        modules[f"{k}_linear1"] = fused_qkv(pairs, p, QKV["img"], extra_rows=m)
        modules[f"{k}_linear2"] = pairs[f"{p}.proj_out"]
    tensors = {}
    for k, (a, b) in modules.items():
        tensors[f"{k}.lora_down.weight"] = a.contiguous()
        tensors[f"{k}.lora_up.weight"] = b.contiguous()
        tensors[f"{k}.alpha"] = torch.tensor(float(ALPHA))
    save_file(tensors, path)
    return len(modules)


def make_xlabs(pairs, path):
    """XLabs' names, no alpha. Returns the number of pairs."""
    n_double, n_single, _, _ = sizes()
    modules = {}
    for i in range(n_double):
        p, k = f"transformer_blocks.{i}", f"double_blocks.{i}.processor"
        modules[f"{k}.qkv_lora1"] = fused_qkv(pairs, p, QKV["img"])
        modules[f"{k}.qkv_lora2"] = fused_qkv(pairs, p, QKV["txt"])
        modules[f"{k}.proj_lora1"] = pairs[f"{p}.attn.to_out.0"]
        modules[f"{k}.proj_lora2"] = pairs[f"{p}.attn.to_add_out"]
    for i in range(n_single):
        p, k = f"single_transformer_blocks.{i}", f"single_blocks.{i}.processor"
        modules[f"{k}.qkv_lora"] = fused_qkv(pairs, p, QKV["img"])
        modules[f"{k}.proj_lora"] = pairs[f"{p}.proj_out"]
    tensors = {}
    for k, (a, b) in modules.items():
        tensors[f"{k}.down.weight"] = a.contiguous()
        tensors[f"{k}.up.weight"] = b.contiguous()
    save_file(tensors, path)
    return len(modules)


@contextlib.contextmanager
def kohya_converter_at_tiny_widths():
    """diffusers' own kohya FLUX.1 converter with `linear1`'s split set to the tiny widths."""
    from diffusers.loaders import lora_conversion_utils as conv
    from diffusers.loaders import lora_pipeline

    _, _, d, m = sizes()
    name = "_convert_kohya_flux_lora_to_diffusers"
    source = inspect.getsource(getattr(conv, name))
    assert source.count(REAL_LINEAR1) == 1
    scope = {}
    exec(compile(source.replace(REAL_LINEAR1, f"dims=[{d}, {d}, {d}, {m}]"), conv.__file__, "exec"),
         conv.__dict__, scope)
    original = getattr(lora_pipeline, name)
    setattr(lora_pipeline, name, scope[name])
    try:
        yield
    finally:
        setattr(lora_pipeline, name, original)


def stock_kohya_failure(path):
    """What diffusers 0.42.1's own converter makes of the kohya file: None if it converts."""
    from diffusers import FluxPipeline

    try:
        FluxPipeline.lora_state_dict(path)
    except Exception as e:  # noqa: BLE001 (recorded, not handled)
        return f"{type(e).__name__} at `{traceback.extract_tb(e.__traceback__)[-1].line}` {e}".strip()
    return None


def draw(kind, path, pairs):
    """The case with the LoRA loaded by a fresh f32 pipeline, and the LoRA targets' weights after
    `fuse_lora`, with their largest distance from W + B·A."""
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(DEV_DIR, dtype=torch.float32)
    base = {n: pipe.transformer.get_submodule(n).weight.detach().clone() for n in pairs}
    with kohya_converter_at_tiny_widths() if kind == "kohya" else contextlib.nullcontext():
        pipe.load_lora_weights(path)
    loaded = {n[:-len(".lora_A")] for n, _ in pipe.transformer.named_modules() if n.endswith(".lora_A")}
    # kohya's linear1 also reaches proj_mlp, with a zero B.
    extra = loaded - set(pairs)
    assert set(pairs) <= loaded and all(kind == "kohya" and n.endswith(".proj_mlp") for n in extra), (kind, extra)
    for n in extra:
        assert not pipe.transformer.get_submodule(n).lora_B["default_0"].weight.any()
    _, _, call = CASES[CASE]
    dump, meta = run_case(pipe, "text", call)
    pipe.fuse_lora()
    fused = {n: pipe.transformer.get_submodule(n).base_layer.weight.detach().clone() for n in pairs}
    off = max((fused[n] - (base[n] + b @ a)).abs().max().item() for n, (a, b) in pairs.items())
    return dump["image"], dump["final_latents"], meta, fused, off, sorted(extra)


def main():
    torch.set_num_threads(2)
    os.makedirs(REF_DIR, exist_ok=True)
    pairs = draw_pairs()
    names = {kind: f"flux1-lora-{kind}.safetensors" for kind in ("peft", "kohya", "xlabs")}
    counts, runs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        written = {kind: os.path.join(tmp, name) for kind, name in names.items()}
        counts["peft"] = make_peft(pairs, written["peft"])
        counts["kohya"] = make_kohya(pairs, written["kohya"])
        counts["xlabs"] = make_xlabs(pairs, written["xlabs"])
        stock = stock_kohya_failure(written["kohya"])
        for kind in names:
            runs[kind] = draw(kind, written[kind], pairs)
        for kind in names:
            shutil.move(written[kind], os.path.join(REF_DIR, names[kind]))

    image, latents, meta, fused, off, _ = runs["peft"]
    base = load_file(os.path.join(REF_DIR, f"flux1-{CASE}.safetensors"))["image"]
    d, m = sizes()[2:]
    linear1 = f"[{d}, {d}, {d}, {m}]"
    changed = (image != base).float().mean().item()
    print(f"peft: {counts['peft']} pairs, {changed:.1%} of values changed from flux1-{CASE}, "
          f"fused weights {off:.2g} from W + B·A", file=sys.stderr)
    dump = {"image": image, "final_latents": latents}
    lora = dict(rank=RANK, lora_seed=SEED, b_std=B_STD, lora_scale=1.0, peft_alpha=ALPHA, kohya_alpha=ALPHA,
                peft=names["peft"], kohya=names["kohya"], xlabs=names["xlabs"], pairs=counts,
                base=f"flux1-{CASE}.safetensors", changed_from_base=changed, fused_max_abs_from_w_plus_ba=off,
                kohya_stock_converter=stock or "converts",
                kohya_converter=(f"diffusers 0.42.1's with linear1 split at {linear1} instead of {REAL_LINEAR1[5:]}"
                                 if stock else "diffusers 0.42.1's"))
    for kind in ("kohya", "xlabs"):
        other, other_latents, _, other_fused, other_off, extra = runs[kind]
        dump[f"{kind}.image"], dump[f"{kind}.final_latents"] = other, other_latents
        pixel = (other.int() - image.int()).abs().max().item()
        weights = max((other_fused[n] - fused[n]).abs().max().item() for n in pairs)
        lat = (other_latents - latents).abs().max().item()
        lora.update({f"{kind}_identical": bool(torch.equal(other, image)), f"{kind}_max_pixel_diff": pixel,
                     f"{kind}_final_latents_max_abs_diff": lat, f"{kind}_fused_max_abs_diff": weights,
                     f"{kind}_fused_max_abs_from_w_plus_ba": other_off, f"{kind}_extra_targets": extra})
        print(f"{kind}: {counts[kind]} pairs, picture {'identical to' if pixel == 0 else 'differs from'} peft's "
              f"(max {pixel}), final latents {lat:.2g}, fused weights {weights:.2g} apart, "
              f"{other_off:.2g} from W + B·A", file=sys.stderr)
    if stock:
        print(f"kohya, diffusers' stock converter: {stock}", file=sys.stderr)
    meta = dict(meta, case="lora", model=os.path.basename(DEV_DIR), lora=lora)
    path = os.path.join(REF_DIR, "flux1-lora.safetensors")
    save_file({k: v.contiguous() for k, v in dump.items()}, path, metadata={"case": json.dumps(meta)})
    print(f"reference flux1-lora: {len(dump)} tensors, {os.path.getsize(path) / 1e3:.0f} kB", file=sys.stderr)


if __name__ == "__main__":
    main()
