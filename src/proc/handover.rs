//! The process table across a live upgrade (`crate::upgrade`): what one image writes down of
//! each process and remembered exit, and the new image's adoption of them.

/// One live process, as the handover carries it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedProcess {
    #[prost(uint32, tag = "1")]
    pub pid: u32,
}

/// One remembered exit.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedExit {
    #[prost(uint32, tag = "1")]
    pub pid: u32,
}

/// How the adoption went, for `X-Envd-Handover`.
#[derive(Debug, Default)]
pub struct Adopted {
    pub procs: usize,
    pub procs_failed: usize,
    pub retained: usize,
    pub retained_failed: usize,
}

/// Stops the table from changing.
pub fn prepare() {}

/// The table, written down.
pub fn export(
    _carry: &mut crate::upgrade::carry::Carry,
) -> Result<(Vec<CarriedProcess>, Vec<CarriedExit>), String> {
    Ok((Vec::new(), Vec::new()))
}

/// Serves on after a failed `execve`.
pub fn resume() {}

/// Takes the table back.
pub fn adopt(
    processes: &[CarriedProcess],
    exits: &[CarriedExit],
    _inherited: &mut crate::upgrade::carry::Inherited,
) -> Adopted {
    Adopted {
        procs: processes.len(),
        procs_failed: processes.len(),
        retained: exits.len(),
        retained_failed: exits.len(),
    }
}
