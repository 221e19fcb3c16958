//! The `deploy` binary: parse arguments, run the command, render any error, exit with its code.

use clap::Parser;
use drover::cli::{self, Cli};
use drover::report::{render_diagnostic, Style};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = Cli::parse();
    match cli::run(args) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            // Not `eprint!`: a closed stderr must not turn the error into a panic.
            let _ = write!(
                std::io::stderr(),
                "{}",
                render_diagnostic(
                    &error,
                    Style {
                        color,
                        ..Style::PLAIN
                    }
                )
            );
            ExitCode::from(error.exit_code())
        }
    }
}
