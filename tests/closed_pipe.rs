//! Hostile inputs, item 5: a closed stdout pipe ends a command quietly instead of a panic.

// The library carries the BLAS the test binary is linked against.
extern crate zimage;

use std::process::{Command, Stdio};

#[test]
fn item_05_a_closed_stdout_pipe_ends_the_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // The reader has gone before zimage writes its first line.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .arg("--store")
        .arg(&store)
        .args(["list"])
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_ne!(out.status.code(), Some(101), "{stderr}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}", out.status);
    }
}
