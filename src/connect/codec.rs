//! Connect's two codecs for one set of message types: proto3's JSON mapping (serde, with the
//! rules of [`super::json`]) and binary protobuf (`prost`). Every message type of the services
//! derives both, so the two wire forms of a message cannot drift apart: a field is declared
//! once, with its protobuf tag and type beside its JSON name.
//!
//! Unknown fields are skipped by both readers (serde ignores unknown keys; prost skips unknown
//! tags), so an older daemon accepts a newer client.

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{Code, Error};

/// A message the services read.
pub trait Incoming: DeserializeOwned + prost::Message + Default {}
impl<T: DeserializeOwned + prost::Message + Default> Incoming for T {}

/// A message the services write.
pub trait Outgoing: Serialize + prost::Message {}
impl<T: Serialize + prost::Message> Outgoing for T {}

/// How a call's messages are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// proto3 JSON: `application/json`, `application/connect+json`.
    Json,
    /// Binary protobuf: `application/proto`, `application/connect+proto`.
    Proto,
}

impl Codec {
    /// The media type of a unary call in this codec.
    pub fn unary_type(self) -> &'static str {
        match self {
            Codec::Json => "application/json",
            Codec::Proto => "application/proto",
        }
    }

    /// The media type of a streaming call in this codec.
    pub fn stream_type(self) -> &'static str {
        match self {
            Codec::Json => "application/connect+json",
            Codec::Proto => "application/connect+proto",
        }
    }

    /// Reads a message. An empty JSON body is the empty message, as connect-go reads it (an
    /// empty protobuf body is the empty message by definition).
    pub fn decode<T: Incoming>(self, bytes: &[u8]) -> Result<T, Error> {
        match self {
            Codec::Json => {
                let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
                serde_json::from_slice(bytes)
                    .map_err(|e| Error::invalid_argument(format!("invalid request message: {e}")))
            }
            Codec::Proto => T::decode(bytes)
                .map_err(|e| Error::invalid_argument(format!("invalid request message: {e}"))),
        }
    }

    /// Appends a message to `out`.
    pub fn encode<T: Outgoing>(self, message: &T, out: &mut Vec<u8>) -> Result<(), Error> {
        match self {
            Codec::Json => serde_json::to_writer(&mut *out, message)
                .map_err(|e| Error::new(Code::Internal, format!("encoding the answer: {e}"))),
            Codec::Proto => {
                out.reserve(message.encoded_len());
                message.encode_raw(out);
                Ok(())
            }
        }
    }
}

/// A message read from `data` in `codec` reads back the same from its protobuf encoding (for
/// the fuzz targets: no message the daemon accepts is changed by passing through protobuf).
#[cfg(feature = "fuzzing")]
pub fn check_round_trip<T: Incoming + PartialEq + std::fmt::Debug>(codec: Codec, data: &[u8]) {
    if let Ok(message) = codec.decode::<T>(data) {
        let again = T::decode(&message.encode_to_vec()[..]).expect("its own encoding reads");
        assert!(again == message, "{message:?} / {again:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, PartialEq, prost::Message, serde::Deserialize, serde::Serialize)]
    #[serde(default)]
    struct Sample {
        #[prost(string, tag = "1")]
        path: String,
        #[prost(uint32, tag = "2")]
        depth: u32,
    }

    #[test]
    fn both_codecs_read_and_write_one_type() {
        let sample = Sample {
            path: "/a".into(),
            depth: 3,
        };
        let mut json = Vec::new();
        Codec::Json.encode(&sample, &mut json).unwrap();
        assert_eq!(json, br#"{"path":"/a","depth":3}"#);
        let mut proto = Vec::new();
        Codec::Proto.encode(&sample, &mut proto).unwrap();
        assert_eq!(proto, [0x0a, 2, b'/', b'a', 0x10, 3]);
        assert_eq!(Codec::Json.decode::<Sample>(&json).unwrap(), sample);
        assert_eq!(Codec::Proto.decode::<Sample>(&proto).unwrap(), sample);
    }

    #[test]
    fn unknown_fields_are_skipped_and_empty_is_the_empty_message() {
        let json = br#"{"path":"/a","newField":{"x":[1]}}"#;
        assert_eq!(Codec::Json.decode::<Sample>(json).unwrap().path, "/a");
        // Field 99 (a length-delimited one) and field 7 (a varint) before the known one.
        let proto = [0x9a, 0x06, 1, b'z', 0x38, 5, 0x0a, 1, b'b'];
        assert_eq!(Codec::Proto.decode::<Sample>(&proto).unwrap().path, "b");
        for codec in [Codec::Json, Codec::Proto] {
            assert_eq!(codec.decode::<Sample>(b"").unwrap(), Sample::default());
        }
    }

    #[test]
    fn malformed_messages_are_invalid_argument() {
        assert_eq!(
            Codec::Json.decode::<Sample>(b"{").unwrap_err().code,
            Code::InvalidArgument
        );
        // A length past the end, a varint of eleven bytes, a wire type that does not exist.
        for bad in [
            &[0x0a, 5, b'a'][..],
            &[
                0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1,
            ],
            &[0x0f],
        ] {
            let error = Codec::Proto.decode::<Sample>(bad).unwrap_err();
            assert_eq!(error.code, Code::InvalidArgument, "{bad:?}");
            assert!(error.message.starts_with("invalid request message: "));
        }
    }
}
