//! The connections no worker is running, by slot. A token names a slot and its generation,
//! so an event for a closed connection whose slot was reused is recognised and dropped; an
//! event for a connection being run marks its slot, so it is run again rather than parked.
//! The slots also keep the deadlines the timekeeper sweeps and the bytes of incomplete heads
//! (the partial-head budget).

use std::os::fd::AsRawFd;
use std::time::Instant;

use super::{Connection, FIRST_SLOT};
use crate::sys;

/// Connections by slot, while no worker runs them.
#[derive(Default)]
pub(super) struct Slots {
    entries: Vec<Slot>,
    free: Vec<usize>,
    /// Bytes held by parked incomplete heads.
    partial_bytes: usize,
}

#[derive(Default)]
struct Slot {
    generation: u32,
    state: State,
}

#[derive(Default)]
enum State {
    #[default]
    Free,
    /// A worker runs it; `woken`: an event or wake-up came meanwhile.
    Busy {
        woken: bool,
    },
    Parked(Parked),
}

struct Parked {
    connection: Connection,
    deadline: Option<Instant>,
    interest: u32,
    /// When it was parked: the oldest partial head is closed first.
    since: Instant,
    partial: usize,
}

impl Slots {
    /// A slot for a new connection, busy.
    pub(super) fn reserve(&mut self) -> u64 {
        let index = self.free.pop().unwrap_or_else(|| {
            self.entries.push(Slot::default());
            self.entries.len() - 1
        });
        let slot = &mut self.entries[index];
        slot.state = State::Busy { woken: false };
        (u64::from(slot.generation) << 32) | (index as u64 + FIRST_SLOT)
    }

    fn slot(&mut self, token: u64) -> Option<&mut Slot> {
        let index = usize::try_from((token & 0xffff_ffff).checked_sub(FIRST_SLOT)?).ok()?;
        let slot = self.entries.get_mut(index)?;
        (u64::from(slot.generation) == token >> 32).then_some(slot)
    }

    /// The parked connection of `token`, now busy; a busy one is marked woken instead.
    pub(super) fn take(&mut self, token: u64) -> Option<Connection> {
        let slot = self.slot(token)?;
        match std::mem::take(&mut slot.state) {
            State::Parked(parked) => {
                slot.state = State::Busy { woken: false };
                self.partial_bytes -= parked.partial;
                Some(parked.connection)
            }
            State::Busy { .. } => {
                slot.state = State::Busy { woken: true };
                None
            }
            State::Free => None,
        }
    }

    /// Parks a busy connection; gives it back if it was woken meanwhile (run it again).
    pub(super) fn park(
        &mut self,
        token: u64,
        connection: Connection,
        deadline: Option<Instant>,
        interest: u32,
    ) -> Result<(), Connection> {
        let Some(slot) = self.slot(token) else {
            return Ok(());
        };
        if let State::Busy { woken: true } = slot.state {
            slot.state = State::Busy { woken: false };
            return Err(connection);
        }
        let partial = connection.conn.partial_head_bytes();
        slot.state = State::Parked(Parked {
            connection,
            deadline,
            interest,
            since: Instant::now(),
            partial,
        });
        self.partial_bytes += partial;
        Ok(())
    }

    /// Frees the slot of a connection that is closing.
    pub(super) fn release(&mut self, token: u64) {
        let index = (token & 0xffff_ffff).wrapping_sub(FIRST_SLOT);
        if let Some(slot) = self.slot(token) {
            slot.state = State::Free;
            slot.generation = slot.generation.wrapping_add(1);
            if let Ok(index) = usize::try_from(index) {
                self.free.push(index);
            }
        }
    }

    /// Takes out the parked connection at `index`, freeing its slot.
    fn remove(&mut self, index: usize) -> Option<Connection> {
        let slot = self.entries.get_mut(index)?;
        let State::Parked(parked) = std::mem::take(&mut slot.state) else {
            return None;
        };
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        self.partial_bytes -= parked.partial;
        Some(parked.connection)
    }

    /// Over the partial-head budget: the oldest incomplete heads, removed until under it.
    pub(super) fn over_budget(&mut self, budget: usize) -> Vec<Connection> {
        let mut evicted = Vec::new();
        while self.partial_bytes > budget {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .filter_map(|(index, slot)| match &slot.state {
                    State::Parked(p) if p.partial > 0 => Some((p.since, index)),
                    _ => None,
                })
                .min();
            match oldest.and_then(|(_, index)| self.remove(index)) {
                Some(connection) => evicted.push(connection),
                None => break,
            }
        }
        evicted
    }

    /// Whether a connection is with a worker or parked waiting for (or reading) a head.
    pub(super) fn any_awaiting_head(&self) -> bool {
        self.entries.iter().any(|slot| match &slot.state {
            State::Free => false,
            State::Busy { .. } => true,
            State::Parked(parked) => parked.connection.conn.awaits_head(),
        })
    }

    /// Removes a parked connection to free a descriptor: the idle one parked longest, else the
    /// one that has waited longest in the middle of a head (a client that began a request and
    /// stopped: the local user's slowloris, never a request the daemon owes an answer to).
    pub(super) fn evict_for_descriptor(&mut self) -> Option<Connection> {
        let oldest = |wanted: fn(&Parked) -> bool| {
            self.entries
                .iter()
                .enumerate()
                .filter_map(|(index, slot)| match &slot.state {
                    State::Parked(p) if wanted(p) => Some((p.since, index)),
                    _ => None,
                })
                .min()
                .map(|(_, index)| index)
        };
        let index = oldest(|p| p.connection.conn.is_idle())
            .or_else(|| oldest(|p| p.connection.conn.awaits_head()))?;
        self.remove(index)
    }

    /// Connections whose deadline passed while the peer did nothing, made busy. One whose socket
    /// is ready is waiting for a worker, not for its peer, and is left to the worker.
    pub(super) fn sweep(&mut self, now: Instant) -> Vec<(u64, Connection)> {
        let mut expired = Vec::new();
        for (index, slot) in self.entries.iter_mut().enumerate() {
            let State::Parked(parked) = &slot.state else {
                continue;
            };
            let due = parked.deadline.is_some_and(|deadline| deadline <= now);
            if !due || sys::is_ready(parked.connection.socket.as_raw_fd(), parked.interest) {
                continue;
            }
            let token = (u64::from(slot.generation) << 32) | (index as u64 + FIRST_SLOT);
            if let State::Parked(parked) =
                std::mem::replace(&mut slot.state, State::Busy { woken: false })
            {
                self.partial_bytes -= parked.partial;
                expired.push((token, parked.connection));
            }
        }
        expired
    }
}
