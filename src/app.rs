//! `App`: the daemon's state shared by every handler, and the checks every handler makes.
//! The checks answer with `auth`'s and `fs`'s own errors; a handler's `?` turns them into
//! `ApiError`s (`api::status`).
//!
//! It owns what `/init` can change at run time (the token, the default user and workdir, the
//! variables it set, the timestamp of the newest `/init` applied) behind locks held only to copy
//! a value out or to apply one `/init`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::auth::{self, AuthError, Operation, SignedQuery};
use crate::config::Config;
use crate::error::ApiError;
use crate::fs::as_user::{AsUser, Identity, SwitchError};
use crate::fs::owners::Owners;
use crate::fs::paths;
use crate::fs::users::{self, User};
use crate::fs::FsError;
use crate::http::query::Query;
use crate::http::Head;
use crate::mmds::Mmds;
use crate::platform::cgroups::Cgroups;
use crate::platform::fsfreeze::FsFreeze;
use crate::platform::init_files::SystemFiles;
use crate::platform::volumes::{Ledger, Mounted};
use crate::stats::{Metrics, Sampler};

pub struct App {
    pub config: Config,
    token: RwLock<Option<String>>,
    defaults: RwLock<Defaults>,
    /// The environment the daemon started with, less `SANDBOXD_*`.
    base_env: BTreeMap<String, String>,
    /// Variables set by the last `/init`.
    init_env: RwLock<BTreeMap<String, String>>,
    /// Variables the daemon sets itself (envd's internal ones, `E2B_EVENTS_ADDRESS`): they
    /// win over `/init`'s `envVars` of the same name, which can't change them.
    internal_env: RwLock<BTreeMap<String, String>>,
    /// The lock and order of `/init`'s system files (`platform::init_files`).
    system_files: SystemFiles,
    /// The NFS volumes `/init` mounted, and for which lifecycle (`platform::volumes`).
    pub volumes: Ledger,
    /// Unix nanoseconds of the newest `timestamp` an applied `/init` carried; its lock also
    /// serialises the applying of `/init`s.
    last_init: Mutex<Option<i128>>,
    shutting_down: AtomicBool,
    /// An authorised `/init` has been made: `/upgrade` is refused before (as envd's).
    initialized: AtomicBool,
    /// The metadata service client, with `--mmds-address`.
    pub mmds: Option<Arc<Mmds>>,
    /// `None` when /proc could not be opened; retried on the next `/metrics`.
    sampler: Mutex<Option<Sampler>>,
    /// The process cgroups and their freezer (`platform::cgroups`).
    pub cgroups: Arc<Cgroups>,
    /// `/fsfreeze`'s filesystem and the gate of the daemon's writers (`platform::fsfreeze`).
    pub fsfreeze: Arc<FsFreeze>,
}

/// The part of [`App`] that `/init`s change, as a live upgrade carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct AppState {
    pub token: Option<String>,
    pub init_env: BTreeMap<String, String>,
    pub internal_env: BTreeMap<String, String>,
    pub defaults: Defaults,
    pub last_init: Option<i128>,
    pub initialized: bool,
    /// Mount point → what was mounted there (`platform::volumes`).
    pub volumes: Vec<(String, Mounted)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    pub user: String,
    pub workdir: Option<PathBuf>,
}

impl App {
    pub fn new(config: Config, token: Option<String>, env: BTreeMap<String, String>) -> App {
        let defaults = Defaults {
            user: config.default_user.clone(),
            workdir: config.default_workdir.clone(),
        };
        App {
            token: RwLock::new(token),
            defaults: RwLock::new(defaults),
            base_env: env
                .into_iter()
                .filter(|(key, _)| !key.starts_with("SANDBOXD_"))
                .collect(),
            init_env: RwLock::new(BTreeMap::new()),
            internal_env: RwLock::new(BTreeMap::new()),
            system_files: SystemFiles::default(),
            initialized: AtomicBool::new(false),
            volumes: Ledger::default(),
            last_init: Mutex::new(None),
            shutting_down: AtomicBool::new(false),
            mmds: config
                .mmds_address
                .map(|address| Arc::new(Mmds::new(address, config.system_root.clone()))),
            sampler: Mutex::new(Sampler::new(&config.proc_root, &config.cgroup_root).ok()),
            cgroups: Arc::new(Cgroups::setup(&config)),
            fsfreeze: Arc::new(FsFreeze::new(
                config.fsfreeze_path.clone(),
                config.thaw_watchdog,
            )),
            config,
        }
    }

