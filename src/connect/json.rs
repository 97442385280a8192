//! proto3's JSON mapping, for the message types the services write in this project's words:
//! field names in lowerCamelCase (`#[serde(rename_all = "camelCase")]` on each message), absent
//! fields default (`#[serde(default)]`), unknown fields ignored (serde's default), and here the
//! types whose JSON form differs from serde's: 64-bit integers as strings ([`int64`],
//! [`uint64`]), `bytes` as base64 ([`bytes`]), enums by name ([`proto_enum!`]) and
//! `google.protobuf.Timestamp` as RFC 3339 ([`timestamp`]).

use base64_simd::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use serde::de::{self, Deserializer, Visitor};
use serde::Serializer;
use std::fmt;

use crate::http::date::civil_from_days;

/// A proto enum: its Rust type (a `prost::Enumeration`, so a message's field of it is the
/// `i32` protobuf carries, open to numbers this daemon does not know), and the JSON form of
/// such a field: written by name (a number no variant has, as the number), read by name or by
/// number (both are valid proto3 JSON). A field declares
/// `#[serde(serialize_with = "FileType::to_json", deserialize_with = "FileType::from_json")]`.
/// `proto_enum!(FileType { Unspecified = 0 => "FILE_TYPE_UNSPECIFIED", ... })`.
#[macro_export]
macro_rules! proto_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $number:literal => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
        #[repr(i32)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $number),+
        }

        #[allow(dead_code)]
        impl $name {
            /// The name on the wire.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            /// The value of a name or number, if it is one of this enum's.
            pub fn from_wire(value: &$crate::connect::json::EnumValue) -> Option<$name> {
                match value {
                    $crate::connect::json::EnumValue::Name(name) => match name.as_str() {
                        $($text => Some($name::$variant),)+
                        _ => None,
                    },
                    $crate::connect::json::EnumValue::Number(number) => match number {
                        $($number => Some($name::$variant),)+
                        _ => None,
                    },
                }
            }

            /// Writes a field of this enum: its name, or a number no variant has as it is.
            pub fn to_json<S: serde::Serializer>(value: &i32, serializer: S) -> Result<S::Ok, S::Error> {
                match $name::try_from(*value) {
                    Ok(known) => serializer.serialize_str(known.as_str()),
                    Err(_) => serializer.serialize_i32(*value),
                }
            }

            /// Reads a field of this enum by name or number; anything else is refused.
            pub fn from_json<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
                let value = <$crate::connect::json::EnumValue as serde::Deserialize>::deserialize(deserializer)?;
                $name::from_wire(&value).map(|known| known as i32).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "{value} is not a value of {}",
                        stringify!($name)
                    ))
                })
            }
        }
    };
}

/// An enum field as received: a name or a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnumValue {
    Name(String),
    Number(i64),
}

