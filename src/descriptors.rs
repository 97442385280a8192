//! The open-file budget: how the daemon's `RLIMIT_NOFILE` is shared among those who hold
//! descriptors, so that the local user, who can open forwarded connections and unfinished
//! request heads at will, can never take the last descriptor `/health` needs (docs/design.md,
//! "Descriptors: one budget").
//!
//! The limit `L` (the soft limit once raised to the hard one) is split in two halves:
//!
//! - **The forwarder's share**, at most `L / 2` descriptors of its own: listeners, both sockets
//!   of every forwarded connection, a bulk direction's pipe. It also stops taking any when a
//!   descriptor it is given is numbered at or above the **ceiling** `L − reserve`: the kernel
//!   hands out the lowest free number, so every descriptor below it is open and fewer than
//!   `reserve` are left, whoever holds the others.
//! - **Everything else**, first come first served: the HTTP server's connections and what its
//!   workers open for requests, the process service's pipes and terminals (three pipes or one
//!   terminal per process; not capped by the daemon), watches (one inotify instance each,
//!   capped by the kernel's `fs.inotify.max_user_instances`), and the daemon's own (stdio,
//!   epolls, eventfds, the scanner's netlink socket, the log exporter's socket). Within it the
//!   **reserve** ([`reserve`]) is what the forwarder's ceiling keeps free for the HTTP server;
//!   it is at most half the limit, so a low limit still leaves the forwarder its half.
//!
//! Past the limit anyway (processes or compose's sources took it), the HTTP accept path frees a
//! descriptor itself: the oldest idle connection, else the oldest unfinished head, else a
//! forwarded connection (`crates/http` `server::accept`, [`crate::platform::forward::shed`]).

/// Descriptors the daemon holds whatever it serves: stdio, the listener, the epolls and
/// eventfds of the HTTP layer, the forwarder, the process and watch hubs, the scanner's netlink
/// socket, the log exporter's and metadata client's sockets, with room.
pub const FIXED: usize = 64;
/// HTTP connections the reserve keeps room for: the orchestrator's pooled connections, an
/// SDK's parallel uploads, open process and watch streams.
pub const HTTP_CONNECTIONS: usize = 256;
/// What one worker may hold open for one request: a walk's 16 kept directories
/// (`fs::walk::KEEP_OPEN`), a file and the directory it is placed in, a spawn's pipe ends
/// (three pipes and the exec-error pipe), with room. A compose holds one per source (up to
/// 10,000, SPEC §5): those come from the other half, first come first served.
pub const PER_WORKER: usize = 32;

/// The shares of one open-file limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The open-file limit.
    pub limit: usize,
    /// Descriptors kept free for the HTTP server: the forwarder takes none numbered at or above
    /// `limit - reserve`.
    pub reserve: usize,
    /// Most descriptors the forwarder holds.
    pub forward_share: usize,
}

impl Budget {
    /// The budget of `limit` descriptors for a server with `workers` workers.
    pub fn new(limit: u64, workers: usize) -> Budget {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let half = limit / 2;
        Budget {
            limit,
            reserve: reserve(workers).min(half),
            forward_share: half,
        }
    }

    /// The first descriptor number the forwarder refuses to hold.
    pub fn forward_ceiling(&self) -> usize {
        self.limit - self.reserve
    }
}

/// The HTTP server's reserve, before it is capped at half the limit: its fixed descriptors,
/// [`HTTP_CONNECTIONS`] connections and [`PER_WORKER`] for each worker.
pub fn reserve(workers: usize) -> usize {
    FIXED
        .saturating_add(HTTP_CONNECTIONS)
        .saturating_add(workers.saturating_mul(PER_WORKER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forwarder_gets_half_and_never_the_reserve() {
        // 8 workers: 64 + 256 + 8 × 32 = 576.
        assert_eq!(reserve(8), 576);
        let big = Budget::new(1 << 20, 8);
        assert_eq!(big.forward_share, 1 << 19);
        assert_eq!(big.reserve, 576);
        assert_eq!(big.forward_ceiling(), (1 << 20) - 576);
        let small = Budget::new(4096, 8);
        assert_eq!((small.forward_share, small.forward_ceiling()), (2048, 3520));
    }

    #[test]
    fn a_low_limit_caps_the_reserve_at_half() {
        let low = Budget::new(1024, 8);
        assert_eq!((low.reserve, low.forward_share), (512, 512));
        assert_eq!(low.forward_ceiling(), 512);
        let tiny = Budget::new(9, 64);
        assert_eq!(
            (tiny.reserve, tiny.forward_share, tiny.forward_ceiling()),
            (4, 4, 5)
        );
    }

    #[test]
    fn an_unlimited_limit_does_not_overflow() {
        let unlimited = Budget::new(u64::MAX, usize::MAX);
        assert_eq!(unlimited.reserve, usize::MAX / 2);
        assert!(unlimited.forward_ceiling() > unlimited.reserve);
    }
}
