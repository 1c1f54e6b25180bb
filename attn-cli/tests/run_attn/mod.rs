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
