"""Drives the web page of a running `zimage serve` in Chromium, the way a person would.

Usage: web_page.py BASE_URL OUT_DIR PICTURE_PNG. The server holds the model `tiny` and a LoRA
folder with `style.safetensors`. The script writes screenshots and OUT_DIR/summary.json (what
it saw, and the gallery files of the images it made), and exits non-zero at the first check
that fails, saying which. CHROMIUM names the browser (default /usr/bin/chromium).
"""
import os
import re
import sys

from playwright.sync_api import sync_playwright

import chromium
from chromium import check, finish, png_size

GENERATION_MS = 60_000
PROMPT = "a red fox in snow"
SEED = "7"

base, out_dir, picture = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
summary = {}


def gallery(page):
    response = page.request.get(f"{base}/ui/api/gallery")
    check(response.ok, f"GET /ui/api/gallery answered {response.status}: {response.text()}")
    return response.json()["images"]


def wait_for_status(page, pattern, timeout=GENERATION_MS):
    """Waits until #status matches the regular expression `pattern` (case-insensitive)."""
    page.wait_for_function(
        "(pattern) => new RegExp(pattern, 'i').test(document.getElementById('status').textContent)",
        arg=pattern,
        timeout=timeout,
    )


def status_text(page):
    return page.locator("#status").text_content()


def watch_progress(page):
    """Records every text #status shows and every value #progress takes, however brief: the
    tiny model may finish between two polls from here."""
    page.evaluate(
        """() => {
          window.seenStatus = [];
          window.seenFractions = [];
          const status = document.getElementById('status');
          const bar = document.getElementById('progress');
          new MutationObserver(() => window.seenStatus.push(status.textContent))
            .observe(status, {childList: true, characterData: true, subtree: true});
          new MutationObserver(() => {
            if (bar.hasAttribute('value')) window.seenFractions.push(bar.value);
          }).observe(bar, {attributes: true});
        }"""
    )


def seen_progress(page):
    return page.evaluate("() => ({status: window.seenStatus, fractions: window.seenFractions})")


def wait_for_result(page):
    page.wait_for_selector("#results img", timeout=GENERATION_MS)
    wait_for_status(page, r"^done in")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#results img')].every(i => i.complete && i.naturalWidth > 0)",
        timeout=GENERATION_MS,
    )


def center_pixel(page):
    return page.evaluate(
        """() => {
          const c = document.getElementById('mask-canvas');
          return [...c.getContext('2d').getImageData(c.width >> 1, c.height >> 1, 1, 1).data];
        }"""
    )


def next_frame(page):
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def open_page(page):
    """a. A browser asking for / lands on the page, which loads the models."""
    page.goto(f"{base}/")
    check(page.url.rstrip("/").endswith("/ui"), f"GET / as a browser should lead to /ui, got {page.url}")
    page.wait_for_selector("#model option[value='tiny']", state="attached", timeout=30_000)
    wait_for_status(page, r"^Ready", timeout=30_000)


def text_to_image(page, info):
    """b. A prompt and a fixed seed, generated from the keyboard, with its progress shown."""
    model = next(m for m in info["models"] if m["short"] == "tiny")
    page.fill("#prompt", PROMPT)
    page.set_checked("#random-seed", False)
    page.fill("#seed", SEED)
    check(not page.is_checked("#random-seed"), "#random-seed should stay unchecked after typing a seed")
    size = (page.input_value("#width"), page.input_value("#height"))
    check(size == (str(model["width"]), str(model["height"])),
          f"the form should start at the model's size {model['width']}x{model['height']}, shows {size}")
    check(page.input_value("#steps") == str(model["steps"]),
          f"#steps should be the model's {model['steps']}, is {page.input_value('#steps')}")
    check(page.is_hidden("#negative-row"), "#negative-row should be hidden while guidance is 0")
    before = {e["file"] for e in gallery(page)}

    watch_progress(page)
    page.press("#prompt", "Control+Enter")
    wait_for_result(page)
    seen = seen_progress(page)
    steps_seen = [t for t in seen["status"] if re.search(r"step \d+ of \d+", t)]
    fractions = [f for f in seen["fractions"] if 0 < f < 1]
    states_seen = [t for t in seen["status"] if re.search(r"queued|running|sending", t)]
    summary["progress_status_seen"] = seen["status"]
    summary["progress_fractions_seen"] = seen["fractions"]
    check(steps_seen or fractions or states_seen,
          f"no progress was shown while the job ran; #status showed {seen['status']}")

    check(page.get_attribute("#results img", "alt") == PROMPT, "the result's alt text should be its prompt")
    check(page.input_value("#seed") == SEED, f"#seed should still be {SEED}, is {page.input_value('#seed')}")
    newest = gallery(page)[0]
    check(newest["file"] not in before, "the gallery's newest entry should be the new image")
    settings = newest["settings"]
    check(settings["prompt"] == PROMPT and str(settings["seed"]) == SEED,
          f"the new image should record prompt {PROMPT!r} and seed {SEED}: {settings}")
    summary["txt2img_file"] = newest["file"]
    summary["txt2img_status"] = status_text(page)


