//! The test's own protobuf messages, written from envd's `filesystem.proto` and
//! `process.proto` (field numbers, types, `oneof`s and enums are the wire contract) with
//! `prost`'s derive: what the tests decode sandboxd's answers with, independently of the
//! daemon's types. Only what the tests read or send is here.

// The derives write the trait impls; the structs are only built and read by the tests.
#![allow(dead_code)]

use std::collections::BTreeMap;

/// `google.protobuf.Timestamp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

pub mod filesystem {
    use super::{BTreeMap, Timestamp};

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum FileType {
        Unspecified = 0,
        File = 1,
        Directory = 2,
        Symlink = 3,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum EventType {
        Unspecified = 0,
        Create = 1,
        Write = 2,
        Remove = 3,
        Rename = 4,
        Chmod = 5,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EntryInfo {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(enumeration = "FileType", tag = "2")]
        pub r#type: i32,
        #[prost(string, tag = "3")]
        pub path: String,
        #[prost(int64, tag = "4")]
        pub size: i64,
        #[prost(uint32, tag = "5")]
        pub mode: u32,
        #[prost(string, tag = "6")]
        pub permissions: String,
        #[prost(string, tag = "7")]
        pub owner: String,
        #[prost(string, tag = "8")]
        pub group: String,
        #[prost(message, optional, tag = "9")]
        pub modified_time: Option<Timestamp>,
        #[prost(string, optional, tag = "10")]
        pub symlink_target: Option<String>,
        #[prost(btree_map = "string, string", tag = "11")]
        pub metadata: BTreeMap<String, String>,
    }

    /// `StatResponse`, `MakeDirResponse` and `MoveResponse`: one entry, field 1.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EntryResponse {
        #[prost(message, optional, tag = "1")]
        pub entry: Option<EntryInfo>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListDirResponse {
        #[prost(message, repeated, tag = "1")]
        pub entries: Vec<EntryInfo>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FilesystemEvent {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(enumeration = "EventType", tag = "2")]
        pub r#type: i32,
        #[prost(message, optional, tag = "3")]
        pub entry: Option<EntryInfo>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Empty {}

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum WatchEvent {
        #[prost(message, tag = "1")]
        Start(Empty),
        #[prost(message, tag = "2")]
        Filesystem(Box<FilesystemEvent>),
        #[prost(message, tag = "3")]
        Keepalive(Empty),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchDirResponse {
        #[prost(oneof = "WatchEvent", tags = "1, 2, 3")]
        pub event: Option<WatchEvent>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateWatcherResponse {
        #[prost(string, tag = "1")]
        pub watcher_id: String,
    }

    /// `GetWatcherEventsRequest` and `RemoveWatcherRequest`: the watcher id, field 1.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatcherRequest {
        #[prost(string, tag = "1")]
        pub watcher_id: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetWatcherEventsResponse {
        #[prost(message, repeated, tag = "1")]
        pub events: Vec<FilesystemEvent>,
    }

    /// `StatRequest` (and the other requests with only a path, field 1).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PathRequest {
        #[prost(string, tag = "1")]
        pub path: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListDirRequest {
        #[prost(string, tag = "1")]
        pub path: String,
        #[prost(uint32, tag = "2")]
        pub depth: u32,
    }
}

pub mod process {
    use super::BTreeMap;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Signal {
        Unspecified = 0,
        Sigterm = 15,
        Sigkill = 9,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Size {
        #[prost(uint32, tag = "1")]
        pub cols: u32,
        #[prost(uint32, tag = "2")]
        pub rows: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Pty {
        #[prost(message, optional, tag = "1")]
        pub size: Option<Size>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessConfig {
        #[prost(string, tag = "1")]
        pub cmd: String,
        #[prost(string, repeated, tag = "2")]
        pub args: Vec<String>,
        #[prost(btree_map = "string, string", tag = "3")]
        pub envs: BTreeMap<String, String>,
        #[prost(string, optional, tag = "4")]
        pub cwd: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StartRequest {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessConfig>,
        #[prost(message, optional, tag = "2")]
        pub pty: Option<Pty>,
        #[prost(string, optional, tag = "3")]
        pub tag: Option<String>,
        #[prost(bool, optional, tag = "4")]
        pub stdin: Option<bool>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessInfo {
        #[prost(message, optional, tag = "1")]
        pub config: Option<ProcessConfig>,
        #[prost(uint32, tag = "2")]
        pub pid: u32,
        #[prost(string, optional, tag = "3")]
        pub tag: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListResponse {
        #[prost(message, repeated, tag = "1")]
        pub processes: Vec<ProcessInfo>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StartEvent {
        #[prost(uint32, tag = "1")]
        pub pid: u32,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Output {
        #[prost(bytes, tag = "1")]
        Stdout(Vec<u8>),
        #[prost(bytes, tag = "2")]
        Stderr(Vec<u8>),
        #[prost(bytes, tag = "3")]
        Pty(Vec<u8>),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DataEvent {
        #[prost(oneof = "Output", tags = "1, 2, 3")]
        pub output: Option<Output>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EndEvent {
        #[prost(sint32, tag = "1")]
        pub exit_code: i32,
        #[prost(bool, tag = "2")]
        pub exited: bool,
        #[prost(string, tag = "3")]
        pub status: String,
        #[prost(string, optional, tag = "4")]
        pub error: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeepAlive {}

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Event {
        #[prost(message, tag = "1")]
        Start(StartEvent),
        #[prost(message, tag = "2")]
        Data(DataEvent),
        #[prost(message, tag = "3")]
        End(EndEvent),
        #[prost(message, tag = "4")]
        Keepalive(KeepAlive),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessEvent {
        #[prost(oneof = "Event", tags = "1, 2, 3, 4")]
        pub event: Option<Event>,
    }

    /// `StartResponse` and `ConnectResponse`: the event, field 1.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EventResponse {
        #[prost(message, optional, tag = "1")]
        pub event: Option<ProcessEvent>,
    }
}
