//! `deploy completions SHELL`: shell completions, generated from the one `Cli` definition.

use super::{code, Cli, Error};
use clap::CommandFactory;
use clap_complete::Shell;

pub fn run(shell: Shell) -> Result<u8, Error> {
    let mut cmd = Cli::command();
    let name = cmd.get_name().to_string();
    // Into a buffer first: clap_complete panics when it cannot write, and a closed pipe must
    // not end `deploy` with a panic.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut script);
    out!("{}", String::from_utf8_lossy(&script));
    Ok(code::OK)
}
