//! One way to build a Kubernetes client for every weft command: `--kubeconfig`, `--context`, the
//! in-cluster service account, or the default kubeconfig.

use std::path::PathBuf;

use kube::config::{Config, InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Error as KubeError};
use thiserror::Error;

/// Why a client could not be built.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file (or `$KUBECONFIG / ~/.kube/config`).
        path: String,
        /// Why.
        #[source]
        source: KubeconfigError,
    },
    /// Neither an in-cluster service account nor a kubeconfig was found.
    #[error(
        "no cluster configuration: not running in a pod ({in_cluster}) and no usable kubeconfig ({kubeconfig}); pass --kubeconfig"
    )]
    NoConfig {
        /// The in-cluster error.
        in_cluster: InClusterError,
        /// The kubeconfig error.
        kubeconfig: KubeconfigError,
    },
    /// The configuration was read but a client could not be made from it.
    #[error("cannot create a Kubernetes client: {0}")]
    Client(#[source] KubeError),
}

/// A client for the cluster.
///
/// - `kubeconfig` given: that file, with `context` or its current context;
/// - else `context` given: the default kubeconfig (`$KUBECONFIG`, `~/.kube/config`) with that context;
/// - else the in-cluster service account when running in a pod, otherwise the default kubeconfig.
pub async fn client_from(kubeconfig: Option<PathBuf>, context: Option<String>) -> Result<Client, ClientError> {
    let options = KubeConfigOptions { context, ..KubeConfigOptions::default() };
    let default_path = || "$KUBECONFIG or ~/.kube/config".to_string();
    let config = match kubeconfig {
        Some(path) => {
            let shown = path.display().to_string();
            let kc = Kubeconfig::read_from(&path)
                .map_err(|source| ClientError::Kubeconfig { path: shown.clone(), source })?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|source| ClientError::Kubeconfig { path: shown, source })?
        }
        None if options.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|source| ClientError::Kubeconfig { path: default_path(), source })?,
        None => match Config::incluster() {
            Ok(c) => c,
            Err(in_cluster) => Config::from_kubeconfig(&options)
                .await
                .map_err(|kubeconfig| ClientError::NoConfig { in_cluster, kubeconfig })?,
        },
    };
    Client::try_from(config).map_err(ClientError::Client)
}
