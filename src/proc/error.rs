//! Why an operation on a process failed ([`ProcError`]), in the words envd's clients know.

use std::fmt;

use super::table::INPUT_MAX;
use super::Selector;

/// Why an operation on a process failed.
#[derive(Debug)]
pub enum ProcError {
    /// No live process has that pid or tag.
    NotFound(Selector),
    /// `fork`, the child's set-up or `exec` failed.
    Spawn(std::io::Error),
    /// Input for stdin, but the process has no stdin pipe (not asked for, or closed).
    NoStdin,
    /// Input for stdin to a terminal process, or for a terminal to a piped one.
    WrongInput { to_terminal: bool },
    /// A terminal operation on a process without one.
    NotATerminal,
    /// Closing stdin of a terminal process.
    TerminalStdin,
    /// The process does not read its input: [`INPUT_MAX`] bytes already wait for it.
    InputFull,
    /// Writing input, signalling or resizing failed.
    Io(std::io::Error),
    /// The daemon is shutting down.
    ShuttingDown,
    /// The daemon is being upgraded: the table is being handed over.
    Upgrading,
}

impl fmt::Display for ProcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcError::NotFound(selector) => write!(f, "{selector} not found"),
            ProcError::Spawn(error) | ProcError::Io(error) => write!(f, "{error}"),
            ProcError::NoStdin => f.write_str("stdin not enabled or closed"),
            ProcError::WrongInput { to_terminal: false } => f.write_str(
                "tty assigned to process — input should be written to the pty, not the stdin",
            ),
            ProcError::WrongInput { to_terminal: true } => f.write_str(
                "tty not assigned to process — input should be written to the stdin, not the tty",
            ),
            ProcError::NotATerminal => f.write_str("tty not assigned to process"),
            ProcError::TerminalStdin => {
                f.write_str("cannot close stdin for PTY process — send Ctrl+D (0x04) instead")
            }
            ProcError::InputFull => write!(
                f,
                "the process is not reading its input: {} KiB already wait for it",
                INPUT_MAX >> 10
            ),
            ProcError::ShuttingDown => f.write_str("sandboxd is shutting down"),
            ProcError::Upgrading => f.write_str(
                "sandboxd is being upgraded: try again in a moment (the process lives on)",
            ),
        }
    }
}
