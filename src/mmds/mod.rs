//! The metadata service client (Firecracker MMDS v2, as envd's `internal/host/mmds.go` reads
//! it): what the host tells the sandbox about itself. It owns the wire exchange (a token `PUT`,
//! then `GET /` as JSON, plain HTTP/1.1 over a `TcpStream` with a timeout on every socket
//! operation), the fields read from it ([`MmdsOpts`]), the background poller that turns the
//! sandbox's identity into `E2B_SANDBOX_ID`, `E2B_TEMPLATE_ID` and the files under
//! `/run/e2b/`, and envd's rule for the default address ([`envd_default_address`]).
//!
//! Off unless `--mmds-address` is given, or the binary runs under the name `envd` without
//! `-isnotfc` (SPEC §1): otherwise nothing here runs and no socket is opened.
//! Nothing here blocks start-up, `/health` or a worker: the poller is a thread of its own, and
//! `/init`'s reads of the token's hash (each bounded by [`HASH_TIMEOUT`]) are another's, one
//! read shared by the `/init`s waiting for it ([`hash`]).

pub mod hash;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Deserialize;

use hash::{HashReads, Waiter};

use crate::platform::{http_client, walk};

/// envd's address, used only under envd's program name (see [`envd_default_address`]).
pub const ENVD_ADDRESS: &str = "169.254.169.254:80";
/// The metadata service's real address in a Firecracker guest (link-local, never routed off
/// the VM): only a service configured at it can enable what only a guest may do (the clock).
pub const LINK_LOCAL_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(169, 254, 169, 254);
/// envd's MMDS token lifetime, sent in `X-metadata-token-ttl-seconds`.
const TOKEN_TTL_SECONDS: u32 = 60;
/// Each of the poller's two requests, connect to last byte (envd's
/// `mmdsAccessTokenRequestClientTimeout`): a service that answers each request seconds late is
/// still read.
const POLL_TIMEOUT: Duration = Duration::from_secs(10);
/// The whole of one read of the token hash for `/init` (both requests): a stalled service
/// keeps the `/init`s waiting for it no longer than this.
pub const HASH_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one poll goes on retrying before it gives up (envd: 60 s after an `/init`).
const POLL_BUDGET: Duration = Duration::from_secs(60);
/// The first pause between tries (envd's 50 ms tick), doubled after each failure up to
/// [`MAX_BACKOFF`]: a service that is down costs a try every 2 s, not 20 a second.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Largest answer read: MMDS's JSON is a few hundred bytes.
const MAX_ANSWER: usize = 64 * 1024;
/// Where envd writes the sandbox's identity, under `--system-root`.
const RUN_DIR: &str = "/run/e2b";

/// The fields envd reads from the metadata service; absent ones are empty, others ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MmdsOpts {
    /// The sandbox's id: `E2B_SANDBOX_ID`.
    #[serde(rename = "instanceID", default)]
    pub instance_id: String,
    /// The template's id: `E2B_TEMPLATE_ID`.
    #[serde(rename = "envID", default)]
    pub env_id: String,
    /// The logs collector's address (`crate::log::export`).
    #[serde(rename = "address", default)]
    pub address: String,
    /// Lower-case hex SHA-512 of the token `/init` may set; empty when the host set none.
    #[serde(rename = "accessTokenHash", default)]
    pub access_token_hash: String,
}

/// Parses MMDS's `GET /` answer.
pub fn parse(body: &[u8]) -> Result<MmdsOpts, String> {
    serde_json::from_slice(body).map_err(|e| format!("metadata is not the JSON expected: {e}"))
}

/// Refuses an identity that could not be passed on: an id with a NUL or another control
/// character would make every process start fail (no environment holds a NUL) and put a line
/// break in the files under `/run/e2b`.
pub fn check_identity(opts: &MmdsOpts) -> Result<(), String> {
    for (field, value) in [("instanceID", &opts.instance_id), ("envID", &opts.env_id)] {
        if value.chars().any(char::is_control) {
            return Err(format!(
                "the metadata's {field} {value:?} has a control character"
            ));
        }
    }
    Ok(())
}

