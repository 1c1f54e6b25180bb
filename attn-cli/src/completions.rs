//! `attn completions SHELL` and `attn man`: the shell completion scripts and the manual pages
//! of attn, generated from the same clap definition as `--help` (so they never disagree with
//! it). The command definition is handed in by `main`.

use anyhow::Context;
use clap::Command;
use clap_complete::Shell;
use clap_mangen::Man;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Install (the completions directory of your shell may differ):
  bash:  attn completions bash > ~/.local/share/bash-completion/completions/attn
  zsh:   attn completions zsh > ~/.zfunc/_attn   (with fpath+=~/.zfunc before compinit)
  fish:  attn completions fish > ~/.config/fish/completions/attn.fish
  PowerShell:  attn completions powershell >> $PROFILE")]
pub struct CompletionsArgs {
    /// The shell to complete in: bash, zsh, fish, powershell or elvish.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(clap::Args, Debug)]
#[command(after_help = "\
View without installing: attn man | man -l -
Install: attn man --output ~/.local/share/man/man1")]
pub struct ManArgs {
    /// Write the pages into DIR (created if missing) instead of printing one: attn.1 and one
    /// page per command, named after it (attn-translate.1, attn-run-mha.1, ...); existing
    /// pages of those names are replaced. Default: print attn.1 to standard output.
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
}

/// `attn completions SHELL`: the completion script on standard output.
pub fn completions(args: &CompletionsArgs, mut cmd: Command) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut cmd, "attn", &mut out);
    out.flush().context("writing the completion script")?;
    Ok(())
}

/// `attn man [--output DIR]`: the page of `attn` on standard output, or every page in DIR
/// (each file written is named on standard output).
pub fn man(args: &ManArgs, cmd: Command) -> anyhow::Result<()> {
    // The long version names this machine's CPU: not for a manual page.
    let mut cmd = cmd.long_version(None).disable_help_subcommand(true);
    cmd.build();
    let Some(dir) = &args.output else {
        let mut out = std::io::stdout().lock();
        out.write_all(&page(&cmd)?)?;
        out.flush().context("writing the manual page")?;
        return Ok(());
    };
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the manual directory {}", dir.display()))?;
    write_pages(&cmd, dir)
}

/// Writes the page of `cmd` and of each of its (visible) subcommands, recursively, into `dir`.
fn write_pages(cmd: &Command, dir: &Path) -> anyhow::Result<()> {
    let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name());
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page(cmd)?)
        .with_context(|| format!("writing the manual page {}", path.display()))?;
    println!("{}", path.display());
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir)?;
    }
    Ok(())
}

/// The roff page of `cmd` (a built command or subcommand): clap_mangen's sections, with the
/// examples (`after_long_help`) set as typed, line by line, rather than filled into a
/// paragraph.
fn page(cmd: &Command) -> anyhow::Result<Vec<u8>> {
    let man = Man::new(cmd.clone())
        .source(format!("attn {}", env!("CARGO_PKG_VERSION")))
        .manual("attn manual");
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    if cmd.has_subcommands() {
        man.render_subcommands_section(&mut out)?;
    }
    if let Some(extra) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()) {
        out.extend_from_slice(b".SH EXAMPLES\n.nf\n");
        let extra = extra.to_string();
        for line in extra.lines().skip_while(|l| *l == "Examples:") {
            out.extend_from_slice(roff_line(line).as_bytes());
            out.push(b'\n');
        }
        out.extend_from_slice(b".fi\n");
    }
    if cmd.get_version().is_some() {
        man.render_version_section(&mut out)?;
    }
    Ok(without_repeated_preamble(&out))
}

/// Each of clap_mangen's sections starts with the same two-line preamble (the `Aq` string);
/// the page keeps the first.
fn without_repeated_preamble(page: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(page);
    let mut seen = std::collections::HashSet::new();
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let preamble = line.starts_with(".ie \\n(.g .ds Aq") || line.starts_with(".el .ds Aq");
        if !preamble || seen.insert(line) {
            out.push_str(line);
        }
    }
    out.into_bytes()
}

/// One line of text as roff reads it literally: backslashes escaped, minus signs as such,
/// a leading `.` or `'` kept from being read as a request.
fn roff_line(line: &str) -> String {
    let escaped = line.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own consistency checks, and a reference for every command: each (visible)
    /// subcommand says what it does and each of its options and arguments has a help text.
    #[test]
    fn every_command_and_option_is_documented() {
        let mut cmd = crate::Cli::command();
        cmd.build();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        let mut stack = vec![cmd];
        while let Some(c) = stack.pop() {
            let name = c.get_display_name().unwrap_or(c.get_name()).to_string();
            if c.get_about().is_none() {
                missing.push(format!("{name} (the command)"));
            }
            for arg in c.get_arguments().filter(|a| !a.is_hide_set()) {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" && arg.get_help().is_none() {
                    missing.push(format!("{name} {id}"));
                }
            }
            stack.extend(c.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
        }
        assert!(missing.is_empty(), "without a help text: {missing:?}");
    }

    #[test]
    fn roff_lines_are_read_literally() {
        assert_eq!(super::roff_line(r"a\b -c"), r"a\eb \-c");
        assert_eq!(super::roff_line(".SH x"), r"\&.SH x");
    }
}
