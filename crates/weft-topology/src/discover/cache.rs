//! The discovery cache: the last discovered node, stored as inventory JSON with the fingerprint of the
//! GPU set it was taken from, so repeated runs skip the slow NVLink queries (reference §1.4, §7).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::TopologyError;
use crate::inventory::{API_VERSION, Inventory};
use crate::model::NodeTopology;

use super::gpu::GpuIdentity;

/// Version of the cache file layout, part of every fingerprint: a new layout invalidates old files.
pub const CACHE_FORMAT: &str = "weft.io/v1alpha1/topology-cache-1";

/// What a cached topology is valid for: the GPU UUIDs, the driver version and the boot. A new GPU, a
/// driver update or a reboot (NVLink/PCIe training can change) invalidates the cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fingerprint {
    /// [`CACHE_FORMAT`] of the writer.
    pub format: String,
    /// Inventory `apiVersion` of the writer.
    pub api_version: String,
    /// Driver version, when a driver answered.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// `/proc/sys/kernel/random/boot_id`, when readable.
    #[serde(default)]
    pub boot_id: Option<String>,
    /// GPU UUIDs in index order.
    #[serde(default)]
    pub gpu_uuids: Vec<String>,
}

impl Fingerprint {
    /// The fingerprint of a GPU set on a boot.
    pub fn new(identity: &GpuIdentity, boot_id: Option<String>) -> Fingerprint {
        Fingerprint {
            format: CACHE_FORMAT.to_string(),
            api_version: API_VERSION.to_string(),
            driver_version: identity.driver_version.clone(),
            boot_id,
            gpu_uuids: identity.uuids.clone(),
        }
    }

    /// What differs between `self` (stored) and `current`, in words; `None` when they are equal.
    pub fn difference(&self, current: &Fingerprint) -> Option<String> {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
        let mut parts = Vec::new();
        if self.format != current.format || self.api_version != current.api_version {
            parts.push(format!("cache format {} is not {}", self.format, current.format));
        }
        if self.driver_version != current.driver_version {
            parts.push(format!(
                "driver version changed from {} to {}",
                show(&self.driver_version),
                show(&current.driver_version)
            ));
        }
        if self.boot_id != current.boot_id {
            parts.push("the node rebooted".to_string());
        }
        if self.gpu_uuids != current.gpu_uuids {
            parts.push(format!(
                "GPU set changed ({} GPUs cached, {} now)",
                self.gpu_uuids.len(),
                current.gpu_uuids.len()
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// The cache file: the fingerprint and the node as an inventory document.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CacheFile {
    fingerprint: Fingerprint,
    inventory: Inventory,
}

/// A discovery cache file at a configurable path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryCache {
    path: PathBuf,
}

impl DiscoveryCache {
    /// Where the node agent keeps it.
    pub const DEFAULT_PATH: &'static str = "/var/lib/weft/topology.json";

    /// A cache stored at `path`.
    pub fn new(path: impl Into<PathBuf>) -> DiscoveryCache {
        DiscoveryCache { path: path.into() }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored fingerprint and node; `Ok(None)` when there is no file. A malformed file is an error
    /// naming the file, line and column (callers rediscover and overwrite it).
    pub fn load(&self) -> Result<Option<(Fingerprint, NodeTopology)>, TopologyError> {
        let name = self.path.display().to_string();
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(TopologyError::Io { path: name, source }),
        };
        let file: CacheFile = serde_json::from_str(&text).map_err(|e| crate::inventory::json_error(&e, &name))?;
        let node = file.inventory.into_node().map_err(|e| match e {
            TopologyError::Invalid(m) => TopologyError::Invalid(format!("{name}: inventory: {m}")),
            other => other,
        })?;
        Ok(Some((file.fingerprint, node)))
    }

    /// Store `node` under `fingerprint`, atomically (write a temporary file beside it, then rename).
    /// Creates the parent directory.
    pub fn store(&self, fingerprint: &Fingerprint, node: &NodeTopology) -> Result<(), TopologyError> {
        let io = |path: &Path, source| TopologyError::Io { path: path.display().to_string(), source };
        if let Some(parent) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        let file = CacheFile { fingerprint: fingerprint.clone(), inventory: Inventory::from_node(node) };
        let text = serde_json::to_string_pretty(&file).map_err(|e| TopologyError::Invalid(e.to_string()))?;
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(format!(".tmp.{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(&self.path, e)
        })
    }

    /// Remove the file (a missing file is fine).
    pub fn clear(&self) -> Result<(), TopologyError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(TopologyError::Io { path: self.path.display().to_string(), source }),
        }
    }
}
