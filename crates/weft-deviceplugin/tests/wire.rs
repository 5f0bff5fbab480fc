//! The device plugin API's shapes against the published definition (field numbers, packed names,
//! gRPC service names), byte by byte: the bytes are written by hand from
//! k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto, not produced by weft's own encoder.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use prost::Message;
use tonic::server::NamedService;
use weft_deviceplugin::api;

fn field(tag: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![tag, u8::try_from(bytes.len()).unwrap()];
    out.extend_from_slice(bytes);
    out
}

#[test]
fn register_request_numbers_its_fields_as_upstream() {
    // version = 1, endpoint = 2, resource_name = 3, options = 4 {pre_start_required = 1,
    // get_preferred_allocation_available = 2}.
    let mut want = field(0x0a, b"v1beta1");
    want.extend(field(0x12, b"weft.sock"));
    want.extend(field(0x1a, b"nvidia.com/gpu"));
    want.extend(field(0x22, &[0x08, 0x01, 0x10, 0x01]));
    let r = api::RegisterRequest::decode(want.as_slice()).unwrap();
    assert_eq!(r.version, "v1beta1");
    assert_eq!(r.endpoint, "weft.sock");
    assert_eq!(r.resource_name, "nvidia.com/gpu");
    assert_eq!(
        r.options,
        Some(api::DevicePluginOptions { pre_start_required: true, get_preferred_allocation_available: true })
    );
    assert_eq!(r.encode_to_vec(), want);
}

#[test]
fn devices_carry_id_health_and_numa_nodes_as_upstream() {
    // ListAndWatchResponse.devices = 1; Device: ID = 1, health = 2, topology = 3;
    // TopologyInfo.nodes = 1; NUMANode.ID = 1 (int64).
    let numa = field(0x0a, &[0x08, 0x01]);
    let mut device = field(0x0a, b"GPU-1");
    device.extend(field(0x12, b"Healthy"));
    device.extend(field(0x1a, &numa));
    let want = field(0x0a, &device);
    let list = api::ListAndWatchResponse::decode(want.as_slice()).unwrap();
    let d = &list.devices[0];
    assert_eq!((d.id.as_str(), d.health.as_str()), ("GPU-1", "Healthy"));
    assert_eq!(d.topology.as_ref().unwrap().nodes[0].id, 1);
    assert_eq!(list.encode_to_vec(), want);
}

#[test]
fn preferred_allocation_and_allocate_number_their_fields_as_upstream() {
    // ContainerPreferredAllocationRequest: available_deviceIDs = 1, must_include_deviceIDs = 2,
    // allocation_size = 3.
    let mut c = field(0x0a, b"a");
    c.extend(field(0x0a, b"b"));
    c.extend(field(0x12, b"b"));
    c.extend([0x18, 0x02]);
    let r = api::PreferredAllocationRequest::decode(field(0x0a, &c).as_slice()).unwrap();
    let c0 = &r.container_requests[0];
    assert_eq!(
        (c0.available_device_i_ds.len(), c0.must_include_device_i_ds.as_slice(), c0.allocation_size),
        (2, &["b".to_string()][..], 2)
    );

    // ContainerAllocateRequest.devices_ids = 1.
    let a = api::AllocateRequest::decode(field(0x0a, &field(0x0a, b"GPU-1")).as_slice()).unwrap();
    assert_eq!(a.container_requests[0].devices_ids, vec!["GPU-1".to_string()]);

    // ContainerAllocateResponse: envs = 1 (map entry key 1, value 2), mounts = 2, devices = 3,
    // annotations = 4, cdi_devices = 5 {name = 1}.
    let mut env = field(0x0a, b"K");
    env.extend(field(0x12, b"V"));
    let mut want = field(0x0a, &env);
    want.extend(field(0x2a, &field(0x0a, b"nvidia.com/gpu=GPU-1")));
    let resp = api::ContainerAllocateResponse::decode(want.as_slice()).unwrap();
    assert_eq!(resp.envs, HashMap::from([("K".to_string(), "V".to_string())]));
    assert_eq!(resp.cdi_devices[0].name, "nvidia.com/gpu=GPU-1");
    let mut mount = field(0x0a, b"/c");
    mount.extend(field(0x12, b"/h"));
    mount.extend([0x18, 0x01]);
    let m = api::ContainerAllocateResponse::decode(field(0x12, &mount).as_slice()).unwrap();
    assert_eq!(m.mounts[0], api::Mount { container_path: "/c".into(), host_path: "/h".into(), read_only: true });
    let mut spec = field(0x0a, b"/dev/x");
    spec.extend(field(0x12, b"/dev/y"));
    spec.extend(field(0x1a, b"rw"));
    let d = api::ContainerAllocateResponse::decode(field(0x1a, &spec).as_slice()).unwrap();
    assert_eq!(d.devices[0].permissions, "rw");
}

