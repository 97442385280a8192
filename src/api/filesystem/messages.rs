//! The messages of envd's `filesystem.Filesystem` service (its `filesystem.proto`), written
//! here in this project's words with envd's field names and numbers: each type is both the
//! protobuf message (`prost`) and its proto3 JSON form (serde, `connect::json`'s rules).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::connect::json::{self, Timestamp};
use crate::proto_enum;

proto_enum!(
    /// What an entry is; a symlink is reported as what it points to.
    FileType {
        Unspecified = 0 => "FILE_TYPE_UNSPECIFIED",
        File = 1 => "FILE_TYPE_FILE",
        Directory = 2 => "FILE_TYPE_DIRECTORY",
        Symlink = 3 => "FILE_TYPE_SYMLINK",
    }
);

/// One file, directory or link (`EntryInfo`).
#[derive(Clone, PartialEq, Serialize, prost::Message)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(enumeration = "FileType", tag = "2")]
    #[serde(rename = "type", serialize_with = "FileType::to_json")]
    pub kind: i32,
    #[prost(string, tag = "3")]
    pub path: String,
    #[prost(int64, tag = "4")]
    #[serde(serialize_with = "json::int64::serialize")]
    pub size: i64,
    /// The permission bits (of the target, for a link).
    #[prost(uint32, tag = "5")]
    pub mode: u32,
    /// As Go's `FileMode.String()` prints the entry itself: `-rw-r--r--`, `drwxr-xr-x`,
    /// `Lrwxrwxrwx`.
    #[prost(string, tag = "6")]
    pub permissions: String,
    #[prost(string, tag = "7")]
    pub owner: String,
    #[prost(string, tag = "8")]
    pub group: String,
    #[prost(message, optional, tag = "9")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified_time: Option<Timestamp>,
    #[prost(string, optional, tag = "10")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// `user.e2b.*` extended attributes, without the prefix.
    #[prost(btree_map = "string, string", tag = "11")]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// `StatRequest`, `MakeDirRequest`, `RemoveRequest`.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct PathRequest {
    #[prost(string, tag = "1")]
    pub path: String,
}

#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct ListDirRequest {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(uint32, tag = "2")]
    #[serde(deserialize_with = "json::integer::deserialize")]
    pub depth: u32,
}

#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct MoveRequest {
    #[prost(string, tag = "1")]
    pub source: String,
    #[prost(string, tag = "2")]
    pub destination: String,
}

/// The answer of Stat, MakeDir and Move (`StatResponse`, ...).
#[derive(Clone, PartialEq, Serialize, prost::Message)]
pub struct EntryResponse {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

#[derive(Clone, PartialEq, Serialize, prost::Message)]
pub struct ListDirResponse {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<EntryInfo>,
}

/// Remove's answer, and any other empty message.
#[derive(Clone, PartialEq, Serialize, Deserialize, prost::Message)]
pub struct Empty {}
