//! `NetworkAddress` (`weft.io/v1alpha1`, cluster-scoped): one address handed out of a network's
//! range, the cluster-wide IPAM state of weft's NIC DRA driver (`nic.weft.io`) and of anything
//! else that hands out a NumaNetwork's addresses.
//!
//! One object per allocated address, named [`object_name`] (`<network>.<address>`, dots and
//! colons of the address written as `-`), so the API server's name uniqueness is the lock: two
//! nodes that pick the same free address race on one `create`, one gets `AlreadyExists` and moves
//! on to the next free address. Nothing is handed out twice, with no coordinator and no lease.
//!
//! Each object names the claim (namespace, name, UID, request) and the node it was handed to, and
//! is labelled [`NETWORK_LABEL`] and [`CLAIM_UID_LABEL`]. [`allocate`] first looks for the claim's
//! own object, so it is idempotent per claim: a driver that crashed after allocating and before
//! recording the address finds it again on the retry (nothing leaked, nothing handed out twice).
//! [`allocate_known`] does the same from a watch cache instead of a LIST of the network.
//! [`release`] deletes a claim's objects. Objects whose claim is gone are the NumaNetwork
//! controller's to collect.
//!
//! Which address: the lowest free usable one ([`next_free`]). The network address is not usable,
//! nor the IPv4 broadcast address; `/31` and `/32` (RFC 3021), and IPv6 `/127` and `/128`
//! (RFC 6164), have every address usable. [`usable_addresses`] counts them.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, CustomResource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cidr::Cidr;

/// API group.
pub const GROUP: &str = "weft.io";
/// API version.
pub const VERSION: &str = "v1alpha1";
/// Kind.
pub const KIND: &str = "NetworkAddress";
/// The CRD's name, `<plural>.<group>`.
pub const CRD_NAME: &str = "networkaddresses.weft.io";
/// Label holding the network's name on every NetworkAddress.
pub const NETWORK_LABEL: &str = "weft.io/network";
/// Label holding the UID of the claim an address was handed to.
pub const CLAIM_UID_LABEL: &str = "weft.io/claim-uid";
/// Longest network name: it is a label value.
pub const MAX_NETWORK_NAME_LEN: usize = 63;

/// One address of a network, handed to one claim on one node.
// The printer columns repeat `type_ = "string"`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "weft.io",
    version = "v1alpha1",
    kind = "NetworkAddress",
    plural = "networkaddresses",
    singular = "networkaddress",
    shortname = "naddr",
    category = "weft",
    derive = "PartialEq",
    label("app.kubernetes.io/part-of", "weft"),
    doc = "NetworkAddress records one address of a network handed to one claim: the cluster-wide IPAM \
           state of weft's NIC DRA driver. Its name is <network>.<address with '.' and ':' as '-'>, so \
           an address can only be handed out once. Cluster-scoped; written by the driver, collected by \
           the NumaNetwork controller when its claim is gone.",
    printcolumn(name = "Network", type_ = "string", json_path = ".spec.network"),
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.address"),
    printcolumn(
        name = "Namespace",
        type_ = "string",
        json_path = ".spec.claim.namespace",
        description = "The claim's namespace"
    ),
    printcolumn(name = "Claim", type_ = "string", json_path = ".spec.claim.name"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkAddressSpec {
    /// The network (a NumaNetwork's name) the address belongs to.
    pub network: String,
    /// The address, without a prefix length (`192.168.10.5`, `fd00:10::5`).
    pub address: String,
    /// The claim the address was handed to.
    pub claim: AddressClaim,
    /// The node the claim was prepared on.
    pub node: String,
}

/// The ResourceClaim (and request in it) an address belongs to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressClaim {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's UID.
    pub uid: String,
    /// The request in the claim the address serves (a claim may ask for several NICs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
}

/// Why an address could not be handed out or given back.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    /// Every usable address of the range is held.
    #[error("network {network}: no free address in {range} (all {usable} usable addresses are held)")]
    Exhausted {
        /// The network.
        network: String,
        /// Its range.
        range: String,
        /// How many addresses the range has.
        usable: u128,
    },
    /// The network's name cannot label or name the objects.
    #[error("network {network}: {why}")]
    Name {
        /// The network.
        network: String,
        /// What is wrong.
        why: String,
    },
    /// An API request failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

/// The first and last usable address of a range as integers of its family, and the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    v6: bool,
    first: u128,
    last: u128,
}

fn to_int(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_int(v6: bool, n: u128) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(n))
    } else {
        // A span of an IPv4 range holds only 32-bit values.
        IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX)))
    }
}