    pub fn token(&self) -> Option<String> {
        read(&self.token).clone()
    }

    pub fn defaults(&self) -> Defaults {
        read(&self.defaults).clone()
    }

    /// The environment of `/envs`: the start-up one overlaid with [`App::init_env`].
    pub fn environment(&self) -> BTreeMap<String, String> {
        let mut env = self.base_env.clone();
        env.extend(self.init_env());
        env
    }

    /// The variables the last `/init` set, overlaid with the daemon's internal ones (`/init`'s
    /// `E2B_EVENTS_ADDRESS`), then with the sandbox's identity from the metadata service (which
    /// wins, as envd's internal variables do): a started process gets them (SPEC §9b).
    pub fn init_env(&self) -> BTreeMap<String, String> {
        let mut env = read(&self.init_env).clone();
        env.extend(read(&self.internal_env).clone());
        if let Some(mmds) = &self.mmds {
            env.extend(mmds.environment());
        }
        env
    }

    /// Sets one of the daemon's internal variables (SPEC §9).
    pub fn set_internal_env(&self, key: &str, value: String) {
        write(&self.internal_env).insert(key.to_string(), value);
    }

    /// Records that an authorised `/init` was made.
    pub fn mark_initialized(&self) {
        self.initialized.store(true, Ordering::SeqCst);
    }

    pub fn is_initialized(&self) -> bool {
        self.initialized.load(Ordering::SeqCst)
    }

    /// What `/init`s made of the daemon's memory, for a live upgrade's handover.
    pub fn state(&self) -> AppState {
        AppState {
            token: self.token(),
            init_env: read(&self.init_env).clone(),
            internal_env: read(&self.internal_env).clone(),
            defaults: self.defaults(),
            last_init: *self.last_init.lock().unwrap_or_else(|e| e.into_inner()),
            initialized: self.is_initialized(),
            volumes: self.volumes.entries(),
        }
    }

    /// Takes back what a previous image handed over (before serving).
    pub fn restore(&self, state: AppState) {
        *write(&self.token) = state.token;
        *write(&self.init_env) = state.init_env;
        *write(&self.internal_env) = state.internal_env;
        *write(&self.defaults) = state.defaults;
        *self.last_init.lock().unwrap_or_else(|e| e.into_inner()) = state.last_init;
        self.initialized.store(state.initialized, Ordering::SeqCst);
        self.volumes.restore(state.volumes);
    }

    /// The lock and order of `/init`'s system files.
    pub fn system_files(&self) -> &SystemFiles {
        &self.system_files
    }

    /// The daemon's own `PATH`, which started processes inherit (envd's choice: of the daemon's
    /// environment, only `PATH` reaches them).
    pub fn base_path(&self) -> Option<&str> {
        self.base_env.get("PATH").map(String::as_str)
    }

    /// True when an `/init` carrying `timestamp` (Unix nanoseconds) is older than the newest one
    /// applied, and so must change nothing. Without a timestamp it never is.
    pub fn init_is_stale(&self, timestamp: Option<i128>) -> bool {
        let last = *self.last_init.lock().unwrap_or_else(|e| e.into_inner());
        matches!((timestamp, last), (Some(new), Some(last)) if new < last)
    }

    /// Applies a validated `/init` unless it has become stale meanwhile ([`App::init_is_stale`]);
    /// returns whether it was applied. A timestamp equal to the newest applies (as envd's), and
    /// an `/init` without one applies and leaves the newest as it was. Fields left `None` are
    /// unchanged; a token of `Some(None)` clears it.
    pub fn apply_init(
        &self,
        timestamp: Option<i128>,
        token: Option<Option<String>>,
        env: Option<BTreeMap<String, String>>,
        user: Option<String>,
        workdir: Option<Option<PathBuf>>,
    ) -> bool {
        let mut last = self.last_init.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(new) = timestamp {
            if last.is_some_and(|last| new < last) {
                return false;
            }
            *last = Some(new);
        }
        if let Some(env) = env {
            *write(&self.init_env) = env;
        }
        {
            let mut defaults = write(&self.defaults);
            if let Some(user) = user {
                defaults.user = user;
            }
            if let Some(workdir) = workdir {
                defaults.workdir = workdir;
            }
        }
        if let Some(token) = token {
            *write(&self.token) = token;
        }
        true
    }

