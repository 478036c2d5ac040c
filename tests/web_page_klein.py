"""Drives the web page of a running `zimage serve` in Chromium with a FLUX.2 [klein] model: the
form offers the family's own options, a reference picture is added and removed, and a job
edits from it.

Usage: web_page_klein.py BASE_URL OUT_DIR REFERENCE_PNG. The server holds the Z-Image model
`tiny` and the klein model `klein`. The script writes OUT_DIR/summary.json (what it saw, the
gallery file of the image it made and the body the page posted) and a screenshot, and exits
non-zero at the first check that fails, saying which. CHROMIUM names the browser.
"""
import os
import sys

from playwright.sync_api import sync_playwright

import chromium
from chromium import check, finish, png_size

GENERATION_MS = 60_000
PROMPT = "make it snowy"
SEED = "5"

base, out_dir, reference = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
summary = {}


def family_options(page):
    """Which of the family-dependent parts of the form show."""
    return {
        part: page.is_visible(f"#{part}")
        for part in ["reference-section", "control-section", "picture-section"]
    } | {
        # Inside a closed section: hidden by the family or not.
        part: page.evaluate(f"() => !document.getElementById('{part}').hidden")
        for part in ["cfg-normalization-row", "cfg-truncation-row", "hires-rows"]
    }


def choose(page, model):
    page.select_option("#model", model)


def main():
    os.makedirs(out_dir, exist_ok=True)
    with sync_playwright() as p:
        browser = chromium.launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(30_000)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        posted = []
        page.on("request", lambda r: posted.append(r.post_data_json)
                if r.method == "POST" and r.url.endswith("/ui/api/jobs") else None)
        try:
            page.goto(f"{base}/ui")
            page.wait_for_selector("#model option[value='flux3']", state="attached")
            page.wait_for_function("() => /^Ready/.test(document.getElementById('status').textContent)")

            choose(page, "tiny")
            zimage = family_options(page)
            summary["z_image_form"] = zimage
            check(zimage == {"reference-section": False, "control-section": True, "picture-section": True,
                             "cfg-normalization-row": True, "cfg-truncation-row": True, "hires-rows": True},
                  f"for Z-Image the form should hide the references alone: {zimage}")

            choose(page, "klein")
            klein = family_options(page)
            summary["klein_form"] = klein
            check(klein == {"reference-section": True, "control-section": False, "picture-section": True,
                            "cfg-normalization-row": False, "cfg-truncation-row": False, "hires-rows": True},
                  f"for klein the form should offer references, no ControlNet or CFG options: {klein}")

            choose(page, "flux3")
            flux3 = family_options(page)
            summary["flux3_form"] = flux3
            check(flux3 == {"reference-section": True, "control-section": False, "picture-section": False,
                            "cfg-normalization-row": False, "cfg-truncation-row": False, "hires-rows": False},
                  f"for FLUX.3 the form should offer references alone, no picture or hires pass: {flux3}")
            choose(page, "klein")

            page.click("#reference-section > summary")
            # Two references added, the second removed: one is left.
            for count in (1, 2):
                page.set_input_files("#reference-add", reference)
                page.wait_for_function(f"() => document.querySelectorAll('#references li').length === {count}")
            page.click("#references li:nth-child(2) .reference-remove")
            page.wait_for_function("() => document.querySelectorAll('#references li').length === 1")
            size = png_size(reference)
            shown = (int(page.input_value("#width")), int(page.input_value("#height")))
            check(shown == size, f"the form should take the reference's size {size}, shows {shown}")

            page.fill("#prompt", PROMPT)
            page.set_checked("#random-seed", False)
            page.fill("#seed", SEED)
            page.click("#generate")
            page.wait_for_selector("#results img", timeout=GENERATION_MS)
            page.wait_for_function("() => /^done in/.test(document.getElementById('status').textContent)",
                                   timeout=GENERATION_MS)
            body = posted[-1]
            summary["posted"] = {k: (v if k != "references" else len(v)) for k, v in body.items()}
            check(len(body.get("references", [])) == 1, f"the job should carry one reference: {summary['posted']}")
            check("width" not in body and "height" not in body,
                  f"the job should leave the size to the reference: {summary['posted']}")
            check(not any(k.startswith(("cfg_", "control")) for k in body),
                  f"the job should carry no option klein lacks: {summary['posted']}")
            newest = page.request.get(f"{base}/ui/api/gallery").json()["images"][0]
            check((newest["width"], newest["height"]) == size,
                  f"the edit should have the reference's size {size}: {newest['width']}x{newest['height']}")
            summary["klein_file"] = newest["file"]
            page.screenshot(path=os.path.join(out_dir, "klein.png"), full_page=True)

            # Back on Z-Image the references stay out of the form and out of the job.
            choose(page, "tiny")
            check(not page.is_visible("#reference-section"), "Z-Image should hide the references again")
            check(not errors, f"the page threw: {errors}")
        except Exception as error:
            summary["failed"] = f"{type(error).__name__}: {error}"
            try:
                page.screenshot(path=os.path.join(out_dir, "failure.png"), full_page=True)
                summary["status_at_failure"] = page.locator("#status").text_content()
            except Exception:
                pass
        finally:
            browser.close()
    finish(summary, out_dir, "klein page")


if __name__ == "__main__":
    main()
