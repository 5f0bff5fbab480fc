//! The webhook's serving certificate: PEM files loaded into a rustls configuration (ring provider)
//! and reloaded when their contents change, without a restart and without dropping connections.
//!
//! Kubernetes updates a Secret mounted as a directory by swapping a symlink, so a renewed
//! certificate (cert-manager, or a rotated Secret) shows up in the files within about a minute.
//! [`TlsFiles::reload`] reads both files, and when either differs from what is loaded, builds a new
//! configuration and swaps it in: new connections get the new certificate, open ones keep theirs.
//! A pair that does not load (a half-written file, a key that does not match the certificate)
//! leaves the old configuration serving and is tried again at the next check.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often the files are compared with what is loaded.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// Why a certificate and key could not be loaded.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file is not the PEM expected.
    #[error("{}: {message}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the pair (e.g. the key does not belong to the certificate).
    #[error("certificate {} with key {}: {source}", cert.display(), key.display())]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// A certificate chain and key from PEM files, served through a [`RustlsConfig`] that
/// [`TlsFiles::reload`] updates in place.
pub struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    config: RustlsConfig,
    loaded: Mutex<(Vec<u8>, Vec<u8>)>,
    reloads: Family<ResultLabel, Counter>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles").field("cert", &self.cert).field("key", &self.key).finish_non_exhaustive()
    }
}

impl TlsFiles {
    /// Loads the certificate chain (`cert`, PEM `CERTIFICATE` blocks, leaf first) and its private
    /// key (`key`, PEM PKCS#8, PKCS#1 or SEC1).
    pub fn load(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Result<TlsFiles, TlsError> {
        let (cert, key) = (cert.into(), key.into());
        let (cert_pem, key_pem) = (read(&cert)?, read(&key)?);
        let config = server_config(&cert, &cert_pem, &key, &key_pem)?;
        Ok(TlsFiles {
            cert,
            key,
            config: RustlsConfig::from_config(Arc::new(config)),
            loaded: Mutex::new((cert_pem, key_pem)),
            reloads: Family::default(),
        })
    }

    /// The configuration to serve with; it follows every successful reload.
    pub fn config(&self) -> RustlsConfig {
        self.config.clone()
    }

    /// The certificate file.
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// Reads the files and, when they differ from what is loaded, loads them. `Ok(true)`: a new
    /// certificate is being served; `Ok(false)`: nothing changed; `Err`: the files did not load
    /// and the previous certificate is still served.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let result = self.try_reload();
        match &result {
            Ok(true) => {
                self.reloads.get_or_create(&ResultLabel { result: "loaded" }).inc();
                tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
            }
            Ok(false) => {}
            Err(e) => {
                self.reloads.get_or_create(&ResultLabel { result: "failed" }).inc();
                tracing::warn!(error = %e, "serving certificate changed but does not load; still serving the previous one");
            }
        }
        result
    }

    fn try_reload(&self) -> Result<bool, TlsError> {
        let (cert_pem, key_pem) = (read(&self.cert)?, read(&self.key)?);
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if loaded.0 == cert_pem && loaded.1 == key_pem {
            return Ok(false);
        }
        let config = server_config(&self.cert, &cert_pem, &self.key, &key_pem)?;
        self.config.reload_from_config(Arc::new(config));
        *loaded = (cert_pem, key_pem);
        Ok(true)
    }

    /// Registers `weft_<component>_tls_reloads_total{result="loaded"|"failed"}`.
    pub fn register_metrics(&self, registry: &mut Registry, component: &str) {
        registry.sub_registry_with_prefix(component).register(
            "tls_reloads",
            "Changes of the serving certificate files: loaded, or failed to load (the previous one is kept)",
            self.reloads.clone(),
        );
    }

    /// Calls [`TlsFiles::reload`] every `every` until `shutdown` is cancelled.
    pub fn spawn_reloader(self: &Arc<Self>, every: Duration, shutdown: CancellationToken) -> JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = tick.tick() => {
                        // Errors are logged and counted by reload; the old certificate keeps serving.
                        let _ = this.reload();
                    }
                }
            }
        })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

/// A rustls server configuration (ring, TLS 1.2 and 1.3, ALPN h2 and http/1.1) for the pair.
fn server_config(cert: &Path, cert_pem: &[u8], key: &Path, key_pem: &[u8]) -> Result<ServerConfig, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { path: cert.to_owned(), message: format!("not PEM certificates: {e}") })?;
    if chain.is_empty() {
        return Err(TlsError::Pem { path: cert.to_owned(), message: "no CERTIFICATE block".to_owned() });
    }
    let private_key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem {
        path: key.to_owned(),
        message: format!("no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
    })?;
    let config_error = |source| TlsError::Config { cert: cert.to_owned(), key: key.to_owned(), source };
    let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(config_error)?
        .with_no_client_auth()
        .with_single_cert(chain, private_key)
        .map_err(config_error)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
