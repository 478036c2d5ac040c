#!/usr/bin/env python3
"""The Python half of benches/gpu_compare.sh: diffusers' side of the runs, and turning what both
programs print into `key value` records and the records into the comparison table.

    gpu_compare.py diffusers MODEL_DIR [--size N] [--steps N] [--seed N] [--prompt P] [--out PNG] [--json FILE]
    gpu_compare.py diffusers-record RUN.json MODEL_DIR     # records of one diffusers run
    gpu_compare.py profile-rate PROFILE.json               # weights → GPU of `zimage profile --json`
    gpu_compare.py zimage-log LOG                          # warm step and decodes of `generate --runs 2 -v`
    gpu_compare.py psnr A.png B.png
    gpu_compare.py table RESULTS_DIR [--sizes 1024,2048]

Only `diffusers` and `psnr` need the venv (torch, diffusers, numpy, pillow); the rest is the
standard library, so that the table can be assembled anywhere.
"""
import argparse
import json
import os
import re
import sys
import time


def diffusers_run(a):
    """diffusers' ZImagePipeline in bf16 on the GPU: load, a first and a warm generation."""
    t0 = time.perf_counter()
    import torch
    from diffusers import ZImagePipeline

    t = time.perf_counter()
    pipe = ZImagePipeline.from_pretrained(a.model, torch_dtype=torch.bfloat16)
    if any(p.is_meta for p in pipe.vae.encoder.parameters()):
        # A decoder-only synthetic VAE: generation never encodes.
        pipe.vae.encoder = torch.nn.Identity()
    pipe.to("cuda")
    torch.cuda.synchronize()
    res = {"load_s": time.perf_counter() - t}
    marks = []

    def on_step(_pipe, _i, _t, kw):
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        return kw

    for run in ("first", "warm"):
        marks.clear()
        torch.cuda.synchronize()
        t = time.perf_counter()
        img = pipe(a.prompt, width=a.size, height=a.size, num_inference_steps=a.steps,
                   guidance_scale=0.0, generator=torch.Generator("cpu").manual_seed(a.seed),
                   callback_on_step_end=on_step).images[0]
        torch.cuda.synchronize()
        end = time.perf_counter()
        steps = sorted(b - x for x, b in zip(marks, marks[1:]))
        res[run] = {"total_s": end - t, "step_median_s": steps[len(steps) // 2] if steps else None,
                    "decode_s": end - marks[-1]}
        if run == "first":
            res["cold_process_to_first_image_s"] = end - t0
            if a.out:
                img.save(a.out)
    text = json.dumps(res, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    print(text)


def weight_bytes(model_dir):
    total = 0
    for dirpath, _, files in os.walk(model_dir):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files if f.endswith(".safetensors"))
    return total


def diffusers_record(run_json, model_dir):
    with open(run_json) as f:
        r = json.load(f)
    print(f"weights_gbps {weight_bytes(model_dir) / r['load_s'] / 1e9:.3f}")
    print(f"cold_s {r['cold_process_to_first_image_s']:.3f}")
    print(f"step_warm_s {r['warm']['step_median_s']:.4f}")
    print(f"decode_first_s {r['first']['decode_s']:.4f}")
    print(f"decode_warm_s {r['warm']['decode_s']:.4f}")


def profile_rate(path):
    with open(path) as f:
        p = json.load(f)
    nbytes = sum(c["bytes"] for c in p["components"])
    seconds = sum(c["materialise_seconds"] for c in p["components"])
    print(f"weights_gbps {nbytes / seconds / 1e9:.3f}")


def zimage_log(path):
    """`run 1 of 2:` and the last run's phases: step (the mean of the denoise phase) and decode."""
    runs = []
    with open(path) as f:
        for line in f:
            if re.match(r"run \d+ of \d+:", line):
                runs.append({})
                continue
            m = re.match(r"(\w+)\s+([0-9.]+) s", line)
            if m and runs:
                runs[-1][m.group(1)] = float(m.group(2))
    if len(runs) < 2 or "decode" not in runs[0] or "step" not in runs[-1]:
        sys.exit(f"{path}: no two runs' phases (expected `generate --runs 2 -v` output)")
    print(f"step_warm_s {runs[-1]['step']:.4f}")
    print(f"decode_first_s {runs[0]['decode']:.4f}")
    print(f"decode_warm_s {runs[-1]['decode']:.4f}")


def psnr(a_path, b_path):
    import numpy as np
    from PIL import Image

    a = np.asarray(Image.open(a_path).convert("RGB"), dtype=np.float64)
    b = np.asarray(Image.open(b_path).convert("RGB"), dtype=np.float64)
    if a.shape != b.shape:
        sys.exit(f"{a_path} is {a.shape}, {b_path} is {b.shape}")
    mse = ((a - b) ** 2).mean()
    print("inf" if mse == 0 else f"{10 * np.log10(255.0 ** 2 / mse):.2f}")


def read_record(path):
    """`key value` lines; a missing file is an empty record."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2:
                sys.exit(f"{path}:{n}: expected `key value`, got {line.strip()!r}")
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                sys.exit(f"{path}:{n}: `{parts[1]}` is not a number")
    return out


COLUMNS = [("zimage bf16", "zimage-bf16"), ("zimage int4", "zimage-int4"), ("diffusers bf16", "diffusers-bf16")]


def table(results, sizes):
    first = sizes[0]
    rec = {key: read_record(os.path.join(results, f"{key}.txt")) for _, key in COLUMNS}
    per_size = {(key, s): read_record(os.path.join(results, f"{key}.{s}.txt")) for _, key in COLUMNS for s in sizes}

    def cold(key):
        # diffusers times itself from interpreter start; zimage's is the whole process's wall.
        if "cold_s" in rec[key]:
            return rec[key]["cold_s"]
        ms = per_size[(key, first)].get("wall_ms")
        return None if ms is None else ms / 1e3

    def peak(s):
        return lambda key: (lambda m: None if m is None else m * 1.048576e-3)(per_size[(key, s)].get("gpu_peak_mib"))

    rows = [(f"cold process → PNG, {first}² (s)", cold)]
    for label, field in [("weights → GPU (GB/s)", "weights_gbps"), ("warm step (s)", "step_warm_s"),
                         ("VAE decode, first (s)", "decode_first_s"), ("VAE decode, warm (s)", "decode_warm_s")]:
        rows.append((label, lambda key, field=field: rec[key].get(field)))
    for s in sizes:
        rows.append((f"GPU peak, {s}² (GB)", peak(s)))
    rows.append(("PSNR vs diffusers (dB)", lambda key: rec[key].get("psnr_db")))

    def fmt(v):
        return "—" if v is None else f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"

    head = ["", *(c for c, _ in COLUMNS), "bf16 ÷ diffusers", "int4 ÷ diffusers"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, get in rows:
        vals = [get(key) for _, key in COLUMNS]
        ratio = [None if v is None or not vals[2] else v / vals[2] for v in vals[:2]]
        if label.startswith("PSNR"):
            ratio = [None, None]
        cells = [fmt(v) for v in vals] + [fmt(r) if r is None else f"{r:.2f}×" for r in ratio]
        print(f"| {label} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("diffusers")
    d.add_argument("model")
    d.add_argument("--size", type=int, default=1024)
    d.add_argument("--steps", type=int, default=8)
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--prompt", default="a red fox in the snow")
    d.add_argument("--out")
    d.add_argument("--json")
    r = sub.add_parser("diffusers-record")
    r.add_argument("run_json")
    r.add_argument("model")
    sub.add_parser("profile-rate").add_argument("path")
    sub.add_parser("zimage-log").add_argument("path")
    p = sub.add_parser("psnr")
    p.add_argument("a")
    p.add_argument("b")
    t = sub.add_parser("table")
    t.add_argument("results")
    t.add_argument("--sizes", default="1024,2048")
    a = ap.parse_args()
    if a.cmd == "diffusers":
        diffusers_run(a)
    elif a.cmd == "diffusers-record":
        diffusers_record(a.run_json, a.model)
    elif a.cmd == "profile-rate":
        profile_rate(a.path)
    elif a.cmd == "zimage-log":
        zimage_log(a.path)
    elif a.cmd == "psnr":
        psnr(a.a, a.b)
    else:
        table(a.results, [int(s) for s in a.sizes.split(",")])


if __name__ == "__main__":
    main()