fn span(range: &Cidr) -> Span {
    let net = range.masked();
    let (v6, bits) = match net.addr {
        IpAddr::V4(_) => (false, 32u32),
        IpAddr::V6(_) => (true, 128u32),
    };
    let host_bits = bits - u32::from(net.prefix_len.min(bits as u8));
    let base = to_int(net.addr);
    // The last address of the range: all host bits set.
    let last = base | 1u128.checked_shl(host_bits).map_or(u128::MAX, |size| size - 1);
    // Point-to-point and host ranges (/31, /32; /127, /128) use every address.
    let small = host_bits <= 1;
    let first = if small { base } else { base + 1 };
    let last = if small || v6 { last } else { last - 1 };
    Span { v6, first, last }
}

/// How many addresses of `range` can be handed out: all but the network address and the IPv4
/// broadcast address; every address of a `/31` or `/32` (IPv6 `/127` or `/128`). An IPv6 `/0`
/// counts `u128::MAX`.
pub fn usable_addresses(range: &Cidr) -> u128 {
    let s = span(range);
    // first ≤ last for every prefix; `last - first + 1` only overflows for IPv6 /0's full span,
    // which starts at 1.
    (s.last - s.first).saturating_add(1)
}

/// Whether `address` is a usable address of `range`.
pub fn is_usable(range: &Cidr, address: IpAddr) -> bool {
    let s = span(range);
    address.is_ipv6() == s.v6 && (s.first..=s.last).contains(&to_int(address))
}

/// The lowest usable address of `range` that is not in `taken` (addresses outside the range are
/// ignored); `None` when every usable address is taken.
pub fn next_free(range: &Cidr, taken: &BTreeSet<IpAddr>) -> Option<IpAddr> {
    let s = span(range);
    let mut candidate = s.first;
    for t in taken.range(from_int(s.v6, s.first)..=from_int(s.v6, s.last)) {
        let t = to_int(*t);
        if t > candidate {
            break;
        }
        if t == candidate {
            if candidate == s.last {
                return None;
            }
            candidate += 1;
        }
    }
    Some(from_int(s.v6, candidate))
}

/// The address as it appears in object names: IPv4's dots and IPv6's colons written as `-`, IPv6
/// with all eight groups (`fd00-10-0-0-0-0-0-5`), so the name never starts or ends with `-`.
pub fn address_name(address: IpAddr) -> String {
    match address {
        IpAddr::V4(a) => a.octets().iter().map(u8::to_string).collect::<Vec<_>>().join("-"),
        IpAddr::V6(a) => a.segments().iter().map(|s| format!("{s:x}")).collect::<Vec<_>>().join("-"),
    }
}

/// Why `network` cannot name NetworkAddress objects and label them, if it cannot: it must be a
/// DNS subdomain of at most [`MAX_NETWORK_NAME_LEN`] characters (a label value).
pub fn check_network_name(network: &str) -> Result<(), String> {
    if network.is_empty() || network.len() > MAX_NETWORK_NAME_LEN {
        return Err(format!(
            "the name is {} characters; NetworkAddress objects label their network, so it must be 1–{MAX_NETWORK_NAME_LEN}",
            network.len()
        ));
    }
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        matches!((b.first(), b.last()), (Some(f), Some(e)) if alnum(f) && alnum(e))
            && b.iter().all(|c| alnum(c) || *c == b'-')
    };
    if !network.split('.').all(label_ok) {
        return Err(format!("'{network}' is not a DNS subdomain (lower-case letters, digits, '-' and '.')"));
    }
    Ok(())
}

/// The name of the object for `address` of `network`: `<network>.<address_name>`, e.g.
/// `net-a.192-168-10-5`.
pub fn object_name(network: &str, address: IpAddr) -> Result<String, AddressError> {
    check_network_name(network).map_err(|why| AddressError::Name { network: network.to_string(), why })?;
    Ok(format!("{network}.{}", address_name(address)))
}

/// What to allocate: an address of `network` (`range`) for a claim's request on `node`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressRequest {
    /// The network.
    pub network: String,
    /// Its range (host bits are ignored).
    pub range: Cidr,
    /// The claim and request it is for.
    pub claim: AddressClaim,
    /// The node.
    pub node: String,
}

/// An address handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    /// The address.
    pub address: IpAddr,
    /// The NetworkAddress object's name.
    pub name: String,
    /// Whether the claim already held it (a retry), rather than it being handed out now.
    pub reused: bool,
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> AddressError {
    let what = what.into();
    move |source| AddressError::Api { what, source }
}

