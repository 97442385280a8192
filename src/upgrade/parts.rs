//! The parts of the daemon whose state crosses an upgrade beside `/init`'s, and the order in
//! which each is asked: [`refusal`] (before the binary is even received), [`prepare`] (on the
//! main thread, before the drain: each part stops changing what it will hand over and ends the
//! streams that cannot cross the `execve`), [`export`] (its state into the handover, its
//! descriptors into the [`Carry`]), [`resume`] (the `execve` failed: serve on), and in the new
//! image [`adopt`]. The parts: the process table (`proc::handover`), a freeze in effect
//! (`platform::cgroups`), the log lines not yet exported (`log::export`), watchers, forwards.

use super::carry::{Carry, Inherited};
use super::state::Handover;
use super::Outcome;
use crate::api::filesystem::watch_carry;
use crate::app::App;
use crate::platform::forward::handover as forward;
use crate::proc;

/// Why an upgrade cannot happen now: state a part would lose. (Watchers are carried, within
/// the handover's room; `WatchDir` streams end at `prepare`.)
pub fn refusal() -> Option<String> {
    watch_carry::refusal()
}

/// Every part stops changing what it hands over.
pub fn prepare() {
    proc::handover::prepare();
    forward::prepare();
    watch_carry::prepare();
}

/// Every part's state into `handover`, its descriptors into `carry`.
pub fn export(app: &App, handover: &mut Handover, carry: &mut Carry) -> Result<(), String> {
    let (processes, exits) = proc::handover::export(carry)?;
    handover.processes = processes;
    handover.exits = exits;
    handover.watchers = watch_carry::export(carry)?;
    handover.forwards = forward::export(carry);
    handover.freeze = app.cgroups.carried_freeze();
    // Last: the lines logged up to here go to the next image's exporter.
    handover.log_lines = crate::log::export::take_queued();
    Ok(())
}

/// The `execve` failed: every part serves on.
pub fn resume() {
    proc::handover::resume();
    forward::resume();
    watch_carry::resume();
}

/// The new image takes each part back; how it went, for `X-Envd-Handover`.
pub fn adopt(app: &App, handover: &mut Handover, inherited: &mut Inherited) -> Outcome {
    let mut outcome = Outcome::default();
    if let Some(freeze) = &handover.freeze {
        app.cgroups.adopt_freeze(freeze);
    }
    // Taken, not copied: they may be 8 MiB.
    crate::log::export::requeue(std::mem::take(&mut handover.log_lines));
    let processes = proc::handover::adopt(&handover.processes, &handover.exits, inherited);
    outcome.procs = processes.procs;
    outcome.procs_failed = processes.procs_failed;
    outcome.retained = processes.retained;
    outcome.retained_failed = processes.retained_failed;
    // envd's header has no field for forwards: their adoption is logged.
    forward::adopt(&handover.forwards, inherited);
    (outcome.watchers, outcome.watchers_failed) = watch_carry::adopt(&handover.watchers, inherited);
    outcome
}
