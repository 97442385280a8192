//! A freeze across a live upgrade (`crate::upgrade`). E2B's orchestrator upgrades the daemon
//! at a resume, while the workload is still frozen from before the pause, and its next `/init`
//! thaws it: the new image must know that a freeze of its predecessor's is in effect (or it
//! would thaw only its own two groups) and which cgroups the guest had frozen itself (or it
//! would thaw those too), as envd's handover carries `guest_frozen_cgroups`.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::sync::Arc;

use super::Cgroups;

/// A freeze in effect, as the handover carries it: the cgroups the guest had frozen before it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedFreeze {
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub guest_frozen: Vec<Vec<u8>>,
}

impl Cgroups {
    /// The freeze in effect, if any, for the handover.
    pub fn carried_freeze(&self) -> Option<CarriedFreeze> {
        self.freeze_in_effect().map(|paths| CarriedFreeze {
            guest_frozen: paths
                .into_iter()
                .map(|path| path.into_os_string().into_vec())
                .collect(),
        })
    }

    /// Takes up the freeze a previous image carried. Only absolute paths are kept: the list
    /// only ever spares cgroups from a thaw.
    pub fn adopt_freeze(self: &Arc<Self>, carried: &CarriedFreeze) {
        let guest_frozen: Vec<PathBuf> = carried
            .guest_frozen
            .iter()
            .map(|bytes| PathBuf::from(OsString::from_vec(bytes.clone())))
            .filter(|path| path.is_absolute() && !path.as_os_str().as_bytes().contains(&0))
            .collect();
        crate::log::line(format_args!(
            "upgrade: a freeze is in effect ({} cgroups the guest froze itself are left to it); \
             the next /init or /unfreeze thaws it",
            guest_frozen.len()
        ));
        self.resume_freeze(guest_frozen);
    }
}