#[test]
fn services_have_the_kubelets_names() {
    // gRPC paths are /<package>.<Service>/<Method>; the kubelet dials these.
    type Plugin = api::device_plugin_server::DevicePluginServer<Dummy>;
    assert_eq!(<Plugin as NamedService>::NAME, "v1beta1.DevicePlugin");
    type Registration = api::registration_server::RegistrationServer<Dummy>;
    assert_eq!(<Registration as NamedService>::NAME, "v1beta1.Registration");
}

struct Dummy;

#[test]
fn pod_resources_list_reads_upstream_bytes_and_skips_the_fields_weft_leaves_out() {
    // k8s.io/kubelet/pkg/apis/podresources/v1/api.proto: ListPodResourcesResponse.pod_resources = 1;
    // PodResources: name = 1, namespace = 2, containers = 3, cpu_ids = 4 (left out by weft);
    // ContainerResources: name = 1, devices = 2, cpu_ids = 3 (left out); ContainerDevices:
    // resource_name = 1, device_ids = 2, topology = 3.
    use weft_deviceplugin::podresources::api as pr;
    let mut devices = field(0x0a, b"nvidia.com/gpu");
    devices.extend(field(0x12, b"GPU-a"));
    devices.extend(field(0x12, b"GPU-b"));
    devices.extend(field(0x1a, &field(0x0a, &[0x08, 0x01])));
    let mut container = field(0x0a, b"main");
    container.extend(field(0x12, &devices));
    container.extend(field(0x1a, &[0x02, 0x03])); // cpu_ids, packed int64 [2, 3]
    let mut pod = field(0x0a, b"trainer");
    pod.extend(field(0x12, b"ml"));
    pod.extend(field(0x1a, &container));
    pod.extend(field(0x22, &[0x05])); // cpu_ids
    let bytes = field(0x0a, &pod);
    let list = pr::ListPodResourcesResponse::decode(bytes.as_slice()).unwrap();
    let p = &list.pod_resources[0];
    assert_eq!((p.name.as_str(), p.namespace.as_str()), ("trainer", "ml"));
    let c = &p.containers[0];
    assert_eq!(c.name, "main");
    assert_eq!(c.devices[0].resource_name, "nvidia.com/gpu");
    assert_eq!(c.devices[0].device_ids, ["GPU-a", "GPU-b"]);
    assert_eq!(c.devices[0].topology.as_ref().unwrap().nodes[0].id, 1);
    let held = weft_deviceplugin::podresources::devices_of(&list.pod_resources, "nvidia.com/gpu");
    assert_eq!(held.values().next().unwrap(), &["GPU-a", "GPU-b"]);
    assert!(weft_deviceplugin::podresources::devices_of(&list.pod_resources, "example.com/vf").is_empty());
}

#[test]
fn the_pod_resources_service_has_the_upstream_name() {
    use weft_deviceplugin::podresources::api::pod_resources_lister_server::PodResourcesListerServer;
    struct Never;
    #[tonic::async_trait]
    impl weft_deviceplugin::podresources::api::pod_resources_lister_server::PodResourcesLister for Never {
        async fn list(
            &self,
            _: tonic::Request<weft_deviceplugin::podresources::api::ListPodResourcesRequest>,
        ) -> Result<tonic::Response<weft_deviceplugin::podresources::api::ListPodResourcesResponse>, tonic::Status>
        {
            Err(tonic::Status::unimplemented("test"))
        }
    }
    assert_eq!(<PodResourcesListerServer<Never> as NamedService>::NAME, "v1.PodResourcesLister");
}