fn held_by(obj: &NetworkAddress, claim: &AddressClaim) -> bool {
    obj.spec.claim.uid == claim.uid && obj.spec.claim.request == claim.request
}

fn address_of(obj: &NetworkAddress) -> Option<IpAddr> {
    obj.spec.address.parse().ok()
}

/// The NetworkAddress object for `address` of `request`'s network.
pub fn address_object(request: &AddressRequest, address: IpAddr) -> Result<NetworkAddress, AddressError> {
    let name = object_name(&request.network, address)?;
    let mut obj = NetworkAddress::new(
        &name,
        NetworkAddressSpec {
            network: request.network.clone(),
            address: address.to_string(),
            claim: request.claim.clone(),
            node: request.node.clone(),
        },
    );
    obj.metadata.labels = Some(
        [
            (NETWORK_LABEL.to_string(), request.network.clone()),
            (CLAIM_UID_LABEL.to_string(), request.claim.uid.clone()),
            ("app.kubernetes.io/part-of".to_string(), "weft".to_string()),
        ]
        .into(),
    );
    Ok(obj)
}

/// Hands out an address of `request.network` to the claim: the one it already holds, else the
/// lowest free one, claimed by creating its NetworkAddress (an `AlreadyExists` means another
/// writer got there first: the next free address is tried). One LIST of the network's objects,
/// then one CREATE per attempt.
pub async fn allocate(client: &kube::Client, request: &AddressRequest) -> Result<Allocated, AddressError> {
    let network = &request.network;
    check_network_name(network).map_err(|why| AddressError::Name { network: network.clone(), why })?;
    let api: Api<NetworkAddress> = Api::all(client.clone());
    let selector = format!("{NETWORK_LABEL}={network}");
    let held = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(api_error(format!("listing the NetworkAddresses of network {network}")))?;
    match scan(request, held.items.iter()) {
        Ok(own) => Ok(own),
        Err(taken) => claim_free(&api, request, taken).await,
    }
}

/// [`allocate`] from `known`, the NetworkAddress objects a watch cache holds (any networks), so a
/// prepare costs one CREATE instead of a LIST of the whole network. The cache may lag: an address
/// it does not show yet is found taken by the CREATE (and the next one tried; the claim's own,
/// from an earlier attempt, is recognised), and when the cache says the range is full the
/// network is listed before that is believed (an address may have been released since). One case
/// the lag leaves: a claim whose own object the cache does not show yet, retried when a lower
/// address was released meanwhile, gets that one too; both are the claim's, and [`release`] gives
/// back both.
pub async fn allocate_known(
    client: &kube::Client,
    request: &AddressRequest,
    known: &[std::sync::Arc<NetworkAddress>],
) -> Result<Allocated, AddressError> {
    let network = &request.network;
    check_network_name(network).map_err(|why| AddressError::Name { network: network.clone(), why })?;
    let api: Api<NetworkAddress> = Api::all(client.clone());
    let taken = match scan(request, known.iter().map(AsRef::as_ref).filter(|o| o.spec.network == *network)) {
        Ok(own) => return Ok(own),
        Err(taken) => taken,
    };
    match claim_free(&api, request, taken).await {
        Err(AddressError::Exhausted { .. }) => allocate(client, request).await,
        other => other,
    }
}

/// The claim's own address among `known`, else the addresses they hold.
fn scan<'a>(
    request: &AddressRequest,
    known: impl Iterator<Item = &'a NetworkAddress>,
) -> Result<Allocated, BTreeSet<IpAddr>> {
    let mut taken = BTreeSet::new();
    for obj in known {
        let Some(address) = address_of(obj) else { continue };
        if held_by(obj, &request.claim) && is_usable(&request.range, address) {
            let name = obj.metadata.name.clone().unwrap_or_default();
            return Ok(Allocated { address, name, reused: true });
        }
        taken.insert(address);
    }
    Err(taken)
}