def reuse_settings(page):
    """c. After a reload the gallery shows the image, and "Reuse settings" brings its form back."""
    page.reload()
    wait_for_status(page, r"^Ready", timeout=30_000)
    item = page.locator(f"#gallery .gallery-item[data-file='{summary['txt2img_file']}']")
    item.wait_for(timeout=30_000)
    page.wait_for_function(
        "(file) => { const i = document.querySelector(`.gallery-item[data-file='${file}'] img`);"
        " return i && i.complete && i.naturalWidth > 0; }",
        arg=summary["txt2img_file"],
        timeout=30_000,
    )
    page.fill("#prompt", "something else entirely")
    page.fill("#seed", "12345")
    page.set_checked("#random-seed", True)
    item.locator(".reuse").click()
    check(page.input_value("#prompt") == PROMPT,
          f"reuse should bring back the prompt, #prompt is {page.input_value('#prompt')!r}")
    check(page.input_value("#seed") == SEED, f"reuse should bring back seed {SEED}, #seed is {page.input_value('#seed')}")
    check(not page.is_checked("#random-seed"), "reuse should uncheck #random-seed")
    # The image had no hires pass and the model's guidance options: so the form says.
    check(page.input_value("#hires-scale") == "1", "reuse should turn the hires pass off")
    check(page.input_value("#cfg-truncation") == "1", "reuse should keep guidance throughout")
    check(page.input_value("#count") == "1", "reuse should set #count to 1")


def keyboard_reaches_generate(page):
    """g. From the top of the page, Tab alone reaches Generate, and shows where the focus is."""
    page.evaluate(
        """() => {
          const top = document.querySelector('h1');
          top.setAttribute('tabindex', '-1');
          top.focus();
          top.removeAttribute('tabindex');
        }"""
    )
    path = []
    for _ in range(60):
        page.keyboard.press("Tab")
        focused = page.evaluate("() => document.activeElement.id || document.activeElement.tagName")
        path.append(focused)
        if focused == "generate":
            break
    summary["tab_path"] = path
    check(path and path[-1] == "generate", f"Tab never reached #generate; focus went {path}")
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
    check(outline not in ("none", ""), "the focused #generate should show a focus outline")


def inpaint(page):
    """d. A picture, a painted mask, strength 0.8: an inpaint."""
    if not page.evaluate("() => document.getElementById('picture-section').open"):
        page.click("#picture-section > summary")
    page.set_input_files("#picture", picture)
    page.wait_for_selector("#mask-canvas", state="visible")
    page.wait_for_function(
        "(size) => { const c = document.getElementById('mask-canvas');"
        " return c.width === size[0] && c.height === size[1]; }",
        arg=list(png_size(picture)),
    )
    page.fill("#strength", "0.8")
    next_frame(page)
    unpainted = center_pixel(page)

    canvas = page.locator("#mask-canvas")
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.2, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=8)
    page.mouse.move(box["x"] + box["width"] * 0.8, y, steps=8)
    page.mouse.up()
    next_frame(page)
    painted = center_pixel(page)
    check(painted != unpainted, f"painting should show the mask on #mask-canvas ({unpainted} stayed)")

    page.click("#mask-invert")
    next_frame(page)
    check(center_pixel(page) == unpainted, "inverting the mask should unmask the painted stroke")
    page.click("#mask-invert")
    next_frame(page)
    check(center_pixel(page) == painted, "inverting twice should give back the painted mask")

    # Only the masked area, made at full size and pasted back.
    page.check("#only-masked")

    before = gallery(page)[0]["file"]
    page.click("#generate")
    wait_for_result(page)
    newest = gallery(page)[0]
    check(newest["file"] != before, "the inpaint should add a gallery entry")
    settings = newest["settings"]
    check(settings.get("strength") == 0.8, f"the inpaint should record strength 0.8: {settings}")
    check(settings.get("only_masked") == 32, f"the inpaint should record the only-masked padding: {settings}")
    if "inpaint" in settings:
        check(settings["inpaint"] is True, f"the painted mask should make it an inpaint: {settings}")
    check((newest["width"], newest["height"]) == png_size(picture),
          f"the inpaint should keep the picture's size {png_size(picture)}: {newest['width']}x{newest['height']}")
    summary["inpaint_file"] = newest["file"]