    /// One resource sample (SPEC §7); 500 naming the OS error when /proc can't be read.
    pub fn sample_metrics(&self) -> Result<Metrics, ApiError> {
        let mut sampler = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
        if sampler.is_none() {
            let config = &self.config;
            let fresh = Sampler::new(&config.proc_root, &config.cgroup_root).map_err(|e| {
                ApiError::internal(format!(
                    "error opening resource sources under '{}': {e}",
                    config.proc_root.display()
                ))
            })?;
            *sampler = Some(fresh);
        }
        let Some(sampler) = sampler.as_mut() else {
            return Err(ApiError::internal("resource sampler unavailable"));
        };
        sampler
            .sample()
            .map_err(|e| ApiError::internal(format!("error reading resource usage: {e}")))
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// The `X-Access-Token` check of every route but `/health` and `/files`.
    pub fn require_token(&self, head: &Head) -> Result<(), AuthError> {
        auth::check_token(read(&self.token).as_deref(), head.header("x-access-token"))
    }

    /// The check of `/files`: the header token, or a URL signed for `operation` over the raw
    /// `path` and `username` query values.
    pub fn require_file_access(
        &self,
        head: &Head,
        query: &Query,
        operation: Operation,
        now_unix: i64,
    ) -> Result<(), AuthError> {
        let signed = SignedQuery {
            path: query.get("path").unwrap_or(""),
            username: query.get("username").unwrap_or(""),
            signature: query.get("signature"),
            expiration: query.get("signature_expiration"),
        };
        let token = read(&self.token);
        auth::check_file_access(
            token.as_deref(),
            head.header("x-access-token"),
            &signed,
            operation,
            now_unix,
        )
    }

    /// The user named by `username` (the default user when absent or empty) and the workdir in
    /// force, both from one reading of the defaults, so a concurrent `/init` cannot mix them.
    pub fn resolver(&self, username: Option<&str>) -> Result<Resolver, FsError> {
        let defaults = self.defaults();
        let name = match username {
            Some(name) if !name.is_empty() => name,
            _ => defaults.user.as_str(),
        };
        Ok(Resolver {
            user: users::lookup(&self.config.passwd_file, name)?,
            workdir: defaults.workdir,
        })
    }
}

impl App {
    /// Whom a file call for `user` acts as: with `--fs-as-user` the user's identity, without
    /// it `None` (the daemon's own, root, as envd).
    pub fn identity(&self, user: &User) -> Option<Identity> {
        self.config
            .fs_as_user
            .then(|| Identity::of(user, &Owners::current(&self.config.passwd_file)))
    }

    /// With `--fs-as-user`, switches the calling thread to `user`'s filesystem credentials
    /// until the guard is dropped (`fs::as_user`); without it, `None` and nothing changes.
    pub fn as_user(&self, user: &User) -> Result<Option<AsUser>, SwitchError> {
        self.identity(user).map(|who| who.enter()).transpose()
    }

    /// [`App::as_user`], the groups from the user database the request already read.
    pub fn as_user_with(
        &self,
        user: &User,
        owners: &Owners,
    ) -> Result<Option<AsUser>, SwitchError> {
        self.config
            .fs_as_user
            .then(|| Identity::of(user, owners).enter())
            .transpose()
    }
}

/// Resolves a request's paths for its user (SPEC §4).
pub struct Resolver {
    pub user: User,
    workdir: Option<PathBuf>,
}

impl Resolver {
    pub fn resolve(&self, raw: &str) -> Result<PathBuf, FsError> {
        paths::resolve(raw, &self.user, self.workdir.as_deref())
    }
}

/// Decodes the query of `head`; a parameter that is not UTF-8 is a 400 naming it.
pub fn query(head: &Head) -> Result<Query, ApiError> {
    Query::parse(head.raw_query()).map_err(|e| {
        ApiError::bad_request(format!(
            "invalid query parameter '{}': not valid UTF-8",
            e.name
        ))
    })
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}
