//! The parts of the daemon whose state crosses an upgrade beside `/init`'s, and the order in
//! which each is asked: [`refusal`] (before the binary is even received), [`prepare`] (on the
//! main thread, before the drain: each part stops changing what it will hand over and ends the
//! streams that cannot cross the `execve`), [`export`] (its state into the handover, its
//! descriptors into the [`Carry`]), [`resume`] (the `execve` failed: serve on), and in the new
//! image [`adopt`].

use super::carry::{Carry, Inherited};
use super::state::Handover;
use super::Outcome;
use crate::api::filesystem::watch_carry;
use crate::proc;

/// Why an upgrade cannot happen now: state a part would lose. (Watchers are carried, within
/// the handover's room; `WatchDir` streams end at `prepare`.)
pub fn refusal() -> Option<String> {
    let processes = proc::Hub::running().map_or(0, |hub| hub.list().len());
    (processes > 0)
        .then(|| {
            format!(
                "cannot upgrade now: {processes} processes are live, and a live upgrade does not \
                 carry processes over yet"
            )
        })
        .or_else(watch_carry::refusal)
}

/// Every part stops changing what it hands over.
pub fn prepare() {
    proc::handover::prepare();
    watch_carry::prepare();
}

/// Every part's state into `handover`, its descriptors into `carry`.
pub fn export(handover: &mut Handover, carry: &mut Carry) -> Result<(), String> {
    let (processes, exits) = proc::handover::export(carry)?;
    handover.processes = processes;
    handover.exits = exits;
    handover.watchers = watch_carry::export(carry)?;
    Ok(())
}

/// The `execve` failed: every part serves on.
pub fn resume() {
    proc::handover::resume();
    watch_carry::resume();
}

/// The new image takes each part back; how it went, for `X-Envd-Handover`.
pub fn adopt(handover: &Handover, inherited: &mut Inherited) -> Outcome {
    let mut outcome = Outcome::default();
    let processes = proc::handover::adopt(&handover.processes, &handover.exits, inherited);
    outcome.procs = processes.procs;
    outcome.procs_failed = processes.procs_failed;
    outcome.retained = processes.retained;
    outcome.retained_failed = processes.retained_failed;
    (outcome.watchers, outcome.watchers_failed) = watch_carry::adopt(&handover.watchers, inherited);
    outcome
}
