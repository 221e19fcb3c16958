//! `deploy man [--out-dir DIR]`: the man pages, generated from the one `Cli` definition.

use super::{code, Cli, Error};
use clap::CommandFactory;
use std::path::Path;

/// deploy(1) to standard output; with `out_dir`, deploy.1 and deploy-COMMAND.1 for every
/// command into that directory (created if need be), each file named on standard output.
pub fn run(out_dir: Option<&Path>) -> Result<u8, Error> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let Some(dir) = out_dir else {
        out!("{}", String::from_utf8_lossy(&render(&cmd)));
        return Ok(code::OK);
    };
    std::fs::create_dir_all(dir).map_err(|source| Error::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let pages = std::iter::once(&cmd).chain(cmd.get_subcommands().filter(|c| !c.is_hide_set()));
    for page in pages {
        let path = dir.join(man(page).get_filename());
        std::fs::write(&path, render(page)).map_err(|source| Error::Write {
            path: path.clone(),
            source,
        })?;
        outln!("{}", path.display());
    }
    Ok(code::OK)
}

/// One command's page: `.TH deploy-init 1 " " "Drover 0.1.0" "Drover manual"`.
fn man(cmd: &clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd.clone())
        // No date (the page would change with every build), but not an empty one either:
        // clap_mangen writes an empty `.TH` argument as nothing, which shifts the next ones.
        .date(" ")
        .source(format!("Drover {}", env!("CARGO_PKG_VERSION")))
        .manual("Drover manual")
}

/// The roff text of one command's page.
fn render(cmd: &clap::Command) -> Vec<u8> {
    let mut roff = Vec::new();
    man(cmd)
        .render(&mut roff)
        .expect("rendering into a Vec cannot fail");
    roff
}
