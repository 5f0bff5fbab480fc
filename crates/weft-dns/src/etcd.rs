//! A minimal etcd v3 client: KV Range/Put/DeleteRange and Lease Grant/KeepAlive/Revoke over gRPC.
//!
//! Why not the `etcd-client` crate: its build script runs `protoc`, and weft's first command (the
//! README's build of `weft` on a fresh machine) must not need protoc installed. weft's own
//! `.proto` (proto/, with etcd's package, service, message names and field numbers) is compiled by
//! protox in build.rs, as the device plugin's kubelet API is; tonic carries it over plain HTTP/2.
//!
//! Endpoints are `http://host:port`; several are load-balanced (a down one is skipped once its
//! connection fails). Every unary call has a deadline, sent to etcd as `grpc-timeout` and also
//! enforced here (a call waiting for a connection ends too).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::settings::SettingsError;
use crate::store::{KeepAlive, Lease, RecordStore, StoreError, Stored};

/// The generated etcd messages and clients.
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// The generated storage message (`KeyValue`).
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

use etcdserverpb::kv_client::KvClient;
use etcdserverpb::lease_client::LeaseClient;
use etcdserverpb::{
    DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest,
    PutRequest, RangeRequest,
};

/// Keys read per Range call of a prefix read.
const PAGE: i64 = 1000;
/// Largest answer accepted (a page of records is far smaller).
const MAX_DECODE: usize = 16 * 1024 * 1024;

/// Checks one endpoint URL: `http://host:port`.
pub fn check_endpoint(url: &str) -> Result<(), SettingsError> {
    let bad = |why: &str| SettingsError { setting: "endpoints", value: url.to_string(), why: why.to_string() };
    if url.starts_with("https://") {
        return Err(bad("TLS to etcd is not supported; use an http:// endpoint"));
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(bad("must be a URL http://host:port"));
    };
    if rest.is_empty() || rest.starts_with(':') {
        return Err(bad("names no host"));
    }
    Endpoint::from_shared(url.to_string()).map_err(|e| bad(&format!("not a valid URL: {e}")))?;
    Ok(())
}

/// etcd over gRPC. Cheap to clone: clones share the connections.
#[derive(Clone, Debug)]
pub struct EtcdStore {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    endpoints: String,
    timeout: Duration,
}

impl EtcdStore {
    /// A client of `endpoints` (`http://host:port`) whose calls each get `timeout`. Connects
    /// lazily: only bad URLs fail here. Call it inside a Tokio runtime (the channel's worker is
    /// spawned on it).
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<EtcdStore, SettingsError> {
        if endpoints.is_empty() {
            return Err(SettingsError {
                setting: "endpoints",
                value: String::new(),
                why: "at least one etcd endpoint is needed".into(),
            });
        }
        let mut list = Vec::with_capacity(endpoints.len());
        for url in endpoints {
            check_endpoint(url)?;
            let e = Endpoint::from_shared(url.clone())
                .map_err(|e| SettingsError { setting: "endpoints", value: url.clone(), why: e.to_string() })?
                .connect_timeout(timeout)
                .tcp_nodelay(true)
                .keep_alive_while_idle(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(timeout);
            list.push(e);
        }
        let channel = match <[Endpoint; 1]>::try_from(list) {
            Ok([one]) => one.connect_lazy(),
            Err(list) => Channel::balance_list(list.into_iter()),
        };
        Ok(EtcdStore {
            kv: KvClient::new(channel.clone()).max_decoding_message_size(MAX_DECODE),
            lease: LeaseClient::new(channel).max_decoding_message_size(MAX_DECODE),
            endpoints: endpoints.join(","),
            timeout,
        })
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.timeout);
        r
    }

    /// Runs one call under the deadline, turning failures into [`StoreError`]s about `target`.
    async fn call<T>(
        &self,
        op: &'static str,
        target: impl Fn() -> String,
        f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) if s.code() == tonic::Code::DeadlineExceeded || s.code() == tonic::Code::Cancelled => {
                Err(StoreError::Timeout {
                    op,
                    target: target(),
                    endpoints: self.endpoints.clone(),
                    timeout: self.timeout,
                })
            }
            Ok(Err(s)) => Err(StoreError::Rpc {
                op,
                target: target(),
                endpoints: self.endpoints.clone(),
                code: s.code(),
                message: s.message().to_string(),
            }),
            Err(_) => Err(StoreError::Timeout {
                op,
                target: target(),
                endpoints: self.endpoints.clone(),
                timeout: self.timeout,
            }),
        }
    }
}

/// The end of the range of keys starting with `prefix` (etcd's "prefix + 1").
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Empty or all 0xff: every key from `prefix` on.
    vec![0]
}

fn stored(kv: mvccpb::KeyValue) -> Stored {
    Stored {
        key: String::from_utf8_lossy(&kv.key).into_owned(),
        value: kv.value,
        lease: kv.lease,
        mod_revision: kv.mod_revision,
    }
}

impl RecordStore for EtcdStore {
    type KeepAlive = EtcdKeepAlive;

    async fn grant(&self, ttl: i64) -> Result<Lease, StoreError> {
        let mut c = self.lease.clone();
        let req = self.request(LeaseGrantRequest { ttl, id: 0 });
        let r = self.call("lease grant", || format!("a lease of {ttl} s"), c.lease_grant(req)).await?;
        if !r.error.is_empty() {
            return Err(StoreError::Rpc {
                op: "lease grant",
                target: format!("a lease of {ttl} s"),
                endpoints: self.endpoints.clone(),
                code: tonic::Code::Unknown,
                message: r.error,
            });
        }
        Ok(Lease { id: r.id, ttl: r.ttl })
    }