impl fmt::Display for EnumValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnumValue::Name(name) => write!(f, "'{name}'"),
            EnumValue::Number(number) => write!(f, "{number}"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for EnumValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EnumVisitor;
        impl Visitor<'_> for EnumVisitor {
            type Value = EnumValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an enum name or number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<EnumValue, E> {
                Ok(EnumValue::Name(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<EnumValue, E> {
                Ok(EnumValue::Number(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<EnumValue, E> {
                i64::try_from(v)
                    .map(EnumValue::Number)
                    .map_err(|_| E::custom("enum number out of range"))
            }
        }
        deserializer.deserialize_any(EnumVisitor)
    }
}

/// Reads an integer sent as a JSON number or a decimal string, as proto3 JSON allows.
fn integer<'de, D: Deserializer<'de>, T: TryFrom<i128>>(deserializer: D) -> Result<T, D::Error> {
    struct IntegerVisitor;
    impl Visitor<'_> for IntegerVisitor {
        type Value = i128;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an integer, as a number or a string")
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<i128, E> {
            Ok(i128::from(v))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<i128, E> {
            Ok(i128::from(v))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<i128, E> {
            // 1e3 is a valid integer in proto3 JSON; 1.5 is not. The range check is the caller's.
            if v.fract() == 0.0 && v.abs() < 1e38 {
                #[allow(clippy::cast_possible_truncation)]
                Ok(v as i128)
            } else {
                Err(E::custom(format!("{v} is not an integer")))
            }
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<i128, E> {
            v.trim()
                .parse::<i128>()
                .map_err(|_| E::custom(format!("'{v}' is not an integer")))
        }
    }
    let value = deserializer.deserialize_any(IntegerVisitor)?;
    T::try_from(value).map_err(|_| de::Error::custom(format!("{value} is out of range")))
}

/// `int64`: written as a decimal string (read with [`integer`]).
pub mod int64 {
    use super::*;

    pub fn serialize<S: Serializer>(value: &i64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }
}

/// Any integer field: proto3 JSON readers take a number (`1e3` too) or a decimal string.
pub mod integer {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>, T: TryFrom<i128>>(
        deserializer: D,
    ) -> Result<T, D::Error> {
        integer(deserializer)
    }
}

/// `bytes`, as proto3 JSON readers take it: standard or URL-safe base64, with or without
/// padding.
pub mod bytes {
    use super::*;

    /// Decodes any of the four base64 alphabets proto3 JSON readers accept.
    pub fn decode(text: &str) -> Option<Vec<u8>> {
        [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
            .iter()
            .find_map(|engine| engine.decode_to_vec(text).ok())
    }

    /// Writes standard base64 with padding, as proto3 JSON writers do.
    pub fn serialize<S: Serializer>(value: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode_to_string(value))
    }
}

/// `google.protobuf.Timestamp`: protobuf's seconds and nanoseconds as they are, and in JSON the
/// string of [`timestamp`].
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl serde::Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let nanos = u32::try_from(self.nanos).unwrap_or(0);
        serializer.serialize_str(&timestamp(self.seconds, nanos))
    }
}

/// `google.protobuf.Timestamp` as proto3 JSON writes it: RFC 3339 in UTC with `Z`, and 0, 3, 6
/// or 9 fractional digits (as few as the value needs). A time outside the type's range (years 1
/// to 9999; a file's mtime can be anything) is written as the nearest end of it: a reader
/// would refuse a year of five digits or a sign, and with it the whole answer.
pub fn timestamp(seconds: i64, nanos: u32) -> String {
    /// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z.
    const FIRST: i64 = -62_135_596_800;
    const LAST: i64 = 253_402_300_799;
    let (seconds, nanos) = if seconds < FIRST {
        (FIRST, 0)
    } else if seconds > LAST {
        (LAST, 999_999_999)
    } else {
        (seconds, nanos)
    };
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    let time = seconds.rem_euclid(86_400);
    let mut text = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        time / 3600,
        time / 60 % 60,
        time % 60
    );
    let nanos = nanos.min(999_999_999);
    if nanos != 0 {
        if nanos.is_multiple_of(1_000_000) {
            text.push_str(&format!(".{:03}", nanos / 1_000_000));
        } else if nanos.is_multiple_of(1_000) {
            text.push_str(&format!(".{:06}", nanos / 1_000));
        } else {
            text.push_str(&format!(".{nanos:09}"));
        }
    }
    text.push('Z');
    text
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    crate::proto_enum!(Kind {
        Unspecified = 0 => "KIND_UNSPECIFIED",
        File = 1 => "KIND_FILE",
    });

    #[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
    #[serde(rename_all = "camelCase", default)]
    struct Message {
        #[serde(
            serialize_with = "int64::serialize",
            deserialize_with = "integer::deserialize"
        )]
        size: i64,
        #[serde(skip_serializing, deserialize_with = "integer::deserialize")]
        big: u64,
        #[serde(serialize_with = "Kind::to_json", deserialize_with = "Kind::from_json")]
        kind: i32,
        symlink_target: Option<String>,
    }

    #[test]
    fn messages_follow_proto3_json() {
        let message = Message {
            size: -5,
            kind: Kind::File.into(),
            ..Message::default()
        };
        let json = serde_json::to_value(&message).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"size": "-5", "kind": "KIND_FILE", "symlinkTarget": null})
        );
        let read: Message = serde_json::from_value(json).unwrap();
        assert_eq!(read, message);
    }

    #[test]
    fn an_enum_number_no_variant_has_is_written_as_a_number() {
        let message = Message {
            kind: 7,
            ..Message::default()
        };
        let json = serde_json::to_value(&message).unwrap();
        assert_eq!(json["kind"], 7);
    }

    #[test]
    fn readers_accept_every_valid_form() {
        let read: Message = serde_json::from_str(
            r#"{"size":12,"big":"18446744073709551615","kind":1,"unknown":{"x":[1]}}"#,
        )
        .unwrap();
        assert_eq!(
            (read.size, read.big, read.kind),
            (12, u64::MAX, Kind::File as i32)
        );
        let read: Message = serde_json::from_str(r#"{"size":"1e3"}"#).unwrap_or_default();
        assert_eq!(read.size, 0, "a string exponent is not an integer");
        let read: Message = serde_json::from_str(r#"{"size":1e3}"#).unwrap();
        assert_eq!(read.size, 1000);
        let absent: Message = serde_json::from_str("{}").unwrap();
        assert_eq!(absent, Message::default());
    }

    #[test]
    fn bad_values_are_errors() {
        for bad in [
            r#"{"size":1.5}"#,
            r#"{"big":-1}"#,
            r#"{"size":"x"}"#,
            r#"{"kind":"KIND_OTHER"}"#,
            r#"{"kind":7}"#,
        ] {
            assert!(serde_json::from_str::<Message>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bytes_are_read_in_every_base64_form() {
        for text in ["+/8=", "+/8", "-_8=", "-_8"] {
            assert_eq!(bytes::decode(text), Some(vec![0xfb, 0xff]), "{text}");
        }
        for bad in ["***", "+/8==", "+"] {
            assert_eq!(bytes::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn timestamps_use_as_few_fraction_digits_as_needed() {
        assert_eq!(timestamp(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(
            timestamp(1_700_000_000, 123_000_000),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(
            timestamp(1_700_000_000, 123_456_000),
            "2023-11-14T22:13:20.123456Z"
        );
        assert_eq!(
            timestamp(1_700_000_000, 1),
            "2023-11-14T22:13:20.000000001Z"
        );
        assert_eq!(timestamp(-1, 0), "1969-12-31T23:59:59Z");
        // Found by the connect_json fuzz target: outside years 1 to 9999, the nearest end.
        assert_eq!(
            timestamp(-957_813_436_539, 5),
            "0001-01-01T00:00:00Z",
            "was -28381-03-26T19:44:21..."
        );
        assert_eq!(timestamp(i64::MIN, 0), "0001-01-01T00:00:00Z");
        assert_eq!(timestamp(-62_135_596_800, 0), "0001-01-01T00:00:00Z");
        assert_eq!(timestamp(253_402_300_799, 0), "9999-12-31T23:59:59Z");
        assert_eq!(timestamp(i64::MAX, 0), "9999-12-31T23:59:59.999999999Z");
    }
}
