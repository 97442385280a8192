//! A JSON message holding one large `bytes` field, read as it arrives: the tokens before the
//! field's base64 string must be one of a few fixed openings (whitespace between tokens
//! allowed), the string is decoded in groups of four characters as they come, and only closing
//! braces (and whitespace) may follow. So a service can apply a message of megabytes while
//! holding a few bytes of it, where a JSON parser would need it whole.
//!
//! The base64 may use either alphabet, with or without padding (proto3 JSON readers accept
//! all four), and `\/` for `/`; no other escape is taken, in the string or the keys.

use base64_simd::STANDARD_NO_PAD;

/// Why the message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not of the expected shape: what was found.
    Shape(&'static str),
    /// The string is not base64.
    Base64,
}

/// Reads one message; `openings` are the accepted tokens up to and including the string's
/// opening quote, without whitespace, e.g. `{"data":{"input":{"stdin":"`.
pub struct StreamedBytes {
    openings: &'static [&'static [u8]],
    stage: Stage,
    /// Which opening the message has, once known.
    opening: Option<usize>,
    /// The closing braces due after the string: as many as the opening opened.
    due: usize,
}

enum Stage {
    /// The tokens before the string, whitespace outside strings removed.
    Opening { compact: Vec<u8>, in_string: bool },
    /// Base64 characters not decoded yet (fewer than four after each push), in the standard
    /// alphabet; `=` seen; a backslash seen.
    Value {
        pending: Vec<u8>,
        padding: u8,
        escape: bool,
    },
    /// After the string: the closing braces seen.
    Closing { braces: usize },
}

impl StreamedBytes {
    pub fn new(openings: &'static [&'static [u8]]) -> StreamedBytes {
        StreamedBytes {
            openings,
            stage: Stage::Opening {
                compact: Vec::new(),
                in_string: false,
            },
            opening: None,
            due: 0,
        }
    }

    /// The index of the message's opening in `openings`, once read.
    pub fn opening(&self) -> Option<usize> {
        self.opening
    }

    /// Takes the next bytes of the message; returns the field's bytes they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<u8>, Refusal> {
        let mut out = Vec::new();
        for &byte in bytes {
            match &mut self.stage {
                Stage::Opening { compact, in_string } => {
                    if !*in_string && is_json_space(byte) {
                        continue;
                    }
                    if byte == b'"' {
                        *in_string = !*in_string;
                    }
                    compact.push(byte);
                    let mut fits = self.openings.iter().filter(|o| o.starts_with(compact));
                    if fits.next().is_none() {
                        return Err(Refusal::Shape("another message"));
                    }
                    let Some(index) = self.openings.iter().position(|o| o == compact) else {
                        continue;
                    };
                    self.due = compact.iter().filter(|&&b| b == b'{').count();
                    self.opening = Some(index);
                    self.stage = Stage::Value {
                        pending: Vec::new(),
                        padding: 0,
                        escape: false,
                    };
                }
                Stage::Value {
                    pending,
                    padding,
                    escape,
                } => {
                    let sextet = match byte {
                        b'/' if *escape => b'/',
                        _ if *escape => return Err(Refusal::Shape("an escape in the base64")),
                        b'\\' => {
                            *escape = true;
                            continue;
                        }
                        b'"' => {
                            out.extend(decode_last(pending, *padding)?);
                            self.stage = Stage::Closing { braces: 0 };
                            continue;
                        }
                        b'=' if *padding < 2 => {
                            *padding += 1;
                            continue;
                        }
                        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'+' | b'/' => byte,
                        b'-' => b'+',
                        b'_' => b'/',
                        _ => return Err(Refusal::Base64),
                    };
                    *escape = false;
                    if *padding > 0 {
                        return Err(Refusal::Base64);
                    }
                    pending.push(sextet);
                }
                Stage::Closing { braces } => match byte {
                    b'}' if *braces < self.due => *braces += 1,
                    _ if is_json_space(byte) => {}
                    _ => return Err(Refusal::Shape("more after the bytes")),
                },
            }
        }
        if let Stage::Value { pending, .. } = &mut self.stage {
            let whole = pending.len() / 4 * 4;
            out.extend(decode(&pending[..whole])?);
            pending.drain(..whole);
        }
        Ok(out)
    }

    /// The message is complete: it must have ended after its closing braces.
    pub fn finish(&self) -> Result<(), Refusal> {
        match self.stage {
            Stage::Closing { braces } if braces == self.due => Ok(()),
            _ => Err(Refusal::Shape("a message cut short")),
        }
    }
}

/// JSON's whitespace (RFC 8259 §2), narrower than ASCII's.
fn is_json_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Standard base64 without padding (whole groups, or the last one cut short).
fn decode(chars: &[u8]) -> Result<Vec<u8>, Refusal> {
    STANDARD_NO_PAD
        .decode_to_vec(chars)
        .map_err(|_| Refusal::Base64)
}

/// The end of the string: the characters left (fewer than four) with the padding, which must
/// complete the last group if present.
fn decode_last(pending: &[u8], padding: u8) -> Result<Vec<u8>, Refusal> {
    let cut = pending.len() % 4;
    let padding_fits = padding == 0 || (cut >= 2 && usize::from(padding) == 4 - cut);
    if cut == 1 || !padding_fits {
        return Err(Refusal::Base64);
    }
    decode(pending)
}
