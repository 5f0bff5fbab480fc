//! NRI messages as the runtime sends them to the plugin: ttrpc's request envelope, then the
//! request of each `Plugin` service method decoded as the generated ttrpc service decodes it
//! (rust-protobuf), and what weft's plugin runtime reads from it first (`RuntimeInfo::from_request`
//! and the subscription for `Configure`, the event number of `StateChange`, the masks). The first
//! byte picks the message; the rest is its protobuf encoding.
#![no_main]
use libfuzzer_sys::fuzz_target;
use protobuf::Message;
use weft_nri::api;
use weft_nri::event::{Event, EventMask};
use weft_nri::plugin::{RuntimeInfo, subscription};

fn decode<M: Message>(bytes: &[u8]) -> Option<M> {
    M::parse_from_bytes(bytes).ok()
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else { return };
    match which % 16 {
        0 => {
            let _ = decode::<ttrpc::proto::Request>(bytes);
        }
        1 => {
            if let Some(req) = decode::<api::ConfigureRequest>(bytes) {
                let info = RuntimeInfo::from_request(&req);
                let _ = subscription(EventMask::ALL, &info);
                let _ = subscription(EventMask::UP_TO_V0_9, &info);
            }
        }
        2 => {
            let _ = decode::<api::SynchronizeRequest>(bytes);
        }
        3 => {
            let _ = decode::<api::CreateContainerRequest>(bytes);
        }
        4 => {
            let _ = decode::<api::UpdateContainerRequest>(bytes);
        }
        5 => {
            let _ = decode::<api::StopContainerRequest>(bytes);
        }
        6 => {
            let _ = decode::<api::UpdatePodSandboxRequest>(bytes);
        }
        7 => {
            if let Some(req) = decode::<api::StateChangeEvent>(bytes) {
                let _ = Event::from_number(req.event.value());
            }
        }
        8 => {
            let _ = decode::<api::RunPodSandboxRequest>(bytes);
        }
        9 => {
            let _ = decode::<api::PostCreateContainerRequest>(bytes);
        }
        10 => {
            let _ = decode::<api::StartContainerRequest>(bytes);
        }
        11 => {
            let _ = decode::<api::RemoveContainerRequest>(bytes);
        }
        12 => {
            let _ = decode::<api::UpdateContainersResponse>(bytes);
        }
        13 => {
            let _ = decode::<api::ConfigureResponse>(bytes);
        }
        14 => {
            let _ = decode::<ttrpc::proto::Response>(bytes);
        }
        _ => {
            if bytes.len() >= 4 {
                let wire = i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                let mask = EventMask::from_wire(wire);
                let _ = mask.iter().count();
                let _ = mask.unknown_bits();
            }
        }
    }
});
