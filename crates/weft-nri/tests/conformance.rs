//! Wire conformance: field numbers and tags of every message weft uses, checked against bytes
//! written by hand from the protocol description (shared/reference/nri-orm.md §1), the mux
//! framing and the event masks.
#![allow(clippy::unwrap_used)]

use protobuf::{Message, MessageField};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_nri::api;
use weft_nri::event::{Event, EventMask};
use weft_nri::mux::{self, MAX_PAYLOAD, MAX_WRITE_PAYLOAD, Mux};

fn enc<M: Message>(m: &M) -> Vec<u8> {
    m.write_to_bytes().unwrap()
}

/// A length-delimited field: tag, length, payload.
fn ld(tag: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 128);
    let mut v = vec![tag, payload.len() as u8];
    v.extend_from_slice(payload);
    v
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

fn oi64(v: i64) -> MessageField<api::OptionalInt64> {
    let mut o = api::OptionalInt64::new();
    o.value = v;
    MessageField::some(o)
}

fn ou64(v: u64) -> MessageField<api::OptionalUInt64> {
    let mut o = api::OptionalUInt64::new();
    o.value = v;
    MessageField::some(o)
}

#[test]
fn register_plugin_request() {
    let mut m = api::RegisterPluginRequest::new();
    m.plugin_name = "weft".into();
    m.plugin_idx = "00".into();
    m.NRI_version = "v0.12.0".into();
    let want = cat(&[ld(0x0a, b"weft"), ld(0x12, b"00"), ld(0x1a, b"v0.12.0")]);
    assert_eq!(enc(&m), want);
    assert_eq!(api::RegisterPluginRequest::parse_from_bytes(&want).unwrap(), m);
}

#[test]
fn configure_request_and_response() {
    let mut m = api::ConfigureRequest::new();
    m.config = "c".into();
    m.runtime_name = "containerd".into();
    m.runtime_version = "2.2".into();
    m.registration_timeout = 5000; // 0x88 0x27
    m.request_timeout = 2000; // 0xd0 0x0f
    m.NRI_version = "v0.12.0".into();
    let want = cat(&[
        ld(0x0a, b"c"),
        ld(0x12, b"containerd"),
        ld(0x1a, b"2.2"),
        vec![0x20, 0x88, 0x27],
        vec![0x28, 0xd0, 0x0f],
        ld(0x32, b"v0.12.0"),
    ]);
    assert_eq!(enc(&m), want);
    assert_eq!(api::ConfigureRequest::parse_from_bytes(&want).unwrap(), m);

    // ConfigureResponse.events: int32 field 2 (varint, tag 0x10); Katalyst's mask 0x8D.
    let mut r = api::ConfigureResponse::new();
    r.events = 0x8d;
    assert_eq!(enc(&r), vec![0x10, 0x8d, 0x01]);
    assert_eq!(api::ConfigureResponse::parse_from_bytes(&[0x10, 0x8d, 0x01]).unwrap().events, 0x8d);
}

#[test]
fn synchronize_messages() {
    let mut pod = api::PodSandbox::new();
    pod.id = "p".into();
    let mut ctr = api::Container::new();
    ctr.id = "c".into();
    let mut m = api::SynchronizeRequest::new();
    m.pods = vec![pod];
    m.containers = vec![ctr];
    m.more = true;
    let want = cat(&[ld(0x0a, &ld(0x0a, b"p")), ld(0x12, &ld(0x0a, b"c")), vec![0x18, 0x01]]);
    assert_eq!(enc(&m), want);
    assert_eq!(api::SynchronizeRequest::parse_from_bytes(&want).unwrap(), m);

    let mut u = api::ContainerUpdate::new();
    u.container_id = "c".into();
    let mut r = api::SynchronizeResponse::new();
    r.update = vec![u];
    r.more = true;
    assert_eq!(enc(&r), cat(&[ld(0x0a, &ld(0x0a, b"c")), vec![0x10, 0x01]]));
}

