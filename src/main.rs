//! Entry point: parse the command line, then serve or run a subcommand. Bad usage exits 2; the
//! daemon and the subcommands choose their own exit codes.

use std::process::ExitCode;

use sandboxd::{Command, ENVD_VERSION};

fn main() -> ExitCode {
    let args: Vec<String> = match std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect()
    {
        Ok(args) => args,
        Err(arg) => return usage_error(&format!("argument {arg:?} is not valid UTF-8")),
    };
    let command = match sandboxd::parse(&args, &|name| std::env::var(name).ok()) {
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
        Command::Healthcheck(addr) => sandboxd::healthcheck(addr),
        Command::Sign(request) => sandboxd::sign(&request),
        Command::Serve(config) => sandboxd::run(config),
    }
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("sandboxd: {message} (see 'sandboxd --help')");
    ExitCode::from(2)
}