def cancel(page):
    """e. A long job, cancelled with Escape while it runs, leaves no image behind."""
    page.click("#picture-clear")
    page.fill("#steps", "400")
    page.fill("#count", "3")
    page.set_checked("#random-seed", True)
    before = [e["file"] for e in gallery(page)]
    page.click("#generate")
    page.wait_for_function(
        "() => !document.getElementById('cancel').disabled"
        " && /queued|running|step|image \\d+ of/i.test(document.getElementById('status').textContent)",
        timeout=GENERATION_MS,
    )
    summary["cancel_running_status"] = status_text(page)
    # The running step's picture shows while the job runs, and goes when it ends.
    page.wait_for_function(
        "() => { const p = document.getElementById('preview');"
        " return !p.hidden && p.src.startsWith('data:image/png') && p.complete && p.naturalWidth > 0; }",
        timeout=GENERATION_MS,
    )
    summary["cancel_preview_size"] = page.evaluate(
        "() => [document.getElementById('preview').naturalWidth, document.getElementById('preview').naturalHeight]"
    )
    page.keyboard.press("Escape")
    wait_for_status(page, r"cancel")
    page.wait_for_function(
        "() => document.getElementById('cancel').disabled && !document.getElementById('generate').disabled"
    )
    check(page.is_hidden("#preview"), "the running step's picture should go when the job ends")
    summary["cancel_status"] = status_text(page)
    after = [e["file"] for e in gallery(page)]
    check(after == before, f"a cancelled job should add no image; the gallery gained {set(after) - set(before)}")


def phone(browser):
    """f. At phone width the page is one column that never scrolls sideways."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{base}/ui")
    wait_for_status(page, r"^Ready", timeout=30_000)
    page.wait_for_selector("#gallery .gallery-item img", timeout=30_000)
    page.click("#picture-section > summary")
    page.set_input_files("#picture", picture)
    page.wait_for_selector("#mask-canvas", state="visible")
    next_frame(page)
    widths = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    summary["phone_scroll_width"] = widths
    check(widths[0] <= widths[1] + 1, f"the page scrolls sideways at phone width: {widths[0]} > {widths[1]}")
    columns = page.evaluate(
        "() => { const f = document.getElementById('job-form').getBoundingClientRect();"
        " const o = document.getElementById('output').getBoundingClientRect();"
        " return o.top >= f.bottom - 1; }"
    )
    check(columns, "at phone width the results should come below the form")
    page.screenshot(path=os.path.join(out_dir, "phone.png"), full_page=True)
    check(not errors, f"the page threw at phone width: {errors}")
    context.close()


def main():
    os.makedirs(out_dir, exist_ok=True)
    with sync_playwright() as p:
        browser = chromium.launch(p)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(30_000)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        # The page must work with what the server sends; nothing may leave for elsewhere.
        foreign = []
        page.on("request", lambda r: None if r.url.startswith(base) or r.url.startswith(("data:", "blob:"))
                else foreign.append(r.url))
        try:
            info_response = page.request.get(f"{base}/ui/api/info")
            check(info_response.ok, f"GET /ui/api/info answered {info_response.status}")
            info = info_response.json()
            open_page(page)
            text_to_image(page, info)
            reuse_settings(page)
            columns = page.evaluate(
                "() => { const f = document.getElementById('job-form').getBoundingClientRect();"
                " const o = document.getElementById('output').getBoundingClientRect();"
                " return o.left >= f.right - 1 && Math.abs(o.top - f.top) < 2; }"
            )
            check(columns, "at desktop width the results should sit beside the form")
            page.screenshot(path=os.path.join(out_dir, "desktop.png"), full_page=True)
            keyboard_reaches_generate(page)
            inpaint(page)
            cancel(page)
            check(not errors, f"the page threw: {errors}")
            check(not foreign, f"the page asked for addresses outside the server: {foreign}")
            phone(browser)
        except Exception as error:
            summary["failed"] = f"{type(error).__name__}: {error}"
            try:
                page.screenshot(path=os.path.join(out_dir, "failure.png"), full_page=True)
                summary["status_at_failure"] = status_text(page)
            except Exception:
                pass
        finally:
            browser.close()
    finish(summary, out_dir, "web page")


if __name__ == "__main__":
    main()
