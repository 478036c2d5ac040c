"""The headless Chromium the page's browser tests drive: Debian's (CHROMIUM, default
/usr/bin/chromium), started with no network of its own and no first-run work."""
import os


def launch(playwright):
    return playwright.chromium.launch(
        executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
        headless=True,
        args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    )