    async fn keep_alive(&self, lease: i64) -> Result<EtcdKeepAlive, StoreError> {
        // The stream is opened by the first renewal: etcd sends the response headers only with
        // its first answer, so opening it before a request is on it would wait forever.
        let (tx, rx) = mpsc::channel(1);
        Ok(EtcdKeepAlive {
            lease,
            tx,
            opening: Some((self.lease.clone(), rx)),
            stream: None,
            endpoints: self.endpoints.clone(),
            timeout: self.timeout,
        })
    }

    async fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        let mut c = self.lease.clone();
        let req = self.request(LeaseRevokeRequest { id: lease });
        self.call("lease revoke", || format!("lease {lease:x}"), c.lease_revoke(req)).await?;
        Ok(())
    }

    async fn put(&self, key: &str, value: Vec<u8>, lease: i64) -> Result<(), StoreError> {
        let mut c = self.kv.clone();
        let req = self.request(PutRequest { key: key.as_bytes().to_vec(), value, lease, ..PutRequest::default() });
        self.call("put", || format!("key {key}"), c.put(req)).await?;
        Ok(())
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<Stored>, StoreError> {
        let end = prefix_end(prefix.as_bytes());
        let mut start = prefix.as_bytes().to_vec();
        let mut revision = 0;
        let mut out = Vec::new();
        loop {
            let mut c = self.kv.clone();
            let req = self.request(RangeRequest {
                key: start.clone(),
                range_end: end.clone(),
                limit: PAGE,
                revision,
                ..RangeRequest::default()
            });
            let r = self.call("range", || format!("prefix {prefix}"), c.range(req)).await?;
            if revision == 0 {
                // Later pages read the same revision as the first.
                revision = r.header.as_ref().map_or(0, |h| h.revision);
            }
            let last = r.kvs.last().map(|kv| kv.key.clone());
            out.extend(r.kvs.into_iter().map(stored));
            match last {
                Some(mut key) if r.more => {
                    key.push(0);
                    start = key;
                }
                _ => return Ok(out),
            }
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        let mut c = self.kv.clone();
        let req = self.request(RangeRequest { key: key.as_bytes().to_vec(), ..RangeRequest::default() });
        let r = self.call("range", || format!("key {key}"), c.range(req)).await?;
        Ok(r.kvs.into_iter().next().map(stored))
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let mut c = self.kv.clone();
        let req = self.request(DeleteRangeRequest { key: key.as_bytes().to_vec(), ..DeleteRangeRequest::default() });
        let r = self.call("delete", || format!("key {key}"), c.delete_range(req)).await?;
        Ok(r.deleted > 0)
    }
}

/// The keep-alive stream of one lease.
#[derive(Debug)]
pub struct EtcdKeepAlive {
    lease: i64,
    tx: mpsc::Sender<LeaseKeepAliveRequest>,
    /// The client and request source until the stream is open.
    opening: Option<(LeaseClient<Channel>, mpsc::Receiver<LeaseKeepAliveRequest>)>,
    stream: Option<tonic::Streaming<LeaseKeepAliveResponse>>,
    endpoints: String,
    timeout: Duration,
}

impl EtcdKeepAlive {
    fn rpc_error(&self, s: &tonic::Status) -> StoreError {
        StoreError::Rpc {
            op: "lease keep-alive",
            target: format!("lease {:x}", self.lease),
            endpoints: self.endpoints.clone(),
            code: s.code(),
            message: s.message().to_string(),
        }
    }

    fn ended(&self) -> StoreError {
        StoreError::StreamEnded { lease: self.lease, endpoints: self.endpoints.clone() }
    }

    async fn renew_once(&mut self) -> Result<i64, StoreError> {
        self.tx.send(LeaseKeepAliveRequest { id: self.lease }).await.map_err(|_| self.ended())?;
        if let Some((mut client, rx)) = self.opening.take() {
            let opened = client.lease_keep_alive(ReceiverStream::new(rx)).await.map_err(|s| self.rpc_error(&s))?;
            self.stream = Some(opened.into_inner());
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(self.ended());
        };
        match stream.message().await {
            Ok(Some(r)) => Ok(r.ttl),
            Ok(None) => Err(self.ended()),
            Err(s) => Err(self.rpc_error(&s)),
        }
    }
}

impl KeepAlive for EtcdKeepAlive {
    async fn renew(&mut self) -> Result<i64, StoreError> {
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, self.renew_once()).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout {
                op: "lease keep-alive",
                target: format!("lease {:x}", self.lease),
                endpoints: self.endpoints.clone(),
                timeout,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_every_key_with_the_prefix() {
        assert_eq!(prefix_end(b"/skydns/"), b"/skydns0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn endpoints_must_be_plain_http_urls() {
        assert!(check_endpoint("http://10.43.200.53:2379").is_ok());
        assert!(check_endpoint("http://etcd.weft-system:2379").is_ok());
        for bad in ["https://e:2379", "e:2379", "http://", "http://:2379", "http://a b:1"] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
        assert!(EtcdStore::connect(&[], Duration::from_secs(1)).is_err());
    }
}
