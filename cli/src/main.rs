use std::process::ExitCode;

use clap::Parser as _;
use stackprobe::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Watch(args) => stackprobe::cmd::watch::run(args),
        Command::Agent(args) => stackprobe::cmd::watch::run(args.into_watch()),
        Command::Report(args) => stackprobe::cmd::report::run(args),
        Command::Diff(args) => stackprobe::cmd::diff::run(args),
        Command::Doctor => stackprobe::cmd::doctor::run(),
        Command::Demo(args) => stackprobe::cmd::demo::run(args),
        Command::DemoServer(args) => stackprobe::cmd::demo::serve(args),
        Command::Completions { shell } => stackprobe::cmd::completions::print(shell),
        Command::Manpages { dir } => stackprobe::cmd::completions::manpages(&dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stackprobe: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
