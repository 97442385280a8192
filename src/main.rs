//! Entry point: parse the command line, then serve or run a subcommand. Bad usage exits 2.

use sandboxd::api::init::ENVD_VERSION;
use sandboxd::config::{self, Command};
use sandboxd::{cli, daemon};

fn main() {
    let args: Vec<String> = match std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect()
    {
        Ok(args) => args,
        Err(arg) => usage_error(&format!("argument {arg:?} is not valid UTF-8")),
    };
    let command = match config::parse(&args, &|name| std::env::var(name).ok()) {
        Ok(command) => command,
        Err(message) => usage_error(&message),
    };
    let code = match command {
        Command::Help => {
            print!("{}", config::help());
            0
        }
        Command::Version => {
            println!("sandboxd {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Command::EnvdVersion => {
            println!("{}", ENVD_VERSION);
            0
        }
        Command::Healthcheck(addr) => cli::healthcheck(addr),
        Command::Sign(request) => cli::sign(&request),
        Command::Serve(config) => daemon::run(config),
    };
    std::process::exit(code);
}

fn usage_error(message: &str) -> ! {
    eprintln!("sandboxd: {message} (see 'sandboxd --help')");
    std::process::exit(2);
}
