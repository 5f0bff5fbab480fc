//! The encoded GPU payload: what [`GpuCodec::encode`](super::GpuCodec::encode) puts in a
//! frame's payload and [`GpuCodec::decode`](super::GpuCodec::decode) reads back. Pure: no CUDA
//! here.
//!
//! All integers are little-endian. Both kinds start with the same 16 bytes:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0 | 4 | magic `WGPU` |
//! | 4 | 1 | version, [`VERSION`] (1) |
//! | 5 | 1 | kind: 1 IPC handle, 2 staged bytes |
//! | 6 | 2 | reserved, 0 |
//! | 8 | 8 | buffer length in bytes |
//!
//! **IPC** (same node), exactly [`IPC_LEN`] bytes:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 16 | 16 | node identity (the kernel's boot id) |
//! | 32 | 16 | UUID of the exporting GPU |
//! | 48 | 4 | exporting process id (for messages only) |
//! | 52 | 4 | reserved, 0 |
//! | 56 | 8 | offset of the buffer in its allocation |
//! | 64 | 64 | `CUipcMemHandle` of the allocation |
//!
//! **Staged** (any node): bytes 16–63 are reserved (0), the buffer's bytes follow from
//! [`STAGED_PREFIX`], so the payload is exactly `64 + length` bytes and the data is 64-byte
//! aligned within it.

/// The first bytes of every GPU payload.
pub const MAGIC: &[u8; 4] = b"WGPU";
/// The encoding's version.
pub const VERSION: u8 = 1;
/// Length of an IPC payload.
pub const IPC_LEN: usize = 128;
/// Bytes before the data of a staged payload.
pub const STAGED_PREFIX: usize = 64;

const KIND_IPC: u8 = 1;
const KIND_STAGED: u8 = 2;

/// A CUDA IPC memory handle descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcDescriptor {
    /// The exporting node's identity (boot id).
    pub node: [u8; 16],
    /// The exporting GPU's UUID.
    pub device: [u8; 16],
    /// The exporting process.
    pub pid: u32,
    /// Where the buffer starts in the allocation the handle names.
    pub offset: u64,
    /// The buffer's length.
    pub len: u64,
    /// The `CUipcMemHandle` bytes.
    pub handle: [u8; 64],
}

/// A decoded GPU payload header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Descriptor {
    /// A device allocation on this node, to be opened through CUDA IPC.
    Ipc(IpcDescriptor),
    /// The buffer's bytes follow at [`STAGED_PREFIX`].
    Staged {
        /// The buffer's length.
        len: u64,
    },
}

fn head(kind: u8, len: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    b[5] = kind;
    b[8..16].copy_from_slice(&len.to_le_bytes());
    b
}

/// The IPC payload.
pub fn encode_ipc(d: &IpcDescriptor) -> [u8; IPC_LEN] {
    let mut b = [0u8; IPC_LEN];
    b[0..16].copy_from_slice(&head(KIND_IPC, d.len));
    b[16..32].copy_from_slice(&d.node);
    b[32..48].copy_from_slice(&d.device);
    b[48..52].copy_from_slice(&d.pid.to_le_bytes());
    b[56..64].copy_from_slice(&d.offset.to_le_bytes());
    b[64..128].copy_from_slice(&d.handle);
    b
}

/// The first [`STAGED_PREFIX`] bytes of a staged payload of `len` data bytes.
pub fn staged_prefix(len: u64) -> [u8; STAGED_PREFIX] {
    let mut b = [0u8; STAGED_PREFIX];
    b[0..16].copy_from_slice(&head(KIND_STAGED, len));
    b
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(w)
}

/// Reads a GPU payload's descriptor; checks its length against the whole payload. The error
/// names the field and offset.
pub fn decode(payload: &[u8]) -> Result<Descriptor, String> {
    if payload.len() < 16 {
        return Err(format!("GPU payload of {} bytes is shorter than its 16-byte header", payload.len()));
    }
    if &payload[0..4] != MAGIC {
        return Err(format!(
            "not a GPU payload: it starts with {:02x?}, expected {:?}",
            &payload[0..4],
            String::from_utf8_lossy(MAGIC)
        ));
    }
    if payload[4] != VERSION {
        return Err(format!("GPU payload version {} at offset 4, this side reads {VERSION}", payload[4]));
    }
    if payload[6..8] != [0, 0] {
        return Err("GPU payload reserved bytes 6-7 are not zero".into());
    }
    let len = u64_at(payload, 8);
    match payload[5] {
        KIND_IPC => {
            if payload.len() != IPC_LEN {
                return Err(format!("GPU IPC payload of {} bytes, expected {IPC_LEN}", payload.len()));
            }
            if payload[52..56] != [0; 4] {
                return Err("GPU IPC payload reserved bytes 52-55 are not zero".into());
            }
            let mut d = IpcDescriptor {
                node: [0; 16],
                device: [0; 16],
                pid: u32::from_le_bytes([payload[48], payload[49], payload[50], payload[51]]),
                offset: u64_at(payload, 56),
                len,
                handle: [0; 64],
            };
            d.node.copy_from_slice(&payload[16..32]);
            d.device.copy_from_slice(&payload[32..48]);
            d.handle.copy_from_slice(&payload[64..128]);
            if d.offset.checked_add(d.len).is_none() {
                return Err(format!("GPU IPC payload: offset {} plus length {} overflows", d.offset, d.len));
            }
            Ok(Descriptor::Ipc(d))
        }
        KIND_STAGED => {
            let want = (STAGED_PREFIX as u64).checked_add(len);
            if want != Some(payload.len() as u64) {
                return Err(format!(
                    "GPU staged payload of {} bytes announces {len} data bytes, so it should be \
                     {STAGED_PREFIX} + {len}",
                    payload.len()
                ));
            }
            if payload[16..STAGED_PREFIX].iter().any(|&b| b != 0) {
                return Err("GPU staged payload reserved bytes 16-63 are not zero".into());
            }
            Ok(Descriptor::Staged { len })
        }
        k => Err(format!("GPU payload kind {k} at offset 5, expected 1 (IPC) or 2 (staged)")),
    }
}