/// Creates the object of the lowest address not in `taken`, the next on `AlreadyExists`.
async fn claim_free(
    api: &Api<NetworkAddress>,
    request: &AddressRequest,
    mut taken: BTreeSet<IpAddr>,
) -> Result<Allocated, AddressError> {
    loop {
        let Some(address) = next_free(&request.range, &taken) else {
            return Err(AddressError::Exhausted {
                network: request.network.clone(),
                range: request.range.masked().to_string(),
                usable: usable_addresses(&request.range),
            });
        };
        let obj = address_object(request, address)?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => return Ok(Allocated { address, name, reused: false }),
            Err(kube::Error::Api(s)) if s.is_already_exists() => {
                // Someone else's, unless an earlier attempt of ours got through unseen.
                let existing = api.get_opt(&name).await.map_err(api_error(format!("reading NetworkAddress {name}")))?;
                if existing.as_ref().is_some_and(|e| held_by(e, &request.claim)) {
                    return Ok(Allocated { address, name, reused: true });
                }
                taken.insert(address);
            }
            Err(e) => return Err(api_error(format!("creating NetworkAddress {name}"))(e)),
        }
    }
}

/// Gives back every address the claim `claim_uid` holds (in any network); the names deleted. An
/// address already gone is not an error.
pub async fn release(client: &kube::Client, claim_uid: &str) -> Result<Vec<String>, AddressError> {
    let api: Api<NetworkAddress> = Api::all(client.clone());
    let selector = format!("{CLAIM_UID_LABEL}={claim_uid}");
    let held = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(api_error(format!("listing the NetworkAddresses of claim {claim_uid}")))?;
    let mut deleted = Vec::new();
    for obj in held.items {
        let Some(name) = obj.metadata.name else { continue };
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted.push(name),
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(api_error(format!("deleting NetworkAddress {name}"))(e)),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn usable_counts_follow_rfc_3021_and_6164() {
        for (range, n) in [
            ("10.0.0.0/24", 254),
            ("10.0.0.0/30", 2),
            ("10.0.0.0/31", 2),
            ("10.0.0.7/32", 1),
            ("0.0.0.0/0", (1u128 << 32) - 2),
            ("fd00::/64", (1u128 << 64) - 1),
            ("fd00::/126", 3),
            ("fd00::/127", 2),
            ("fd00::1/128", 1),
            ("::/0", u128::MAX),
        ] {
            assert_eq!(usable_addresses(&cidr(range)), n, "{range}");
        }
    }

    #[test]
    fn the_lowest_free_address_comes_first_and_the_edges_are_skipped() {
        let r = cidr("10.0.0.0/30");
        let mut taken = BTreeSet::new();
        assert_eq!(next_free(&r, &taken), Some(ip("10.0.0.1")));
        taken.insert(ip("10.0.0.1"));
        assert_eq!(next_free(&r, &taken), Some(ip("10.0.0.2")));
        taken.insert(ip("10.0.0.2"));
        assert_eq!(next_free(&r, &taken), None, "10.0.0.3 is the broadcast address");
        taken.remove(&ip("10.0.0.1"));
        assert_eq!(next_free(&r, &taken), Some(ip("10.0.0.1")), "a released address is handed out again");
        assert_eq!(next_free(&cidr("10.0.0.4/31"), &BTreeSet::new()), Some(ip("10.0.0.4")));
        assert_eq!(next_free(&cidr("10.0.0.9/32"), &BTreeSet::new()), Some(ip("10.0.0.9")));
        assert_eq!(next_free(&cidr("fd00::/64"), &BTreeSet::new()), Some(ip("fd00::1")));
        let full128: BTreeSet<IpAddr> = [ip("fd00::1")].into();
        assert_eq!(next_free(&cidr("fd00::1/128"), &full128), None);
        // Host bits in the range are ignored; addresses of another family or range do not count.
        let other: BTreeSet<IpAddr> = [ip("10.0.1.1"), ip("fd00::1"), ip("10.0.0.0")].into();
        assert_eq!(next_free(&cidr("10.0.0.77/24"), &other), Some(ip("10.0.0.1")));
        assert!(is_usable(&cidr("10.0.0.0/24"), ip("10.0.0.254")));
        assert!(!is_usable(&cidr("10.0.0.0/24"), ip("10.0.0.255")));
        assert!(!is_usable(&cidr("10.0.0.0/24"), ip("fd00::1")));
    }

    #[test]
    fn object_names_are_dns_subdomains() {
        assert_eq!(object_name("net-a", ip("192.168.10.5")).unwrap(), "net-a.192-168-10-5");
        assert_eq!(object_name("net-a", ip("fd00:10::5")).unwrap(), "net-a.fd00-10-0-0-0-0-0-5");
        assert_eq!(object_name("n", ip("::1")).unwrap(), "n.0-0-0-0-0-0-0-1");
        let long = "a".repeat(64);
        let e = object_name(&long, ip("10.0.0.1")).unwrap_err().to_string();
        assert!(e.contains("64 characters") && e.contains("1–63"), "{e}");
        let e = object_name("Net_A", ip("10.0.0.1")).unwrap_err().to_string();
        assert!(e.contains("'Net_A' is not a DNS subdomain"), "{e}");
    }

    fn v4_range() -> impl Strategy<Value = Cidr> {
        (any::<u32>(), 22u8..=32).prop_map(|(a, p)| Cidr { addr: IpAddr::V4(Ipv4Addr::from(a)), prefix_len: p })
    }

    fn is_dns_subdomain(s: &str) -> bool {
        s.len() <= 253
            && s.split('.').all(|l| {
                let b = l.as_bytes();
                !b.is_empty()
                    && b.len() <= 63
                    && b[0].is_ascii_alphanumeric()
                    && b[b.len() - 1].is_ascii_alphanumeric()
                    && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            })
    }

    proptest! {
        /// Handing out addresses one by one gives every usable address exactly once, lowest
        /// first, then nothing; a brute force over the range agrees with the count.
        #[test]
        fn allocation_walks_the_usable_addresses_in_order(range in v4_range(), taken_bits in proptest::collection::vec(any::<bool>(), 0..64)) {
            let s = span(&range);
            let net = to_int(range.masked().addr);
            let size = 1u128 << (32 - u32::from(range.prefix_len));
            let brute: Vec<u128> = (net..net + size)
                .filter(|a| range.prefix_len >= 31 || (*a != net && *a != net + size - 1))
                .collect();
            prop_assert_eq!(brute.len() as u128, usable_addresses(&range));
            prop_assert_eq!((brute.first().copied(), brute.last().copied()), (Some(s.first), Some(s.last)));
            // Some addresses taken up front (a sparse, random set), then allocate to exhaustion.
            let mut taken: BTreeSet<IpAddr> = brute.iter().zip(taken_bits.iter().cycle())
                .filter(|(_, t)| **t).map(|(a, _)| from_int(false, *a)).collect();
            let initially = taken.clone();
            let mut handed = Vec::new();
            while let Some(a) = next_free(&range, &taken) {
                prop_assert!(is_usable(&range, a));
                prop_assert!(taken.insert(a), "{} handed out twice", a);
                handed.push(to_int(a));
                prop_assert!(handed.len() <= brute.len());
            }
            let expected: Vec<u128> = brute.iter().copied().filter(|a| !initially.contains(&from_int(false, *a))).collect();
            prop_assert_eq!(handed, expected);
        }

        /// Object names are DNS subdomains and differ for different addresses.
        #[test]
        fn names_are_valid_and_distinct(a in any::<u128>(), b in any::<u128>(), v4 in any::<(u32, u32)>()) {
            for (x, y) in [(IpAddr::V6(Ipv6Addr::from(a)), IpAddr::V6(Ipv6Addr::from(b))),
                           (IpAddr::V4(Ipv4Addr::from(v4.0)), IpAddr::V4(Ipv4Addr::from(v4.1)))] {
                let (nx, ny) = (object_name("net-a", x).unwrap(), object_name("net-a", y).unwrap());
                prop_assert!(is_dns_subdomain(&nx), "{}", nx);
                prop_assert_eq!(x == y, nx == ny);
            }
        }

        /// The count agrees with `weft_net::nic_claim::usable_addresses`, which counts the same
        /// thing over the NicConfig's `ipRange` type.
        #[test]
        fn counts_agree_with_the_nic_config_count(a in any::<u128>(), p in 0u8..=128, v4 in any::<u32>(), p4 in 0u8..=32) {
            for r in [Cidr { addr: IpAddr::V6(Ipv6Addr::from(a)), prefix_len: p }.masked(),
                      Cidr { addr: IpAddr::V4(Ipv4Addr::from(v4)), prefix_len: p4 }.masked()] {
                prop_assert_eq!(usable_addresses(&r), weft_net::nic_claim::usable_addresses(&r.to_string().parse().unwrap()));
            }
        }

        /// IPv6 ranges of any prefix: the count never overflows and the first free address is the
        /// first usable one.
        #[test]
        fn ipv6_ranges_of_any_size(a in any::<u128>(), p in 0u8..=128) {
            let r = Cidr { addr: IpAddr::V6(Ipv6Addr::from(a)), prefix_len: p };
            let n = usable_addresses(&r);
            prop_assert!(n >= 1);
            let first = next_free(&r, &BTreeSet::new()).unwrap();
            prop_assert!(is_usable(&r, first));
            prop_assert_eq!(p >= 127, first == r.masked().addr);
        }
    }
}
