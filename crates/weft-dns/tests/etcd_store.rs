//! weft's etcd client and record layout against a real etcd (Debian `etcd-server`) on loopback:
//! records read back as CoreDNS's etcd plugin reads them, the lease semantics the registrar relies
//! on, paging of large prefix reads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use futures::StreamExt;

use support::{Etcd, Service, coredns_lookup, guard, until};
use weft_dns::record::{Owner, Prefix, Record};
use weft_dns::{KeepAlive, RecordStore};

fn owner(pod: &str) -> Owner {
    Owner { owner: "r1".into(), namespace: "default".into(), pod: pod.into(), pod_uid: format!("uid-{pod}") }
}

const DOMAIN: &str = "inference.net-a.video.default.vertexdomain.local";

#[tokio::test]
async fn records_are_read_back_as_coredns_reads_them() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let prefix = Prefix::new("/skydns").unwrap();
    let lease = store.grant(60).await.unwrap();
    for (pod, ip) in [("video-inference-0-a", "192.168.10.7"), ("video-inference-1-b", "192.168.10.8")] {
        let r = Record::new(ip.parse().unwrap(), 10, owner(pod));
        store.put(&prefix.record_key(DOMAIN, pod), r.to_bytes(), lease.id).await.unwrap();
    }
    // A neighbour whose name extends the vertex's ("inference-2") is not part of its answer.
    let other = Record::new("192.168.10.99".parse().unwrap(), 10, owner("x"));
    store
        .put(&prefix.record_key("inference-2.net-a.video.default.vertexdomain.local", "x"), other.to_bytes(), 0)
        .await
        .unwrap();

    // The raw state: the key layout and the exact JSON.
    let raw = store.get_prefix("/skydns/local/vertexdomain/default/video/net-a/inference/").await.unwrap();
    assert_eq!(
        raw.iter().map(|kv| kv.key.as_str()).collect::<Vec<_>>(),
        [
            "/skydns/local/vertexdomain/default/video/net-a/inference/video-inference-0-a",
            "/skydns/local/vertexdomain/default/video/net-a/inference/video-inference-1-b",
        ]
    );
    let v: serde_json::Value = serde_json::from_slice(&raw[0].value).unwrap();
    assert_eq!(v["host"], "192.168.10.7");
    assert_eq!(v["ttl"], 10, "the TTL field is present");
    assert_eq!(v["weft"]["owner"], "r1");
    assert_eq!(v["weft"]["podUID"], "uid-video-inference-0-a");
    assert!(raw.iter().all(|kv| kv.lease == lease.id), "every record is on the lease");

    // CoreDNS's view: msg.Service decodes (the marker is ignored), host is an A record.
    let service: Service = serde_json::from_slice(&raw[0].value).unwrap();
    assert_eq!(service, Service { host: "192.168.10.7".into(), ttl: 10, ..Service::default() });
    let answers = coredns_lookup(&store, "/skydns", DOMAIN).await.unwrap();
    let ips: Vec<String> = answers.iter().map(|a| a.ip.to_string()).collect();
    assert_eq!(ips, ["192.168.10.7", "192.168.10.8"]);
    assert!(answers.iter().all(|a| a.ip.is_ipv4() && a.ttl == 10));
    // With a trailing dot and upper case, as a resolver may send it.
    assert_eq!(coredns_lookup(&store, "/skydns", &format!("{}.", DOMAIN.to_uppercase())).await.unwrap().len(), 2);
    // A name higher in the tree answers the whole subtree, as CoreDNS does.
    assert_eq!(coredns_lookup(&store, "/skydns", "video.default.vertexdomain.local").await.unwrap().len(), 3);
    assert!(coredns_lookup(&store, "/skydns", "out.net-a.video.default.vertexdomain.local").await.unwrap().is_empty());
}

#[tokio::test]
async fn records_on_a_lease_that_is_not_kept_alive_expire_and_kept_ones_stay() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let prefix = Prefix::new("/skydns").unwrap();
    // Two registrars' leases of 2 s (etcd's minimum); only the first is kept alive.
    let kept = store.grant(2).await.unwrap();
    let dropped = store.grant(2).await.unwrap();
    assert_eq!((kept.ttl, dropped.ttl), (2, 2));
    let (k1, k2) = (prefix.record_key(DOMAIN, "kept"), prefix.record_key(DOMAIN, "dropped"));
    store.put(&k1, Record::new("10.0.0.1".parse().unwrap(), 10, owner("kept")).to_bytes(), kept.id).await.unwrap();
    store
        .put(&k2, Record::new("10.0.0.2".parse().unwrap(), 10, owner("dropped")).to_bytes(), dropped.id)
        .await
        .unwrap();

    let mut ka = store.keep_alive(kept.id).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    let renewing = tokio::spawn(async move {
        let mut renewals = 0u32;
        while !s.is_cancelled() {
            let left = ka.renew().await.expect("renew");
            assert!(left > 0, "a kept lease never runs out");
            renewals += 1;
            tokio::select! { _ = s.cancelled() => {}, _ = tokio::time::sleep(Duration::from_millis(500)) => {} }
        }
        renewals
    });
    until("the record on the dropped lease to expire", || async { store.get(&k2).await.unwrap().is_none() }).await;
    assert!(store.get(&k1).await.unwrap().is_some(), "the record on the kept lease is still there");
    stop.cancel();
    assert!(guard("the renewals", renewing).await.unwrap() > 0);

    // A keep-alive of a lease that is gone says so (TTL <= 0), as the registrar expects.
    let mut gone = store.keep_alive(dropped.id).await.unwrap();
    assert!(gone.renew().await.unwrap() <= 0);

    // Revoking removes its records at once.
    store.revoke(kept.id).await.unwrap();
    assert!(store.get(&k1).await.unwrap().is_none());
}

#[tokio::test]
async fn prefix_reads_page_through_many_keys_and_deletes_report_what_they_did() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    // More than one page (1000 keys per Range).
    let n = 2500;
    let results: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let store = store.clone();
            async move { store.put(&format!("/skydns/t/k{i:05}"), b"{}".to_vec(), 0).await }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    assert!(results.iter().all(Result::is_ok), "{:?}", results.iter().find(|r| r.is_err()));
    store.put("/skydns/u", b"{}".to_vec(), 0).await.unwrap();
    let all = store.get_prefix("/skydns/t/").await.unwrap();
    assert_eq!(all.len(), n);
    assert!(all.windows(2).all(|w| w[0].key < w[1].key), "in key order, no duplicates across pages");
    assert_eq!(all[n - 1].key, format!("/skydns/t/k{:05}", n - 1));
    assert!(store.delete("/skydns/u").await.unwrap());
    assert!(!store.delete("/skydns/u").await.unwrap(), "a second delete finds nothing");
    assert!(store.get("/skydns/u").await.unwrap().is_none());
}

#[tokio::test]
async fn failures_name_the_operation_the_key_and_the_endpoint() {
    // Nothing listens on this port (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let store = weft_dns::EtcdStore::connect(std::slice::from_ref(&endpoint), Duration::from_millis(300)).unwrap();
    let e = guard("the failed put", store.put("/skydns/a/b", b"{}".to_vec(), 0)).await.unwrap_err().to_string();
    assert!(e.contains("put") && e.contains("/skydns/a/b") && e.contains(&endpoint), "{e}");
}
