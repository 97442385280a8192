//! The binary answers of every method written in proto3's JSON form (camelCase names, enums
//! by name, int64 as strings, bytes in base64), by the test, from its own decoded messages:
//! so one answer in each codec can be compared field by field (`normalize` drops what
//! differs between two runs, and what proto3 JSON may leave out).

use std::path::Path;

use serde_json::{json, Map, Value};

use super::client::decode;
use super::messages::filesystem::{
    CreateWatcherResponse, EntryInfo, EntryResponse, EventType, FileType, FilesystemEvent,
    GetWatcherEventsResponse, ListDirResponse, WatchDirResponse, WatchEvent,
};
use super::messages::process::{Event, EventResponse, ListResponse, Output, ProcessInfo};

fn b64(bytes: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(bytes)
}

/// A unary answer of `method` (`filesystem.Filesystem/Stat`, ...) as proto3 JSON.
pub fn unary(method: &str, bytes: &[u8]) -> Value {
    match method.rsplit('/').next().unwrap_or("") {
        "Stat" | "MakeDir" | "Move" => match decode::<EntryResponse>(bytes).entry {
            Some(e) => json!({"entry": entry(&e)}),
            None => json!({}),
        },
        "ListDir" => {
            let entries = decode::<ListDirResponse>(bytes).entries;
            json!({"entries": entries.iter().map(entry).collect::<Vec<_>>()})
        }
        "CreateWatcher" => {
            json!({"watcherId": decode::<CreateWatcherResponse>(bytes).watcher_id})
        }
        "GetWatcherEvents" => {
            let events = decode::<GetWatcherEventsResponse>(bytes).events;
            json!({"events": events.iter().map(fs_event).collect::<Vec<_>>()})
        }
        "List" => {
            let processes = decode::<ListResponse>(bytes).processes;
            json!({"processes": processes.iter().map(process).collect::<Vec<_>>()})
        }
        // The empty answers (Remove, RemoveWatcher, SendInput, StreamInput, CloseStdin,
        // Update, SendSignal): any field in them would be one the test does not know.
        _ => {
            assert!(
                bytes.is_empty(),
                "{method}: an empty message, got {bytes:?}"
            );
            json!({})
        }
    }
}

/// A message of a server stream of `method` as proto3 JSON.
pub fn streamed(method: &str, bytes: &[u8]) -> Value {
    match method.rsplit('/').next().unwrap_or("") {
        "WatchDir" => match decode::<WatchDirResponse>(bytes).event {
            Some(WatchEvent::Start(_)) => json!({"start": {}}),
            Some(WatchEvent::Filesystem(e)) => json!({"filesystem": fs_event(&e)}),
            Some(WatchEvent::Keepalive(_)) => json!({"keepalive": {}}),
            None => json!({}),
        },
        "Start" | "Connect" => {
            let event = decode::<EventResponse>(bytes).event.and_then(|e| e.event);
            let event = match event {
                Some(Event::Start(s)) => json!({"start": {"pid": s.pid}}),
                Some(Event::Data(d)) => match d.output {
                    Some(Output::Stdout(b)) => json!({"data": {"stdout": b64(&b)}}),
                    Some(Output::Stderr(b)) => json!({"data": {"stderr": b64(&b)}}),
                    Some(Output::Pty(b)) => json!({"data": {"pty": b64(&b)}}),
                    None => json!({"data": {}}),
                },
                Some(Event::End(e)) => {
                    let mut end = json!({"exitCode": e.exit_code, "exited": e.exited,
                                         "status": e.status});
                    if let Some(error) = e.error {
                        end["error"] = json!(error);
                    }
                    json!({ "end": end })
                }
                Some(Event::Keepalive(_)) => json!({"keepalive": {}}),
                None => json!({}),
            };
            json!({ "event": event })
        }
        _ => unary(method, bytes),
    }
}

fn entry(e: &EntryInfo) -> Value {
    let kind = match FileType::try_from(e.r#type) {
        Ok(FileType::File) => "FILE_TYPE_FILE",
        Ok(FileType::Directory) => "FILE_TYPE_DIRECTORY",
        Ok(FileType::Symlink) => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    };
    let mut out = json!({
        "name": e.name, "type": kind, "path": e.path, "size": e.size.to_string(),
        "mode": e.mode, "permissions": e.permissions, "owner": e.owner, "group": e.group,
        "metadata": e.metadata,
    });
    if let Some(time) = &e.modified_time {
        out["modifiedTime"] = json!(format!("{}s{}ns", time.seconds, time.nanos));
    }
    if let Some(target) = &e.symlink_target {
        out["symlinkTarget"] = json!(target);
    }
    out
}

fn fs_event(e: &FilesystemEvent) -> Value {
    let kind = match EventType::try_from(e.r#type) {
        Ok(EventType::Create) => "EVENT_TYPE_CREATE",
        Ok(EventType::Write) => "EVENT_TYPE_WRITE",
        Ok(EventType::Remove) => "EVENT_TYPE_REMOVE",
        Ok(EventType::Rename) => "EVENT_TYPE_RENAME",
        Ok(EventType::Chmod) => "EVENT_TYPE_CHMOD",
        _ => "EVENT_TYPE_UNSPECIFIED",
    };
    let mut out = json!({"name": e.name, "type": kind});
    if let Some(entry_info) = &e.entry {
        out["entry"] = entry(entry_info);
    }
    out
}

fn process(p: &ProcessInfo) -> Value {
    let mut out = json!({"pid": p.pid});
    if let Some(config) = &p.config {
        let mut c = json!({"cmd": config.cmd, "args": config.args, "envs": config.envs});
        if let Some(cwd) = &config.cwd {
            c["cwd"] = json!(cwd);
        }
        out["config"] = c;
    }
    if let Some(tag) = &p.tag {
        out["tag"] = json!(tag);
    }
    out
}

/// `value` with what two runs of the same calls may not share made equal, and the fields
/// proto3 JSON may leave out (false, 0, "", "0", [], an empty `envs` or `metadata`) left out:
/// pids, times and watcher ids masked, `home` written `~`.
pub fn normalize(value: &Value, home: &Path) -> Value {
    let home = home.to_string_lossy();
    normalized(value, &home)
}

fn normalized(value: &Value, home: &str) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, v) in map {
                let v = match key.as_str() {
                    "pid" if v.as_u64().unwrap_or(0) > 0 => json!("<pid>"),
                    "modifiedTime" => json!("<time>"),
                    "watcherId" if v.as_str().is_some_and(|s| !s.is_empty()) => {
                        json!("<watcher id>")
                    }
                    _ => normalized(v, home),
                };
                let empty_map = matches!(key.as_str(), "envs" | "metadata")
                    && v.as_object().is_some_and(Map::is_empty);
                let default = matches!(&v, Value::Null | Value::Bool(false))
                    || v.as_i64() == Some(0)
                    || v.as_str().is_some_and(|s| s.is_empty() || s == "0")
                    || v.as_array().is_some_and(Vec::is_empty);
                if !default && !empty_map {
                    out.insert(key.clone(), v);
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| normalized(v, home)).collect()),
        Value::String(s) => match s.strip_prefix(home) {
            Some(rest) => json!(format!("~{rest}")),
            None => value.clone(),
        },
        other => other.clone(),
    }
}
