//! The handover: what one image tells the next across a live upgrade's `execve`, as protobuf
//! (prost), so that images of different versions read each other's.
//!
//! Versioning follows envd's handover rule: every field is additive (a reader skips fields it
//! does not know and takes absent ones as their defaults), and `schema` names the layout. A
//! writer stamps the lowest schema that carries what it wrote; a reader refuses a schema above
//! [`SCHEMA`], the highest it understands, rather than misread a newer layout (the old image,
//! told by the failed start, is gone by then: see the module `upgrade` for what happens).

use std::collections::BTreeMap;
use std::path::PathBuf;

use prost::Message;

use crate::app::{AppState, Defaults};
use crate::platform::volumes::Mounted;

/// The highest layout this build reads and the one it writes.
pub const SCHEMA: u32 = 1;

/// The whole handover (schema 1).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Handover {
    #[prost(uint32, tag = "1")]
    pub schema: u32,
    /// The handing image's `-version` (envd level) and own version.
    #[prost(string, tag = "2")]
    pub from_envd_version: String,
    #[prost(string, tag = "3")]
    pub from_version: String,
    /// The number of the listening socket's descriptor in the new image.
    #[prost(int32, tag = "4")]
    pub listener_fd: i32,
    #[prost(string, optional, tag = "5")]
    pub token: Option<String>,
    #[prost(btree_map = "string, string", tag = "6")]
    pub init_env: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "7")]
    pub internal_env: BTreeMap<String, String>,
    #[prost(string, tag = "8")]
    pub default_user: String,
    #[prost(string, optional, tag = "9")]
    pub default_workdir: Option<String>,
    /// The newest applied `/init`'s timestamp, Unix nanoseconds (saturated to i64).
    #[prost(sint64, optional, tag = "10")]
    pub last_init: Option<i64>,
    #[prost(bool, tag = "11")]
    pub initialized: bool,
    #[prost(message, repeated, tag = "12")]
    pub mounts: Vec<MountEntry>,
    /// Every descriptor number the parts below name (`upgrade::carry`), claimed at start.
    #[prost(int32, repeated, tag = "13")]
    pub carried_fds: Vec<i32>,
    /// The process table (`proc::handover`).
    #[prost(message, repeated, tag = "14")]
    pub processes: Vec<crate::proc::handover::CarriedProcess>,
    /// Exits remembered for a late `Connect`.
    #[prost(message, repeated, tag = "15")]
    pub exits: Vec<crate::proc::handover::CarriedExit>,
    /// The `CreateWatcher` watchers (`api::filesystem::watch_carry`).
    #[prost(message, repeated, tag = "16")]
    pub watchers: Vec<crate::api::filesystem::watch_carry::CarriedWatcher>,
    /// The port forwarder's listeners and relayed connections (`platform::forward::handover`).
    #[prost(message, repeated, tag = "17")]
    pub forwards: Vec<crate::platform::forward::handover::CarriedForward>,
    /// A freeze in effect (`platform::cgroups`).
    #[prost(message, optional, tag = "18")]
    pub freeze: Option<crate::platform::cgroups::CarriedFreeze>,
    /// Log lines the exporter had not sent yet (`log::export`), oldest first.
    #[prost(bytes = "vec", repeated, tag = "19")]
    pub log_lines: Vec<Vec<u8>>,
    /// The descriptor the new image was executed from (one of `carried_fds`), open across the
    /// `execve` for a script's interpreter; the new image closes it. Absent (an older writer,
    /// or a reader that skips it): closed with whatever no part takes back.
    #[prost(int32, optional, tag = "20")]
    pub binary_fd: Option<i32>,
}

/// One NFS volume of the ledger (`platform::volumes`), as envd's `MountEntry`, with the
/// identity of the mounted root (absent from images before it was recorded).
#[derive(Clone, PartialEq, prost::Message)]
pub struct MountEntry {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(string, tag = "2")]
    pub lifecycle_id: String,
    #[prost(uint64, optional, tag = "3")]
    pub root_dev: Option<u64>,
    #[prost(uint64, optional, tag = "4")]
    pub root_ino: Option<u64>,
}