/// envd's rule for where the metadata service is: an explicit `--mmds-address` wins; a daemon
/// started under the program name `envd` (a drop-in for envd, whose unit runs it without flags)
/// uses envd's [`ENVD_ADDRESS`] unless envd's `-isnotfc` was given; any other name uses none.
/// Pure, so it is tested with literals: no test runs a daemon that would contact that address.
/// `crate::config` calls it with argv[0].
pub fn envd_default_address(
    program: &str,
    given: Option<SocketAddr>,
    is_not_fc: bool,
) -> Option<SocketAddr> {
    if given.is_some() {
        return given;
    }
    let name = program.rsplit('/').next().unwrap_or(program);
    if name == "envd" && !is_not_fc {
        ENVD_ADDRESS.parse().ok()
    } else {
        None
    }
}

/// One read of the metadata service: the session token, then the metadata. `timeout` bounds
/// every socket operation and each request as a whole.
pub fn fetch(address: SocketAddr, timeout: Duration) -> Result<MmdsOpts, String> {
    let token = exchange(
        address,
        timeout,
        &format!(
            "PUT /latest/api/token HTTP/1.1\r\nHost: {address}\r\n\
             X-metadata-token-ttl-seconds: {TOKEN_TTL_SECONDS}\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n"
        ),
    )
    .map_err(|e| format!("token request: {e}"))?;
    let token = String::from_utf8(token)
        .ok()
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or("token request: the token is empty or not printable ASCII")?;
    let body = exchange(
        address,
        timeout,
        &format!(
            "GET / HTTP/1.1\r\nHost: {address}\r\nX-metadata-token: {token}\r\n\
             Accept: application/json\r\nConnection: close\r\n\r\n"
        ),
    )
    .map_err(|e| format!("metadata request: {e}"))?;
    parse(&body)
}

/// Sends `request` on a new connection and returns the body of a 200 answer.
fn exchange(address: SocketAddr, timeout: Duration, request: &str) -> Result<Vec<u8>, String> {
    match http_client::exchange(address, timeout, request.as_bytes(), MAX_ANSWER)? {
        (200, body) => Ok(body),
        (status, _) => Err(format!("status {status}")),
    }
}

/// The sandbox's identity as the metadata service last gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    sandbox_id: String,
    template_id: String,
}

/// The client of one daemon: its address, the identity last read and the poller's wake-up.
pub struct Mmds {
    address: SocketAddr,
    system_root: PathBuf,
    identity: RwLock<Option<Identity>>,
    /// The last malformed answer logged, so that one repeated is logged once.
    refused: Mutex<Option<(String, String)>>,
    /// Whether the service has answered a read (the poller's or `/init`'s) at least once.
    answered: AtomicBool,
    /// Whether a poll was asked for since the poller last started one.
    wanted: Mutex<bool>,
    wake: Condvar,
    /// `/init`'s reads of the token hash, on a thread of their own.
    hash_reads: Arc<HashReads>,
}

impl Mmds {
    pub fn new(address: SocketAddr, system_root: PathBuf) -> Mmds {
        Mmds {
            address,
            system_root,
            identity: RwLock::new(None),
            refused: Mutex::new(None),
            answered: AtomicBool::new(false),
            wanted: Mutex::new(false),
            wake: Condvar::new(),
            hash_reads: Arc::new(HashReads::new()),
        }
    }

    /// Starts the poller thread, which first writes `/run/e2b/.E2B_SANDBOX` (envd's `true` in a
    /// Firecracker guest), and asks it for a first poll; and the thread of `/init`'s reads of
    /// the token hash. Returns at once.
    pub fn start(self: &Arc<Self>) {
        let mmds = Arc::clone(self);
        let started = std::thread::Builder::new()
            .name("mmds".into())
            .spawn(move || mmds.poller());
        if let Err(e) = started {
            crate::log::line(format_args!("mmds: cannot start the poller: {e}"));
        }
        self.poll();
        let mmds = Arc::clone(self);
        if let Err(e) = self.hash_reads.start(move || mmds.access_token_hash()) {
            // Every /init that needs the hash is then decided without one (and logged).
            crate::log::line(format_args!(
                "mmds: cannot start the thread that reads the token hash: {e}"
            ));
        }
    }

    /// Asks the poller to read the service again (at start, and after each authorised `/init`:
    /// a resumed or forked sandbox has a new id). Never blocks on the service.
    pub fn poll(&self) {
        *self.wanted.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.wake.notify_one();
    }

    /// The variables the identity adds to every environment: `E2B_SANDBOX=true`, and the two
    /// ids once the service has answered.
    pub fn environment(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::from([("E2B_SANDBOX".to_string(), "true".to_string())]);
        if let Some(identity) = &*self.identity.read().unwrap_or_else(|e| e.into_inner()) {
            env.insert("E2B_SANDBOX_ID".into(), identity.sandbox_id.clone());
            env.insert("E2B_TEMPLATE_ID".into(), identity.template_id.clone());
        }
        env
    }