/// Checks an IPC descriptor can be opened here: it must come from this node.
pub fn check_same_node(d: &IpcDescriptor, local_node: &[u8; 16]) -> Result<(), String> {
    if &d.node != local_node {
        return Err(format!(
            "GPU IPC handle from another node (boot id {}, this node {}; exporting process \
             {}): CUDA IPC only works on one node, send it staged",
            hex(&d.node),
            hex(local_node),
            d.pid
        ));
    }
    Ok(())
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses the kernel's boot id (`/proc/sys/kernel/random/boot_id`, a UUID with dashes).
pub fn parse_boot_id(text: &str) -> Result<[u8; 16], String> {
    let digits: Vec<u8> = text.trim().bytes().filter(|&b| b != b'-').collect();
    if digits.len() != 32 {
        return Err(format!("boot id {:?} is not a UUID", text.trim()));
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).map_err(|e| e.to_string())?;
        out[i] = u8::from_str_radix(s, 16).map_err(|_| format!("boot id {:?} is not a UUID", text.trim()))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IpcDescriptor {
        IpcDescriptor {
            node: [7; 16],
            device: [9; 16],
            pid: 4242,
            offset: 4096,
            len: 416 * 416 * 3,
            handle: std::array::from_fn(|i| i as u8),
        }
    }

    #[test]
    fn ipc_descriptor_round_trips() {
        let d = sample();
        assert_eq!(decode(&encode_ipc(&d)), Ok(Descriptor::Ipc(d)));
    }

    #[test]
    fn staged_payload_round_trips() {
        let mut p = staged_prefix(5).to_vec();
        p.extend_from_slice(b"hello");
        assert_eq!(decode(&p), Ok(Descriptor::Staged { len: 5 }));
        assert_eq!(decode(&staged_prefix(0)), Ok(Descriptor::Staged { len: 0 }));
    }

    #[test]
    fn bad_payloads_name_what_is_wrong() {
        let ipc = encode_ipc(&sample());
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (ipc[..10].to_vec(), "shorter than its 16-byte header"),
            (
                {
                    let mut b = ipc.to_vec();
                    b[0] = b'X';
                    b
                },
                "not a GPU payload",
            ),
            (
                {
                    let mut b = ipc.to_vec();
                    b[4] = 3;
                    b
                },
                "version 3",
            ),
            (
                {
                    let mut b = ipc.to_vec();
                    b[5] = 9;
                    b
                },
                "kind 9",
            ),
            (ipc[..127].to_vec(), "expected 128"),
            (
                {
                    let mut b = ipc.to_vec();
                    b[53] = 1;
                    b
                },
                "reserved bytes 52-55",
            ),
            (staged_prefix(10).to_vec(), "should be 64 + 10"),
            (
                {
                    let mut b = staged_prefix(0).to_vec();
                    b[40] = 1;
                    b
                },
                "reserved bytes 16-63",
            ),
        ];
        for (bytes, want) in cases {
            let err = decode(&bytes).expect_err(want);
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }

    #[test]
    fn ipc_from_another_node_is_refused() {
        let d = sample();
        assert_eq!(check_same_node(&d, &[7; 16]), Ok(()));
        let err = check_same_node(&d, &[8; 16]).expect_err("other node");
        assert!(err.contains("another node") && err.contains("4242"), "{err}");
    }

    #[test]
    fn boot_ids_parse() {
        assert_eq!(
            parse_boot_id("0c2e7f3a-1b2c-4d5e-8f90-a1b2c3d4e5f6\n"),
            Ok([0x0c, 0x2e, 0x7f, 0x3a, 0x1b, 0x2c, 0x4d, 0x5e, 0x8f, 0x90, 0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6])
        );
        assert!(parse_boot_id("not-a-uuid").is_err());
        assert!(parse_boot_id("0c2e7f3a-1b2c-4d5e-8f90-a1b2c3d4e5fg").is_err());
    }
}
