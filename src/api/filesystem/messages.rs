//! The messages of envd's `filesystem.Filesystem` service (its `filesystem.proto`), written
//! here in this project's words with envd's field names; proto3 JSON by `connect::json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::connect::json;
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
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: FileType,
    pub path: String,
    #[serde(serialize_with = "json::int64::serialize")]
    pub size: i64,
    /// The permission bits (of the target, for a link).
    pub mode: u32,
    /// As Go's `FileMode.String()` prints the entry itself: `-rw-r--r--`, `drwxr-xr-x`,
    /// `Lrwxrwxrwx`.
    pub permissions: String,
    pub owner: String,
    pub group: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// `user.e2b.*` extended attributes, without the prefix.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PathRequest {
    pub path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ListDirRequest {
    pub path: String,
    #[serde(deserialize_with = "json::integer::deserialize")]
    pub depth: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MoveRequest {
    pub source: String,
    pub destination: String,
}

/// The answer of Stat, MakeDir and Move.
#[derive(Debug, Serialize)]
pub struct EntryResponse {
    pub entry: EntryInfo,
}

#[derive(Debug, Serialize)]
pub struct ListDirResponse {
    pub entries: Vec<EntryInfo>,
}

/// Remove's answer, and any other empty message.
#[derive(Debug, Serialize)]
pub struct Empty {}
