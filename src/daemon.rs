//! The daemon's life: bind, serve, and stop cleanly on SIGTERM or SIGINT (as PID 1: power off,
//! halt or restart the machine after the drain, as busybox's init would).
//!
//! Signals are blocked in every thread and received here with `sigwait`, which also works as
//! PID 1 (blocked signals are queued even for init); the processes it starts get an empty mask
//! and default dispositions back (`sys::spawn`), and the open-file limit found here before it
//! is raised (`sys::process::started_nofile_limit`). This thread is the one reaper of children
//! (`proc::reaper`): on `SIGCHLD` it reaps every exited child, handing the exits of the
//! processes the service started to their table; as PID 1 those include the orphans the
//! sandbox leaves it. On SIGTERM the process groups the service started get SIGTERM too.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::Arc;

use crate::app::App;
use crate::config::{Config, ACCESS_TOKEN};
use crate::http;
use crate::proc;
use crate::routes::Router;
use crate::sys::{self, process};
use crate::{log, notify, token, upgrade};

/// The `Server` header of every answer (SPEC §1).
pub const SERVER: &str = concat!("sandboxd/", env!("CARGO_PKG_VERSION"));
/// Most bytes of a request body nobody needs (a refused upload, a full disk) read and dropped
/// so the connection stays usable and the client reads the answer; past it, closed.
const DISCARD_CAP: u64 = 64 << 20;
/// Most bytes all incomplete request heads may hold together; past it the oldest is closed.
const PARTIAL_HEAD_BUDGET: usize = 16 << 20;

/// The open-file limit budgeted when not even `getrlimit` answers: Linux's default soft limit.
const FALLBACK_NOFILE: u64 = 1024;

/// The signals the main thread waits for: stop, reap, and `SIGUSR2`, which `/upgrade` sends to
/// have the main thread perform the upgrade (`crate::upgrade`).
const SIGNALS: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGCHLD, libc::SIGUSR2];