impl Handover {
    /// The handover of `state`, the listener to be found at `listener_fd`.
    pub fn of(state: AppState, listener_fd: i32) -> Handover {
        Handover {
            schema: SCHEMA,
            from_envd_version: crate::ENVD_VERSION.to_string(),
            from_version: env!("CARGO_PKG_VERSION").to_string(),
            listener_fd,
            token: state.token,
            init_env: state.init_env,
            internal_env: state.internal_env,
            default_user: state.defaults.user,
            default_workdir: state
                .defaults
                .workdir
                .map(|dir| dir.to_string_lossy().into_owned()),
            last_init: state
                .last_init
                .map(|nanos| i64::try_from(nanos).unwrap_or(i64::MAX)),
            initialized: state.initialized,
            mounts: state
                .volumes
                .into_iter()
                .map(|(path, mounted)| MountEntry {
                    path,
                    lifecycle_id: mounted.lifecycle,
                    root_dev: mounted.root.map(|(dev, _)| dev),
                    root_ino: mounted.root.map(|(_, ino)| ino),
                })
                .collect(),
            ..Handover::default()
        }
    }

    /// Decodes a handover, refusing a layout newer than this build reads.
    pub fn decode_checked(bytes: &[u8]) -> Result<Handover, String> {
        let handover = Handover::decode(bytes).map_err(|e| format!("not a handover: {e}"))?;
        if handover.schema > SCHEMA {
            return Err(format!(
                "handover schema {} is newer than the highest this build reads ({SCHEMA})",
                handover.schema
            ));
        }
        Ok(handover)
    }

    /// The daemon's state it carries.
    pub fn app_state(&self) -> AppState {
        AppState {
            token: self.token.clone(),
            init_env: self.init_env.clone(),
            internal_env: self.internal_env.clone(),
            defaults: Defaults {
                user: self.default_user.clone(),
                workdir: self.default_workdir.as_ref().map(PathBuf::from),
            },
            last_init: self.last_init.map(i128::from),
            initialized: self.initialized,
            volumes: self
                .mounts
                .iter()
                .map(|m| {
                    let mounted = Mounted {
                        lifecycle: m.lifecycle_id.clone(),
                        root: m.root_dev.zip(m.root_ino),
                    };
                    (m.path.clone(), mounted)
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> AppState {
        AppState {
            token: Some("tok".into()),
            init_env: BTreeMap::from([("A".into(), "1".into())]),
            internal_env: BTreeMap::from([("E2B_EVENTS_ADDRESS".into(), "http://x".into())]),
            defaults: Defaults {
                user: "user".into(),
                workdir: Some(PathBuf::from("/home/user")),
            },
            last_init: Some(1_700_000_000_000_000_000),
            initialized: true,
            volumes: vec![
                (
                    "/mnt/data".into(),
                    Mounted {
                        lifecycle: "life".into(),
                        root: Some((64, 1)),
                    },
                ),
                (
                    "/mnt/old".into(),
                    Mounted {
                        lifecycle: "".into(),
                        root: None,
                    },
                ),
            ],
        }
    }

    #[test]
    fn the_state_round_trips() {
        let handover = Handover::of(state(), 200);
        let back = Handover::decode_checked(&handover.encode_to_vec()).unwrap();
        assert_eq!(back.listener_fd, 200);
        assert_eq!(back.app_state(), state());
    }

    #[test]
    fn a_newer_layout_is_refused_and_unknown_fields_skipped() {
        let mut handover = Handover::of(state(), 200);
        handover.schema = SCHEMA + 1;
        let error = Handover::decode_checked(&handover.encode_to_vec()).unwrap_err();
        assert_eq!(
            error,
            "handover schema 2 is newer than the highest this build reads (1)"
        );
        // A field a later layout adds (tag 99, a string) is skipped by this reader.
        let mut bytes = Handover::of(state(), 7).encode_to_vec();
        bytes.extend_from_slice(&[0x9a, 0x06, 3, b'n', b'e', b'w']);
        assert_eq!(Handover::decode_checked(&bytes).unwrap().listener_fd, 7);
        assert!(Handover::decode_checked(b"\xff\xff").is_err());
    }
}
