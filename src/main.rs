//! Entry point: parse the command line, then serve or run a subcommand. Bad usage exits 2; the
//! daemon and the subcommands choose their own exit codes.

use std::process::ExitCode;

use sandboxd::{Command, ENVD_VERSION};

fn main() -> ExitCode {
    let mut args_os = std::env::args_os();
    // argv[0]: under the name `envd` the metadata service defaults to envd's (SPEC §1).
    let program = args_os
        .next()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let args: Vec<String> = match args_os.map(|a| a.into_string()).collect() {
        Ok(args) => args,
        Err(arg) => return usage_error(&format!("argument {arg:?} is not valid UTF-8")),
    };
    let command = match sandboxd::parse(&program, &args, &|name| std::env::var(name).ok()) {
        Ok(command) => command,
        Err(message) => return usage_error(&message),
    };
    match command {
        Command::Help => {
            print!("{}", sandboxd::help());
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("sandboxd {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::EnvdVersion => {
            println!("{}", ENVD_VERSION);
            ExitCode::SUCCESS
        }
        Command::Commit => {
            println!("{}", sandboxd::COMMIT);
            ExitCode::SUCCESS
        }
        Command::HandoverSchema => {
            println!("{}", sandboxd::upgrade::state::SCHEMA);
            ExitCode::SUCCESS
        }
        Command::Healthcheck(target, addrs) => sandboxd::healthcheck(&target, &addrs),
        Command::SignHelp => {
            print!("{}", sandboxd::sign_help());
            ExitCode::SUCCESS
        }
        Command::Sign(request) => sandboxd::sign(&request),
        Command::Serve(config) => sandboxd::run(config),
    }
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("sandboxd: {message} (see 'sandboxd --help')");
    ExitCode::from(2)
}
