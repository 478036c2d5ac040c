//! The browser the page tests drive: Debian's Chromium, through Playwright in a venv.

use std::path::PathBuf;
use std::process::Command;

pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Installs Debian's Chromium with apt when it is missing; fails, never skips.
pub fn ensure_chromium() {
    super::apt_install(&["chromium"], &[CHROMIUM], "the page's browser test");
}

/// A Python with Playwright (which drives the system Chromium; it downloads no browser), in a
/// venv made once under the test cache and reused.
pub fn playwright_python() -> PathBuf {
    let venv = super::test_cache().join("venv-browser");
    let python = venv.join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import playwright.sync_api"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        std::fs::create_dir_all(super::test_cache()).unwrap();
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 is needed to run the browser test");
        assert!(made.success(), "cannot create a venv at {}", venv.display());
        let installed = Command::new(&python)
            .args(["-m", "pip", "install", "-q", "playwright==1.65.*"])
            .status()
            .unwrap();
        assert!(installed.success(), "pip could not install playwright");
    }
    python
}