/// Runs the daemon until a stop signal; returns the process exit code: 0 after a drain, 1 when
/// it cannot start, 2 for a bad token.
pub fn run(config: Config) -> ExitCode {
    log::set_format(config.log_format);
    // First: the descriptors a previous image handed over are taken before anything of this
    // one could be given their numbers.
    let handed_over = upgrade::take_over();
    if let Err(e) = process::block_signals(&SIGNALS) {
        log::line(format_args!("cannot block signals: {e}"));
        return ExitCode::FAILURE;
    }
    if config.mmds_address.is_some() {
        // After the signals are blocked (its thread inherits the mask), before any other line:
        // every line from here on is queued for the collector the metadata service names.
        log::export::start();
    }
    if config.envd.verbose {
        log::line(format_args!(
            "-verbose: accepted for envd's command line; sandboxd always logs to stderr"
        ));
    }
    let nofile = match process::raise_nofile_limit() {
        Ok(limit) => {
            log::line(format_args!("open-file limit {limit}"));
            limit
        }
        Err(e) => {
            let limit = process::nofile_limit().map_or(FALLBACK_NOFILE, |(soft, _)| soft);
            log::line(format_args!(
                "cannot raise the open-file limit: {e}; budgeting {limit}"
            ));
            limit
        }
    };
    let token = match load_token(&config) {
        Ok(token) => token,
        Err(message) => {
            log::line(format_args!("{message}"));
            return ExitCode::from(2);
        }
    };
    let (listener, handover) = match handed_over {
        Some(taken) => (taken.listener, Some((taken.state, taken.inherited))),
        None => match TcpListener::bind(config.listen) {
            Ok(listener) => (listener, None),
            Err(e) => {
                log::line(format_args!("cannot listen on {}: {e}", config.listen));
                return ExitCode::FAILURE;
            }
        },
    };
    let own_port = listener.local_addr().ok().map(|a| a.port());
    let address = listener
        .local_addr()
        .map_or_else(|_| config.listen.to_string(), |a| a.to_string());
    let server_config = http::Config {
        workers: config.workers,
        waiting_workers: std::thread::available_parallelism().map_or(1, |cpus| cpus.get()),
        header_timeout: config.header_timeout,
        idle_timeout: config.idle_timeout,
        send_timeout: config.send_timeout,
        body_timeout: config.body_timeout,
        discard_cap: DISCARD_CAP,
        partial_head_budget: PARTIAL_HEAD_BUDGET,
        collect_budget: crate::connect::COLLECT_BUDGET,
        server_header: SERVER.to_string(),
    };
    let drain_timeout = config.drain_timeout;
    let workers = config.workers;
    let env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    if config.fs_as_user {
        // Before any worker acts as a user: a thread inherits its creator's credentials.
        crate::fs::temp::start_sweeper_now();
    }
    let app = Arc::new(App::new(config, token, env));
    if let Some((handover, inherited)) = handover {
        take_back(&app, handover, inherited);
    }
    // After the handover: a token that crossed a live upgrade is this image's token too.
    if app.token().is_none() {
        log::line(format_args!(
            "warning: no access token configured: every route is open until POST /init sets one"
        ));
    }
    if let Some(mmds) = &app.mmds {
        log::line(format_args!(
            "metadata service at {}",
            app.config
                .mmds_address
                .map_or_else(String::new, |a| a.to_string())
        ));
        // Its own thread: start-up and /health never wait for the metadata service.
        mmds.start();
    }
    let router = Router {
        app: Arc::clone(&app),
    };
    let server = match http::start(listener, server_config, router) {
        Ok(server) => server,
        Err(e) => {
            log::line(format_args!("cannot start the server: {e}"));
            return ExitCode::FAILURE;
        }
    };
    if let Some(forward_address) = app.config.forward_address {
        crate::platform::forward::start(crate::platform::forward::Settings {
            address: forward_address,
            own_port: own_port.unwrap_or(app.config.listen.port()),
            max_ports: app.config.forward_max_ports,
            max_connections: app.config.forward_max_connections,
            budget: crate::descriptors::Budget::new(nofile, workers),
        });
    }
    log::line(format_args!(
        "sandboxd {} listening on {address} with {workers} workers",
        env!("CARGO_PKG_VERSION")
    ));
    notify::send("READY=1");
    // As PID 1 (a minimal image's init) the signals mean what busybox's init makes of them
    // (`sys::power`): `SIGUSR2` from anyone but the daemon itself is `poweroff`, not `/upgrade`'s
    // wake-up, and the drain ends the machine instead of the process (an init that exits
    // panics the kernel).
    let own_pid = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    let init = own_pid == 1;
    let mut signals = SIGNALS.to_vec();
    if init {
        signals.push(libc::SIGUSR1);
    }
    let mut ending = None;
    loop {
        match process::wait_signal_from(&signals) {
            Ok(received) if received.signal == libc::SIGCHLD => proc::reaper::reap_all(),
            Ok(received)
                if received.signal == libc::SIGUSR2 && !(init && received.sender != own_pid) =>
            {
                upgrade::perform(&server, &app, drain_timeout, &signals)
            }
            Ok(received) => {
                let signal = received.signal;
                if init {
                    let how = sys::power::Power::of_signal(signal);
                    log::line(format_args!(
                        "signal {signal}: draining, then {how} (PID 1)"
                    ));
                    ending = Some(how);
                } else {
                    log::line(format_args!("signal {signal}: draining"));
                }
                break;
            }
            Err(e) => {
                log::line(format_args!("sigwait failed: {e}"));
                break;
            }
        }
    }
    notify::send("STOPPING=1");
    app.begin_shutdown();
    server.stop_accepting();
    if let Some(processes) = proc::Hub::running() {
        processes.shutdown();
    }
    if server.wait_idle(drain_timeout) {
        log::line(format_args!("drained; exiting"));
    } else {
        log::line(format_args!(
            "drain timeout of {drain_timeout:?} reached; exiting with requests in flight"
        ));
    }
    // What the workers logged since the line above (an answer on a kept connection).
    log::flush();
    if let Some(how) = ending {
        let error = crate::shutdown::end_machine(how);
        log::line(format_args!("PID 1: {error}"));
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Restores what the previous image handed over, and records how it went for `/init`.
///
/// Before the main thread reaps anything: an exit of a carried process that happened during the
/// swap waits, unreaped, until its process is back in the table.
fn take_back(
    app: &App,
    handover: Result<upgrade::state::Handover, String>,
    inherited: upgrade::carry::Inherited,
) {
    match handover {
        Ok(handover) => {
            app.restore(handover.app_state());
            log::line(format_args!(
                "upgrade: took over from sandboxd {} (envd {}): the listener and the state of \
                 /init",
                handover.from_version, handover.from_envd_version
            ));
            upgrade::adopt(app, handover, inherited);
        }
        Err(error) => {
            log::line(format_args!(
                "upgrade: took over the listener, but not the state: {error}; starting afresh"
            ));
            upgrade::record_outcome(upgrade::Outcome {
                failed: true,
                ..upgrade::Outcome::default()
            });
        }
    }
}

/// The token (`token::load`), after which `SANDBOXD_ACCESS_TOKEN` is overwritten where the
/// kernel shows it (`/proc/<pid>/environ`, readable for the daemon's whole life) and removed
/// from the environment, whichever source was used, so the secret stays only in the daemon's
/// own memory.
fn load_token(config: &Config) -> Result<Option<String>, String> {
    let from_env = std::env::var(ACCESS_TOKEN.env).ok();
    scrub_env_token();
    token::load(config.access_token_file.as_deref(), from_env)
}

/// Overwrites and removes `SANDBOXD_ACCESS_TOKEN` from the environment; logs when it cannot.
/// Runs before any thread is started (`sys::env` refuses otherwise).
fn scrub_env_token() {
    const NAME: &str = ACCESS_TOKEN.env;
    if std::env::var_os(NAME).is_none() {
        return;
    }
    if let Err(e) = sys::env::scrub_value(NAME) {
        log::line(format_args!(
            "warning: {NAME} stays readable in /proc/{}/environ: {e}; use --access-token-file",
            std::process::id()
        ));
    }
    std::env::remove_var(NAME);
}