#[test]
fn pod_sandbox_fields() {
    let mut linux = api::LinuxPodSandbox::new();
    linux.cgroup_parent = "kubepods".into();
    linux.cgroups_path = "cg".into();
    let mut res = api::LinuxResources::new();
    res.unified.insert("k".into(), "v".into());
    linux.resources = MessageField::some(res.clone());
    linux.pod_overhead = MessageField::some(res.clone());
    linux.pod_resources = MessageField::some(res);
    let mut p = api::PodSandbox::new();
    p.id = "id".into();
    p.name = "n".into();
    p.uid = "u".into();
    p.namespace = "ns".into();
    p.labels.insert("l".into(), "x".into());
    p.annotations.insert("a".into(), "y".into());
    p.runtime_handler = "runc".into();
    p.linux = MessageField::some(linux);
    p.pid = 7;
    p.ips = vec!["10.0.0.1".into()];
    let unified = ld(0x32, &cat(&[ld(0x0a, b"k"), ld(0x12, b"v")]));
    let want_linux =
        cat(&[ld(0x0a, &unified), ld(0x12, &unified), ld(0x1a, b"kubepods"), ld(0x22, b"cg"), ld(0x32, &unified)]);
    let want = cat(&[
        ld(0x0a, b"id"),
        ld(0x12, b"n"),
        ld(0x1a, b"u"),
        ld(0x22, b"ns"),
        ld(0x2a, &cat(&[ld(0x0a, b"l"), ld(0x12, b"x")])),
        ld(0x32, &cat(&[ld(0x0a, b"a"), ld(0x12, b"y")])),
        ld(0x3a, b"runc"),
        ld(0x42, &want_linux),
        vec![0x48, 0x07],
        ld(0x52, b"10.0.0.1"),
    ]);
    assert_eq!(enc(&p), want);
    assert_eq!(api::PodSandbox::parse_from_bytes(&want).unwrap(), p);
}

#[test]
fn container_fields() {
    let mut cpu = api::LinuxCPU::new();
    cpu.cpus = "0-3".into();
    let mut res = api::LinuxResources::new();
    res.cpu = MessageField::some(cpu);
    let mut linux = api::LinuxContainer::new();
    linux.resources = MessageField::some(res);
    linux.cgroups_path = "p".into();
    let mut c = api::Container::new();
    c.id = "c".into();
    c.pod_sandbox_id = "p".into();
    c.name = "n".into();
    c.state = api::ContainerState::CONTAINER_RUNNING.into();
    c.labels.insert("l".into(), "x".into());
    c.annotations.insert("a".into(), "y".into());
    c.args = vec!["sh".into()];
    c.env = vec!["A=1".into()];
    c.linux = MessageField::some(linux);
    c.pid = 9;
    let want = cat(&[
        ld(0x0a, b"c"),
        ld(0x12, b"p"),
        ld(0x1a, b"n"),
        vec![0x20, 0x03],
        ld(0x2a, &cat(&[ld(0x0a, b"l"), ld(0x12, b"x")])),
        ld(0x32, &cat(&[ld(0x0a, b"a"), ld(0x12, b"y")])),
        ld(0x3a, b"sh"),
        ld(0x42, b"A=1"),
        // linux = 11 → tag 0x5a; LinuxContainer.resources = 3 (0x1a), cgroups_path = 5 (0x2a)
        ld(0x5a, &cat(&[ld(0x1a, &ld(0x12, &ld(0x32, b"0-3"))), ld(0x2a, b"p")])),
        vec![0x60, 0x09],
    ]);
    assert_eq!(enc(&c), want);
    assert_eq!(api::Container::parse_from_bytes(&want).unwrap(), c);
}

#[test]
fn unknown_fields_survive() {
    // Container with mounts (field 9, not in weft's proto): [0x4a, len, Mount{destination=1}]
    let bytes = cat(&[ld(0x0a, b"c"), ld(0x4a, &ld(0x0a, b"/data"))]);
    let c = api::Container::parse_from_bytes(&bytes).unwrap();
    assert_eq!(c.id, "c");
    assert_eq!(enc(&c), bytes);
}

