//! Running the `attn` binary with arguments and standard input, as scripts do (shared by the
//! stream tests).

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs `attn args...` with `stdin` written to its standard input (from another thread, so a
/// large input never blocks on a full output pipe); returns its output.
pub fn attn(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// Runs `attn args...` with an empty standard input and returns its standard output; fails
/// the test unless it succeeded. (Not every test crate that includes this module uses it.)
#[allow(dead_code)]
pub fn ok(args: &[&str]) -> String {
    let out = attn(args, b"");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `attn args...` and returns its standard error; fails the test unless it exited with
/// 1 and did not panic.
#[allow(dead_code)]
pub fn fails(args: &[&str]) -> String {
    let out = attn(args, b"");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}
