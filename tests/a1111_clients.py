"""Drives a running `zimage serve` with `webuiapi`, an AUTOMATIC1111 client.

Usage: a1111_clients.py URL OUT_DIR PICTURE MASK OTHER_MODEL. Writes the PNGs it receives into
OUT_DIR and prints one JSON object describing what the client read: the listings, txt2img (a
batch of two), img2img with a mask, a switch to OTHER_MODEL through the options and back, and
progress read during a long run that is then interrupted.
"""
import json
import sys
import threading
import time

import webuiapi
from PIL import Image

url, out, picture, mask, other = sys.argv[1:6]
report = {}

api = webuiapi.WebUIApi(baseurl=f"{url}/sdapi/v1", sampler="Euler", scheduler="automatic",
                        steps=2)
report["models"] = api.util_get_model_names()
report["samplers"] = api.util_get_sampler_names()
report["schedulers"] = api.util_get_scheduler_names()
report["upscalers"] = [u["name"] for u in api.get_upscalers()]
report["current"] = api.util_get_current_model()


def infotexts_match(result):
    """Each image's `parameters` text equals the info's infotext for it."""
    return [img.info.get("parameters") == text
            for img, text in zip(result.images, result.info["infotexts"])]


r = api.txt2img(prompt="a red fox in the snow", seed=7, steps=2, cfg_scale=0, width=64,
                height=64, batch_size=2, n_iter=1)
for k, img in enumerate(r.images):
    img.save(f"{out}/txt2img-{k}.png")
report["txt2img"] = {k: r.info[k] for k in
                     ["seed", "all_seeds", "width", "height", "steps", "cfg_scale",
                      "sampler_name", "sd_model_name", "batch_size", "n_iter"]}
report["txt2img_infotexts"] = infotexts_match(r)
report["txt2img_parameters_prompt"] = r.parameters["prompt"]

r = api.img2img(images=[Image.open(picture)], mask_image=Image.open(mask), mask_blur=0,
                inpaint_full_res=False, inpainting_fill=1, denoising_strength=0.8,
                prompt="a red fox in the snow", seed=7, steps=2, cfg_scale=0, width=96,
                height=80)
r.image.save(f"{out}/img2img.png")
report["img2img"] = {k: r.info[k] for k in ["seed", "width", "height", "denoising_strength"]}
report["img2img_infotexts"] = infotexts_match(r)

options = api.get_options()
titles = [m["title"] for m in api.get_sd_models()]
other_title = next(t for t in titles if t.startswith(other + " "))
first_title = options["sd_model_checkpoint"]
options["sd_model_checkpoint"] = other_title
api.set_options(options)
report["switched"] = api.get_options()["sd_model_checkpoint"] == other_title
r = api.txt2img(prompt="a red fox in the snow", seed=7, steps=2, cfg_scale=0, width=64,
                height=64)
report["switched_model_name"] = r.info["sd_model_name"]
r.image.save(f"{out}/switched.png")
api.util_set_model(first_title, find_closest=False)
report["switched_back"] = api.get_options()["sd_model_checkpoint"] == first_title

# A long run, watched and interrupted.
outcome = {}


def long_run():
    try:
        api.txt2img(prompt="a red fox in the snow", seed=7, steps=1000, cfg_scale=0, width=64,
                    height=64, batch_size=2)
        outcome["error"] = None
    except RuntimeError as e:
        outcome["error"] = list(e.args)


runner = threading.Thread(target=long_run)
runner.start()
seen = None
deadline = time.time() + 120
while time.time() < deadline:
    p = api.get_progress()
    if p["progress"] > 0 and p["state"]["sampling_step"] > 0:
        seen = p
        break
    time.sleep(0.02)
report["progress"] = seen
report["interrupt"] = api.interrupt()
runner.join(120)
report["interrupted_status"] = outcome.get("error", ["still running"])[0]
report["interrupted_detail"] = json.loads(outcome["error"][1])["detail"] if outcome.get("error") else None
time.sleep(0.2)
report["idle_progress"] = api.get_progress()
print(json.dumps(report))
