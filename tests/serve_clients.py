"""Drives a running `zimage serve` with the official `ollama` and `openai` clients.

Usage: serve_clients.py HOST MODEL OUT_DIR PICTURE RGBA_MASK. Writes the PNGs it receives into
OUT_DIR and prints one JSON object describing what the clients read. PICTURE goes to Ollama's
`images` (image to image) and to OpenAI's `images.edit` with RGBA_MASK (transparent repaints).
"""
import base64
import json
import sys

import ollama
import openai
import urllib.request

host, model, out, picture, rgba_mask = sys.argv[1:6]
report = {}

client = ollama.Client(host=host)
report["list"] = [m.model for m in client.list().models]
shown = client.show(model)
report["show_capabilities"] = list(shown.capabilities or [])
report["show_family"] = shown.details.family if shown.details else None

r = client.generate(model=model, prompt="a red fox in the snow", width=64, height=64, steps=2,
                    options={"seed": 7}, stream=False)
assert r.done and r.image, r
open(f"{out}/ollama.png", "wb").write(base64.b64decode(r.image))
report["total_duration"] = r.total_duration

progress = []
final = None
for part in client.generate(model=model, prompt="a red fox in the snow", width=64, height=64,
                            steps=2, options={"seed": 7}, stream=True):
    if part.done:
        final = part
    else:
        progress.append([part.completed, part.total])
assert final is not None and final.image
open(f"{out}/ollama-stream.png", "wb").write(base64.b64decode(final.image))
report["progress"] = progress

report["ps"] = [m.model for m in client.ps().models]

r = client.generate(model=model, prompt="a red fox in the snow", images=[picture], steps=2,
                    options={"seed": 7, "strength": 0.75}, stream=False)
assert r.done and r.image, r
open(f"{out}/ollama-img2img.png", "wb").write(base64.b64decode(r.image))

oa = openai.OpenAI(base_url=f"{host}/v1", api_key="unused")
img = oa.images.generate(model=model, prompt="a red fox in the snow", size="64x64",
                         response_format="b64_json", n=1,
                         extra_body={"seed": 7, "steps": 2})
open(f"{out}/openai.png", "wb").write(base64.b64decode(img.data[0].b64_json))
report["openai_models"] = [m.id for m in oa.models.list().data]

with open(picture, "rb") as image, open(rgba_mask, "rb") as mask:
    edited = oa.images.edit(model=model, image=image, mask=mask, prompt="a red fox in the snow",
                            response_format="b64_json",
                            extra_body={"seed": 7, "steps": 2, "strength": 0.7})
open(f"{out}/openai-edit.png", "wb").write(base64.b64decode(edited.data[0].b64_json))

try:
    with open(picture, "rb") as image:
        oa.images.edit(model=model, image=image, prompt="x", response_format="b64_json",
                       extra_body={"strength": 2})
    report["edit_strength"] = None
except openai.BadRequestError as e:
    report["edit_strength"] = [e.status_code, e.body.get("message") if isinstance(e.body, dict) else str(e.body)]

try:
    client.generate(model="no-such-model", prompt="x", width=64, height=64, steps=1)
    report["missing_model"] = None
except ollama.ResponseError as e:
    report["missing_model"] = [e.status_code, e.error]

# OpenAI's own model ids, and no model at all, mean the server's current model (here the only one).
for name, kwargs in [("openai-dall-e-2.png", {"model": "dall-e-2"}), ("openai-no-model.png", {})]:
    r = oa.images.generate(prompt="a red fox in the snow", size="64x64", response_format="b64_json",
                           extra_body={"seed": 7, "steps": 2}, **kwargs)
    open(f"{out}/{name}", "wb").write(base64.b64decode(r.data[0].b64_json))

# Answered by URL: the server keeps the PNG and serves it itself.
by_url = oa.images.generate(model=model, prompt="a red fox in the snow", size="64x64",
                            response_format="url", extra_body={"seed": 7, "steps": 2})
with urllib.request.urlopen(by_url.data[0].url) as answer:
    open(f"{out}/openai-url.png", "wb").write(answer.read())
report["url"] = by_url.data[0].url

# Several image[] files, as clients send them for newer models: the first is edited.
with open(picture, "rb") as first, open(rgba_mask, "rb") as second:
    several = oa.images.edit(model=model, image=[first, second], prompt="a red fox in the snow",
                             response_format="b64_json",
                             extra_body={"seed": 7, "steps": 2, "strength": 0.75})
open(f"{out}/openai-edit-several.png", "wb").write(base64.b64decode(several.data[0].b64_json))
report["several_note"] = (several.model_extra or {}).get("zimage_note")

print(json.dumps(report))