#[test]
fn linux_resources_cpu_memory() {
    let mut cpu = api::LinuxCPU::new();
    cpu.shares = ou64(1024);
    cpu.quota = oi64(-1);
    cpu.period = ou64(100_000);
    cpu.realtime_runtime = oi64(1);
    cpu.realtime_period = ou64(2);
    cpu.cpus = "2-3".into();
    cpu.mems = "0".into();
    let want_cpu = cat(&[
        ld(0x0a, &[0x08, 0x80, 0x08]),
        // -1 as int64: ten-byte varint
        ld(0x12, &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
        ld(0x1a, &[0x08, 0xa0, 0x8d, 0x06]),
        ld(0x22, &[0x08, 0x01]),
        ld(0x2a, &[0x08, 0x02]),
        ld(0x32, b"2-3"),
        ld(0x3a, b"0"),
    ]);
    assert_eq!(enc(&cpu), want_cpu);

    let ob = |v| {
        let mut o = api::OptionalBool::new();
        o.value = v;
        MessageField::some(o)
    };
    let mut mem = api::LinuxMemory::new();
    mem.limit = oi64(1);
    mem.reservation = oi64(2);
    mem.swap = oi64(3);
    mem.kernel = oi64(4);
    mem.kernel_tcp = oi64(5);
    mem.swappiness = ou64(6);
    mem.disable_oom_killer = ob(true);
    mem.use_hierarchy = ob(true);
    let want_mem = cat(&[
        ld(0x0a, &[0x08, 1]),
        ld(0x12, &[0x08, 2]),
        ld(0x1a, &[0x08, 3]),
        ld(0x22, &[0x08, 4]),
        ld(0x2a, &[0x08, 5]),
        ld(0x32, &[0x08, 6]),
        ld(0x3a, &[0x08, 1]),
        ld(0x42, &[0x08, 1]),
    ]);
    assert_eq!(enc(&mem), want_mem);

    let os = |v: &str| {
        let mut o = api::OptionalString::new();
        o.value = v.into();
        MessageField::some(o)
    };
    let mut hp = api::HugepageLimit::new();
    hp.page_size = "2MB".into();
    hp.limit = 4;
    let mut pids = api::LinuxPids::new();
    pids.limit = 5;
    let mut r = api::LinuxResources::new();
    r.memory = MessageField::some(mem);
    r.cpu = MessageField::some(cpu);
    r.hugepage_limits = vec![hp];
    r.blockio_class = os("b");
    r.rdt_class = os("r");
    r.unified.insert("memory.high".into(), "100".into());
    r.pids = MessageField::some(pids);
    let want = cat(&[
        ld(0x0a, &want_mem),
        ld(0x12, &want_cpu),
        ld(0x1a, &cat(&[ld(0x0a, b"2MB"), vec![0x10, 4]])),
        ld(0x22, &ld(0x0a, b"b")),
        ld(0x2a, &ld(0x0a, b"r")),
        ld(0x32, &cat(&[ld(0x0a, b"memory.high"), ld(0x12, b"100")])),
        ld(0x42, &[0x08, 5]),
    ]);
    assert_eq!(enc(&r), want);
    assert_eq!(api::LinuxResources::parse_from_bytes(&want).unwrap(), r);
}

#[test]
fn container_adjustment_has_no_field_one() {
    let mut kv = api::KeyValue::new();
    kv.key = "A".into();
    kv.value = "1".into();
    // ContainerAdjustment.env = 4 → tag 0x22; KeyValue{key=1, value=2}
    let mut a = api::ContainerAdjustment::new();
    a.env = vec![kv];
    assert_eq!(enc(&a), vec![0x22, 0x06, 0x0a, 0x01, b'A', 0x12, 0x01, b'1']);

    let mut a = api::ContainerAdjustment::new();
    a.annotations.insert("k".into(), "v".into());
    assert_eq!(enc(&a), vec![0x12, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v']);

    let mut cpu = api::LinuxCPU::new();
    cpu.cpus = "1".into();
    let mut res = api::LinuxResources::new();
    res.cpu = MessageField::some(cpu);
    let mut l = api::LinuxContainerAdjustment::new();
    l.resources = MessageField::some(res);
    l.cgroups_path = "x".into();
    let mut a = api::ContainerAdjustment::new();
    a.linux = MessageField::some(l);
    a.args = vec!["a".into()];
    // linux = 6 → 0x32; LinuxContainerAdjustment.resources = 2 (0x12), cgroups_path = 3 (0x1a);
    // args = 9 → 0x4a
    let want = cat(&[ld(0x32, &cat(&[ld(0x12, &ld(0x12, &ld(0x32, b"1"))), ld(0x1a, b"x")])), ld(0x4a, b"a")]);
    assert_eq!(enc(&a), want);
    assert_eq!(api::ContainerAdjustment::parse_from_bytes(&want).unwrap(), a);
}

#[test]
fn updates_and_evictions() {
    let mut cpu = api::LinuxCPU::new();
    cpu.cpus = "1".into();
    let mut res = api::LinuxResources::new();
    res.cpu = MessageField::some(cpu);
    let mut lu = api::LinuxContainerUpdate::new();
    lu.resources = MessageField::some(res);
    let mut u = api::ContainerUpdate::new();
    u.container_id = "c".into();
    u.linux = MessageField::some(lu);
    u.ignore_failure = true;
    let want_u = cat(&[ld(0x0a, b"c"), ld(0x12, &ld(0x0a, &ld(0x12, &ld(0x32, b"1")))), vec![0x18, 0x01]]);
    assert_eq!(enc(&u), want_u);

    let mut e = api::ContainerEviction::new();
    e.container_id = "d".into();
    e.reason = "r".into();
    let want_e = cat(&[ld(0x0a, b"d"), ld(0x12, b"r")]);
    assert_eq!(enc(&e), want_e);

    let mut req = api::UpdateContainersRequest::new();
    req.update = vec![u.clone()];
    req.evict = vec![e.clone()];
    assert_eq!(enc(&req), cat(&[ld(0x0a, &want_u), ld(0x12, &want_e)]));
    let mut rsp = api::UpdateContainersResponse::new();
    rsp.failed = vec![u.clone()];
    assert_eq!(enc(&rsp), ld(0x0a, &want_u));

    let mut a = api::ContainerAdjustment::new();
    a.args = vec!["x".into()];
    let mut cc = api::CreateContainerResponse::new();
    cc.adjust = MessageField::some(a);
    cc.update = vec![u.clone()];
    cc.evict = vec![e.clone()];
    assert_eq!(enc(&cc), cat(&[ld(0x0a, &ld(0x4a, b"x")), ld(0x12, &want_u), ld(0x1a, &want_e)]));

    let mut ur = api::UpdateContainerResponse::new();
    ur.update = vec![u.clone()];
    ur.evict = vec![e];
    assert_eq!(enc(&ur), cat(&[ld(0x0a, &want_u), ld(0x12, &want_e)]));

    let mut sr = api::StopContainerResponse::new();
    sr.update = vec![u];
    assert_eq!(enc(&sr), ld(0x0a, &want_u));
}

#[test]
fn event_requests() {
    let mut pod = api::PodSandbox::new();
    pod.id = "p".into();
    let mut ctr = api::Container::new();
    ctr.id = "c".into();
    let p = ld(0x0a, &ld(0x0a, b"p"));
    let pc = cat(&[p.clone(), ld(0x12, &ld(0x0a, b"c"))]);

    let mut s = api::StateChangeEvent::new();
    s.event = api::Event::REMOVE_CONTAINER.into();
    s.pod = MessageField::some(pod.clone());
    s.container = MessageField::some(ctr.clone());
    assert_eq!(enc(&s), cat(&[vec![0x08, 11], ld(0x12, &ld(0x0a, b"p")), ld(0x1a, &ld(0x0a, b"c"))]));

    macro_rules! pod_only {
        ($t:ident) => {{
            let mut r = api::$t::new();
            r.pod = MessageField::some(pod.clone());
            assert_eq!(enc(&r), p, stringify!($t));
        }};
    }
    macro_rules! pod_ctr {
        ($t:ident) => {{
            let mut r = api::$t::new();
            r.pod = MessageField::some(pod.clone());
            r.container = MessageField::some(ctr.clone());
            assert_eq!(enc(&r), pc, stringify!($t));
        }};
    }
    pod_only!(RunPodSandboxRequest);
    pod_only!(StopPodSandboxRequest);
    pod_only!(RemovePodSandboxRequest);
    pod_only!(PostUpdatePodSandboxRequest);
    pod_ctr!(CreateContainerRequest);
    pod_ctr!(PostCreateContainerRequest);
    pod_ctr!(StartContainerRequest);
    pod_ctr!(PostStartContainerRequest);
    pod_ctr!(PostUpdateContainerRequest);
    pod_ctr!(StopContainerRequest);
    pod_ctr!(RemoveContainerRequest);

    let mut cpu = api::LinuxCPU::new();
    cpu.cpus = "1".into();
    let mut res = api::LinuxResources::new();
    res.cpu = MessageField::some(cpu);
    let mut u = api::UpdateContainerRequest::new();
    u.pod = MessageField::some(pod.clone());
    u.container = MessageField::some(ctr);
    u.linux_resources = MessageField::some(res.clone());
    assert_eq!(enc(&u), cat(&[pc, ld(0x1a, &ld(0x12, &ld(0x32, b"1")))]));

    let mut up = api::UpdatePodSandboxRequest::new();
    up.pod = MessageField::some(pod);
    up.overhead_linux_resources = MessageField::some(res.clone());
    up.linux_resources = MessageField::some(res);
    let r = ld(0x12, &ld(0x32, b"1"));
    assert_eq!(enc(&up), cat(&[p, ld(0x12, &r), ld(0x1a, &r)]));
    assert!(enc(&api::Empty::new()).is_empty());
}

#[test]
fn event_numbers_and_masks() {
    assert_eq!(Event::RunPodSandbox.number(), 1);
    assert_eq!(Event::CreateContainer.number(), 4);
    assert_eq!(Event::RemoveContainer.number(), 11);
    assert_eq!(Event::PostUpdatePodSandbox.number(), 13);
    assert_eq!(Event::RunPodSandbox.bit(), 0x1);
    assert_eq!(Event::RemovePodSandbox.bit(), 0x4);
    assert_eq!(Event::CreateContainer.bit(), 0x8);
    assert_eq!(Event::UpdateContainer.bit(), 0x80);
    for e in Event::ALL {
        assert_eq!(Event::from_number(e.number()), Some(e));
        assert_eq!(api::Event::from_i32_checked(e.number()), e.number());
        assert_eq!(e.name().parse::<Event>().unwrap(), e);
    }
    let katalyst: EventMask =
        [Event::RunPodSandbox, Event::CreateContainer, Event::UpdateContainer, Event::RemovePodSandbox]
            .into_iter()
            .collect();
    assert_eq!(katalyst.bits(), 0x8d);
    assert_eq!(katalyst.to_string(), "RunPodSandbox,RemovePodSandbox,CreateContainer,UpdateContainer");
    assert_eq!(katalyst.to_string().parse::<EventMask>().unwrap(), katalyst);
    assert_eq!("RunPodSandbox,CreateContainer".parse::<EventMask>().unwrap().bits(), 0x9);
    assert_eq!("runpodsandbox, createcontainer".parse::<EventMask>().unwrap().bits(), 0x9);
    assert_eq!("all".parse::<EventMask>().unwrap(), EventMask::ALL);
    assert_eq!(EventMask::ALL.bits(), 0x3fff);
    assert!("RunPodSandbox,Bogus".parse::<EventMask>().is_err());
    assert_eq!(EventMask::from_wire(0), EventMask::ALL);
    assert_eq!(EventMask::from_bits(0x8000).to_string(), "unknown(0x8000)");
    let pod: EventMask = "pod".parse().unwrap();
    assert!(pod.contains(Event::RunPodSandbox) && pod.contains(Event::UpdatePodSandbox));
    assert!(!pod.contains(Event::CreateContainer));
}

trait CheckedEnum {
    fn from_i32_checked(n: i32) -> i32;
}

impl CheckedEnum for api::Event {
    /// The generated enum has the same numbers as ours.
    fn from_i32_checked(n: i32) -> i32 {
        use protobuf::Enum;
        api::Event::from_i32(n).map(|e| e.value()).unwrap_or(-1)
    }
}

#[test]
fn mux_frame_encoding_and_splitting() {
    // Readers take frames up to a ttrpc header plus ttrpc's 4 MiB; weft writes at most 4,096
    // bytes per frame, Go ttrpc's read buffer (a larger frame is ENOMEM in upstream's mux).
    assert_eq!(MAX_PAYLOAD, 4 * 1024 * 1024 + 10);
    assert_eq!(MAX_WRITE_PAYLOAD, 4096);
    assert_eq!(mux::encode_frames(2, b"hello"), vec![0, 0, 0, 2, 0, 0, 0, 5, b'h', b'e', b'l', b'l', b'o']);
    assert_eq!(mux::decode_header(&[0, 0, 0, 1, 0, 0, 1, 0]), (1, 256));
    assert!(mux::encode_frames(1, b"").is_empty());

    let data: Vec<u8> = (0..2 * 4096 + 5).map(|i| i as u8).collect();
    let out = mux::encode_frames(1, &data);
    assert_eq!(out.len(), data.len() + 3 * 8);
    assert_eq!(&out[..8], &[0, 0, 0, 1, 0, 0, 0x10, 0x00], "4,096 bytes");
    assert_eq!(&out[8..8 + 4096], &data[..4096]);
    assert_eq!(&out[4104..4112], &[0, 0, 0, 1, 0, 0, 0x10, 0x00]);
    assert_eq!(&out[8208..8216], &[0, 0, 0, 1, 0, 0, 0, 5]);
    assert_eq!(&out[8216..], &data[8192..]);
}

/// Reads frames from a raw trunk end until `total` payload bytes for `id` arrived.
async fn read_frames(raw: &mut tokio::io::DuplexStream, total: usize) -> Vec<(u32, Vec<u8>)> {
    let mut got = 0;
    let mut frames = Vec::new();
    while got < total {
        let mut h = [0u8; 8];
        raw.read_exact(&mut h).await.unwrap();
        let (id, len) = mux::decode_header(&h);
        assert!(len as usize <= MAX_WRITE_PAYLOAD, "a {len}-byte frame: Go ttrpc reads 4,096 at most");
        let mut p = vec![0u8; len as usize];
        raw.read_exact(&mut p).await.unwrap();
        got += p.len();
        frames.push((id, p));
    }
    frames
}

#[tokio::test]
async fn mux_write_splits_long_writes() {
    let (trunk, mut raw) = tokio::io::duplex(1 << 20);
    let m = Mux::new(trunk);
    m.start();
    let data: Vec<u8> = (0..MAX_PAYLOAD + 100).map(|i| (i % 251) as u8).collect();
    let writer = {
        let m = m.clone();
        let data = data.clone();
        tokio::spawn(async move { m.write(2, &data).await.unwrap() })
    };
    let frames = read_frames(&mut raw, data.len()).await;
    writer.await.unwrap();
    assert_eq!(frames.len(), data.len().div_ceil(4096));
    assert!(frames[..frames.len() - 1].iter().all(|(_, p)| p.len() == 4096));
    assert!(frames.iter().all(|(id, _)| *id == 2));
    assert_eq!(frames.into_iter().flat_map(|(_, p)| p).collect::<Vec<_>>(), data);
}

#[tokio::test]
async fn mux_sub_connections_round_trip_and_drop_unknown_ids() {
    let (trunk, mut raw) = tokio::io::duplex(1 << 20);
    let m = Mux::new(trunk);
    let mut c1 = m.open(1).unwrap();
    let mut c2 = m.open(2).unwrap();
    assert!(m.open(1).is_err());
    assert!(m.open(0).is_err());
    m.start();

    // Outbound: what a sub-connection writes arrives framed with its id (possibly split).
    let big: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i % 253) as u8).collect();
    let w = {
        let big = big.clone();
        tokio::spawn(async move {
            c2.write_all(&big).await.unwrap();
            c2
        })
    };
    let frames = read_frames(&mut raw, big.len()).await;
    let _c2 = w.await.unwrap();
    assert!(frames.iter().all(|(id, _)| *id == 2));
    assert_eq!(frames.into_iter().flat_map(|(_, p)| p).collect::<Vec<_>>(), big);

    // Inbound: a frame for id 7 (not open) is dropped, id 1's payload arrives.
    raw.write_all(&mux::encode_frames(7, b"lost")).await.unwrap();
    raw.write_all(&mux::encode_frames(1, b"ping")).await.unwrap();
    let mut buf = [0u8; 4];
    c1.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");

    // End of the trunk closes everything.
    drop(raw);
    let mut rest = Vec::new();
    assert_eq!(c1.read_to_end(&mut rest).await.unwrap(), 0);
    m.closed().await;
    assert!(m.is_closed());
    assert!(m.open(3).is_err());
}

#[tokio::test]
async fn a_mux_reading_as_go_ttrpc_closes_on_a_frame_over_its_buffer() {
    let (trunk, mut raw) = tokio::io::duplex(1 << 16);
    let m = Mux::with_read_limit(trunk, 4096);
    let mut c1 = m.open(1).unwrap();
    m.start();
    let full: Vec<u8> = vec![7; 4096];
    raw.write_all(&mux::encode_frames(1, &full)).await.unwrap();
    let mut got = vec![0u8; 4096];
    c1.read_exact(&mut got).await.unwrap();
    assert_eq!(got, full, "a 4,096-byte frame is read");
    raw.write_all(&mux::encode_header(1, 4097)).await.unwrap();
    raw.write_all(&[0u8; 4097]).await.unwrap();
    m.closed().await;
    assert!(m.close_reason().unwrap().contains("ENOMEM"), "{:?}", m.close_reason());
}

#[tokio::test]
async fn mux_rejects_oversized_frames() {
    let (trunk, mut raw) = tokio::io::duplex(1024);
    let m = Mux::new(trunk);
    let _c1 = m.open(1).unwrap();
    m.start();
    raw.write_all(&mux::encode_header(1, (MAX_PAYLOAD + 1) as u32)).await.unwrap();
    m.closed().await;
    assert!(m.close_reason().unwrap().contains("too large"));
}
