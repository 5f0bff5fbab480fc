//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, PodSpec};
use kube::api::ObjectMeta;

/// Hang guard: every await on the server is bounded by this.
pub async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), f).await.expect("test step timed out")
}

pub fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
}

pub fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        data: Some(data.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
        ..Default::default()
    }
}

pub fn node(name: &str, label_pairs: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), labels: labels(label_pairs), ..Default::default() },
        ..Default::default()
    }
}

pub fn pod(name: &str, node_name: Option<&str>, label_pairs: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta { name: Some(name.into()), labels: labels(label_pairs), ..Default::default() },
        spec: Some(PodSpec { node_name: node_name.map(Into::into), containers: vec![], ..Default::default() }),
        ..Default::default()
    }
}

/// The `code` and `reason` of a kube API error.
pub fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The `code` and `message` of a kube API error.
pub fn api_message<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}