    /// Gives `waiter` the `accessTokenHash` of a read begun from now on, on the hash thread
    /// (`hash`); never blocks on the service.
    pub fn with_access_token_hash(&self, waiter: Box<dyn Waiter>) {
        self.hash_reads.wait(waiter);
    }

    /// A fresh read of `accessTokenHash`, bounded by [`HASH_TIMEOUT`] in all: the hash thread's.
    fn access_token_hash(&self) -> Result<String, String> {
        let opts = fetch(self.address, HASH_TIMEOUT / 2)?;
        self.answered.store(true, Ordering::Relaxed);
        Ok(opts.access_token_hash)
    }

    /// The address configured with `--mmds-address`.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Whether the service has answered at least once: its metadata parsed, to the poller or to
    /// an `/init`'s read of the token hash. Never true for an address nothing answers at.
    pub fn has_answered(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }

    /// The poller's loop: waits for a request, then tries until the service answers or the
    /// budget is spent, pausing with a doubling backoff between tries.
    fn poller(&self) {
        if let Err(e) = write_run_file(&self.system_root, ".E2B_SANDBOX", "true", 0o444) {
            crate::log::line(format_args!(
                "mmds: cannot write {RUN_DIR}/.E2B_SANDBOX: {e}"
            ));
        }
        loop {
            {
                let mut wanted = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
                while !*wanted {
                    wanted = self.wake.wait(wanted).unwrap_or_else(|e| e.into_inner());
                }
                *wanted = false;
            }
            let deadline = Instant::now() + POLL_BUDGET;
            let mut pause = FIRST_BACKOFF;
            loop {
                match fetch(self.address, POLL_TIMEOUT) {
                    Ok(opts) => {
                        self.learn(&opts);
                        break;
                    }
                    Err(e) if Instant::now() + pause >= deadline => {
                        crate::log::line(format_args!(
                            "mmds: gave up polling {} (last error: {e})",
                            self.address
                        ));
                        break;
                    }
                    Err(_) => std::thread::sleep(pause),
                }
                pause = (pause * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// Writes envd's files for the identity, then records it; a malformed one is refused
    /// (logged once) and the identity known before is kept.
    fn learn(&self, opts: &MmdsOpts) {
        self.answered.store(true, Ordering::Relaxed);
        if let Err(reason) = check_identity(opts) {
            let answer = Some((opts.instance_id.clone(), opts.env_id.clone()));
            let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
            if *refused != answer {
                crate::log::line(format_args!(
                    "mmds: ignoring a malformed identity: {reason}; the identity known before \
                     is kept"
                ));
                *refused = answer;
            }
            return;
        }
        for (name, value) in [
            (".E2B_SANDBOX_ID", &opts.instance_id),
            (".E2B_TEMPLATE_ID", &opts.env_id),
        ] {
            if let Err(e) = write_run_file(&self.system_root, name, value, 0o644) {
                crate::log::line(format_args!("mmds: cannot write {RUN_DIR}/{name}: {e}"));
            }
        }
        // After the files: whoever sees the new identity finds them written.
        let identity = Identity {
            sandbox_id: opts.instance_id.clone(),
            template_id: opts.env_id.clone(),
        };
        *self.identity.write().unwrap_or_else(|e| e.into_inner()) = Some(identity);
        crate::log::export::set_target(&opts.address, &opts.instance_id, &opts.env_id);
    }
}

/// Writes `name` in `/run/e2b` under `system_root` atomically, through descriptors: the
/// directory opened (made, root's, 0755) following no symlink (`platform::walk`), a temporary
/// made in it with `O_CREAT | O_EXCL | O_NOFOLLOW` (a name already there, left by a crash or
/// planted, is unlinked first, never written through), written, given `mode` (`fchmod`), made
/// durable, renamed over `name` within the held directory, and the directory synced: a reader
/// or a crash never sees a partial file, and no link redirects the write.
fn write_run_file(system_root: &Path, name: &str, content: &str, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let dir = walk::open_below(system_root, RUN_DIR)?;
    let temp = OsString::from(format!(".{name}.{}.tmp", std::process::id()));
    let name = OsStr::new(name);
    let written = (|| {
        match dir.remove(&temp, false) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut file = dir.create_file(&temp, 0o600)?;
        file.write_all(content.as_bytes())?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        dir.rename(&temp, &dir, name)?;
        dir.sync()
    })();
    if written.is_err() {
        let _ = dir.remove(&temp, false);
    }
    written.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_envd_reads_are_parsed_and_others_ignored() {
        let opts = parse(
            br#"{"instanceID":"isb1","envID":"tpl2","address":"http://10.0.0.1:30006",
                "accessTokenHash":"ab12","traceID":"x","nested":{"a":1}}"#,
        )
        .unwrap();
        assert_eq!(
            opts,
            MmdsOpts {
                instance_id: "isb1".into(),
                env_id: "tpl2".into(),
                address: "http://10.0.0.1:30006".into(),
                access_token_hash: "ab12".into(),
            }
        );
        assert_eq!(parse(b"{}").unwrap(), MmdsOpts::default());
        assert!(parse(b"").is_err());
        assert!(parse(b"not json").is_err());
        assert!(parse(br#"{"instanceID": 5}"#).is_err());
    }

    #[test]
    fn only_envd_s_program_name_defaults_to_envd_s_address() {
        let envd: SocketAddr = "169.254.169.254:80".parse().unwrap();
        let given: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(envd_default_address("envd", None, false), Some(envd));
        assert_eq!(
            envd_default_address("/usr/bin/envd", None, false),
            Some(envd)
        );
        assert_eq!(envd_default_address("/usr/bin/envd", None, true), None);
        assert_eq!(envd_default_address("sandboxd", None, false), None);
        assert_eq!(envd_default_address("/usr/bin/sandboxd", None, false), None);
        assert_eq!(envd_default_address("envd2", None, false), None);
        assert_eq!(envd_default_address("", None, false), None);
        assert_eq!(
            envd_default_address("sandboxd", Some(given), false),
            Some(given)
        );
        assert_eq!(envd_default_address("envd", Some(given), true), Some(given));
    }

    #[test]
    fn run_files_are_replaced_whole() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let run = root.path().join("run/e2b");
        write_run_file(root.path(), ".E2B_SANDBOX_ID", "first-longer", 0o666).unwrap();
        write_run_file(root.path(), ".E2B_SANDBOX_ID", "second", 0o666).unwrap();
        let file = run.join(".E2B_SANDBOX_ID");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "second");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o666, "the mode whatever the umask");
        let names: Vec<_> = std::fs::read_dir(&run).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
    }

    #[test]
    fn a_link_at_the_temporary_name_is_not_written_through() {
        let root = tempfile::tempdir().unwrap();
        let run = root.path().join("run/e2b");
        std::fs::create_dir_all(&run).unwrap();
        let victim = root.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let temp = run.join(format!("..E2B_SANDBOX_ID.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &temp).unwrap();
        write_run_file(root.path(), ".E2B_SANDBOX_ID", "isb1", 0o644).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        let meta = std::fs::symlink_metadata(run.join(".E2B_SANDBOX_ID")).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(
            std::fs::read_to_string(run.join(".E2B_SANDBOX_ID")).unwrap(),
            "isb1"
        );
        assert!(!temp.exists() && std::fs::symlink_metadata(&temp).is_err());
    }

    #[test]
    fn a_link_at_the_run_directory_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = root.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::create_dir_all(root.path().join("run")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.path().join("run/e2b")).unwrap();
        let error = write_run_file(root.path(), ".E2B_SANDBOX_ID", "isb1", 0o644).unwrap_err();
        assert_eq!(
            error,
            "'/run/e2b' is a symbolic link, which sandboxd does not follow there"
        );
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[test]
    fn identities_with_control_characters_are_refused() {
        let opts = |instance: &str, env: &str| MmdsOpts {
            instance_id: instance.into(),
            env_id: env.into(),
            ..MmdsOpts::default()
        };
        assert_eq!(check_identity(&opts("isb1", "tpl2")), Ok(()));
        assert_eq!(check_identity(&opts("", "")), Ok(()));
        assert_eq!(check_identity(&opts("é-ü", "tpl")), Ok(()));
        assert_eq!(
            check_identity(&opts("is\0b", "tpl")),
            Err(r#"the metadata's instanceID "is\0b" has a control character"#.to_string())
        );
        assert_eq!(
            check_identity(&opts("isb", "t\npl")),
            Err(r#"the metadata's envID "t\npl" has a control character"#.to_string())
        );
        assert!(check_identity(&opts("a\u{7f}", "t")).is_err());
        assert!(check_identity(&opts("a\u{85}", "t")).is_err());
    }
}
