"""Pulls a model from the page of a `zimage serve` whose store is empty, then generates with it.

Usage: web_page_pull.py BASE_URL NAME OUT_DIR. The server reaches a Hub holding NAME
(`hf.co/OWNER/REPO`). The script writes OUT_DIR/pulled.png and exits non-zero at the first
check that fails, saying which. CHROMIUM names the browser (default /usr/bin/chromium).
"""
import os
import sys

from playwright.sync_api import sync_playwright

import chromium

base, name, out_dir = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def status_is(page, pattern, timeout):
    page.wait_for_function(
        "(p) => new RegExp(p).test(document.getElementById('status').textContent)",
        arg=pattern,
        timeout=timeout,
    )


def scenario(page):
    page.goto(f"{base}/ui")
    page.wait_for_selector("#pull-card", state="visible")
    offered = page.locator(".pull-choice").evaluate_all("(bs) => bs.map((b) => b.dataset.model)")
    check(offered == ["hf.co/Tongyi-MAI/Z-Image-Turbo", "hf.co/black-forest-labs/FLUX.2-klein-4B"],
          f"the page should offer Z-Image-Turbo and FLUX.2 klein 4B, offers {offered}")
    check(page.is_disabled("#generate"), "#generate should be off while no model is stored")
    # Every value the bar takes while the pull runs.
    page.evaluate(
        """() => {
          window.fractions = [];
          const bar = document.getElementById('pull-progress');
          new MutationObserver(() => { if (bar.hasAttribute('value')) window.fractions.push(bar.value); })
            .observe(bar, {attributes: true});
        }"""
    )
    page.fill("#pull-name", name)
    page.click("#pull-start")
    status_is(page, "^Pulled", 120_000)
    fractions = page.evaluate("() => window.fractions")
    check(fractions and max(fractions) == 1, f"the pull's progress should reach the end: {fractions}")
    check(page.is_hidden("#pull-card"), "the pull card should go once the model is there")
    check(page.input_value("#model") == name, f"#model should be {name}, is {page.input_value('#model')}")
    page.fill("#prompt", "a lighthouse at dusk")
    page.click("#generate")
    page.wait_for_selector("#results img", timeout=120_000)
    status_is(page, "^done in", 120_000)
    page.screenshot(path=os.path.join(out_dir, "pulled.png"), full_page=True)


def main():
    os.makedirs(out_dir, exist_ok=True)
    with sync_playwright() as p:
        browser = chromium.launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(30_000)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            scenario(page)
            check(not errors, f"the page threw: {errors}")
        except Exception as error:
            page.screenshot(path=os.path.join(out_dir, "failure.png"), full_page=True)
            status = page.locator("#pull-status").text_content(), page.locator("#status").text_content()
            print(f"page pull check failed: {error} (statuses: {status})", file=sys.stderr)
            sys.exit(1)
        finally:
            browser.close()


if __name__ == "__main__":
    main()
