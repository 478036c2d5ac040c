"""The headless Chromium the page's browser tests drive: Debian's (CHROMIUM, default
/usr/bin/chromium), started with no network of its own and no first-run work; and what the
scripts share: their checks, and the summary they leave."""
import json
import os
import struct
import sys


class CheckFailed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    return struct.unpack(">II", head[16:24])


def finish(summary, out_dir, what):
    """Writes OUT_DIR/summary.json and prints it; exits non-zero when a check failed."""
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))
    if "failed" in summary:
        print(f"{what} check failed: {summary['failed']}", file=sys.stderr)
        sys.exit(1)


def launch(playwright):
    return playwright.chromium.launch(
        executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
        headless=True,
        args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    )
