//! `attn completions SHELL` and `attn man`: the completion scripts and manual pages generated
//! from the command's own definition.

use std::process::{Command, Output};

fn attn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = attn(args);
    assert!(
        out.status.success(),
        "attn {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The commands every page and script must know.
const COMMANDS: &[&str] = &[
    "run",
    "inspect",
    "generate",
    "bench",
    "train",
    "translate",
    "explain",
    "convert",
    "serve",
    "completions",
    "man",
];

#[test]
fn every_shell_gets_a_script_naming_the_commands() {
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let script = ok(&["completions", shell]);
        assert!(!script.trim().is_empty(), "{shell}: empty script");
        for command in COMMANDS {
            assert!(script.contains(command), "{shell}: no {command}");
        }
        // The options of a subcommand are completed too.
        assert!(script.contains("source-lang"), "{shell}: no --source-lang");
    }
    let err = attn(&["completions", "tcsh"]);
    assert!(!err.status.success());
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(
        stderr.contains("tcsh") && stderr.contains("bash"),
        "{stderr}"
    );
}

#[test]
fn the_bash_script_is_valid_bash() {
    let script = ok(&["completions", "bash"]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("attn.bash");
    std::fs::write(&path, &script).unwrap();
    let check = match Command::new("bash").arg("-n").arg(&path).output() {
        Ok(out) => out,
        Err(e) => {
            eprintln!("no bash to check the script with ({e}); skipped");
            return;
        }
    };
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn the_man_page_describes_every_command() {
    let page = ok(&["man"]);
    assert!(page.starts_with(".ie") || page.starts_with(".TH"), "{page}");
    assert!(page.contains(".TH attn 1"), "{page}");
    for section in [
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH DESCRIPTION",
        ".SH EXAMPLES",
    ] {
        assert!(page.contains(section), "no {section}");
    }
    for command in COMMANDS {
        assert!(
            page.contains(&format!("attn\\-{command}(1)")),
            "no {command}"
        );
    }
    // The version section has the version, not the CPU `attn --version` describes.
    assert!(page.contains(env!("CARGO_PKG_VERSION")));
    assert!(!page.contains("AVX") && !page.contains("avx"), "{page}");
}

#[test]
fn man_output_writes_one_page_per_command() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("man1");
    let listed = ok(&["man", "--output", out_dir.to_str().unwrap()]);
    let mut pages = vec!["attn".to_string()];
    pages.extend(COMMANDS.iter().map(|c| format!("attn-{c}")));
    pages.extend(
        [
            "run-mha",
            "run-transformer",
            "run-marian",
            "run-seq2seq",
            "bench-attention",
            "bench-mha",
            "bench-decode",
        ]
        .map(|c| format!("attn-{c}")),
    );
    for page in &pages {
        let path = out_dir.join(format!("{page}.1"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(text.contains(&format!(".TH {page} 1")), "{page}: {text}");
        assert!(listed.contains(path.to_str().unwrap()), "{listed}");
    }
    let written = std::fs::read_dir(&out_dir).unwrap().count();
    assert_eq!(written, pages.len(), "{listed}");
    let translate = std::fs::read_to_string(out_dir.join("attn-translate.1")).unwrap();
    assert!(translate.contains("source\\-lang"), "{translate}");
    // Written again over the same pages: replaced, not refused.
    ok(&["man", "--output", out_dir.to_str().unwrap()]);
}
