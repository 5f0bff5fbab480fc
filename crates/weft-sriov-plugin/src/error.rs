//! What can go wrong, each error naming the physnet, VF or pod it is about.

use weft_net::choice::ChoiceError;

/// An error of the VF plugin.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SriovError {
    /// A VF given to a physnet twice.
    #[error("VF {0} is listed twice")]
    DuplicateVf(String),
    /// Two plugins for one physnet.
    #[error("physnet {0} has two VF plugins")]
    DuplicatePhysnet(String),
    /// A write-back without plugins.
    #[error("the VF write-back needs at least one VF plugin")]
    NoPlugins,
    /// The kubelet named a device this plugin does not serve.
    #[error("{resource}: unknown device '{id}'")]
    UnknownDevice {
        /// The plugin's resource.
        resource: String,
        /// The device ID.
        id: String,
    },
    /// The kubelet asked for a negative number of devices.
    #[error("{resource}: allocation size {size} is negative")]
    NegativeSize {
        /// The plugin's resource.
        resource: String,
        /// The size asked.
        size: i32,
    },
    /// No VFs can be chosen.
    #[error("{resource}: {source}")]
    Choice {
        /// The plugin's resource.
        resource: String,
        /// Why.
        source: ChoiceError,
    },
}

impl From<SriovError> for tonic::Status {
    fn from(e: SriovError) -> tonic::Status {
        tonic::Status::invalid_argument(e.to_string())
    }
}
