//! IP networks in CIDR notation, as Kubernetes' CEL validates them (NumaNetwork `ipRange`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An IP network in CIDR notation, parsed as Kubernetes' CEL `isCIDR()`/`cidr()` parse it (Go's
/// `netip.ParsePrefix`, then no IPv4-mapped IPv6): a dotted-quad IPv4 address without leading
/// zeros or an IPv6 address without a zone, `/`, and a prefix length in decimal without leading
/// zeros or sign, at most 32 or 128.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The address as written (host bits possibly set).
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix_len: u8,
}

/// Why a string is not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// No `/prefix`.
    #[error("it has no /prefix length")]
    NoPrefix,
    /// The part before `/` is not an IPv4 or IPv6 address.
    #[error("'{0}' is not an IPv4 or IPv6 address")]
    Address(String),
    /// The part after `/` is not a prefix length for the address family.
    #[error("'/{prefix}' is not a prefix length for {family} (0–{max}, no leading zeros)")]
    Prefix {
        /// The text after `/`.
        prefix: String,
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// 32 or 128.
        max: u8,
    },
    /// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), which Kubernetes rejects.
    #[error("IPv4-mapped IPv6 addresses are not allowed; write the IPv4 network instead")]
    Ipv4Mapped,
}

impl Cidr {
    /// Parses `addr/prefix`.
    pub fn parse(s: &str) -> Result<Cidr, CidrError> {
        let (addr_text, prefix_text) = s.split_once('/').ok_or(CidrError::NoPrefix)?;
        let addr: IpAddr = addr_text.parse().map_err(|_| CidrError::Address(addr_text.to_string()))?;
        let (family, max) = match addr {
            IpAddr::V4(_) => ("IPv4", 32u8),
            IpAddr::V6(_) => ("IPv6", 128u8),
        };
        let prefix_err = || CidrError::Prefix { prefix: prefix_text.to_string(), family, max };
        let digits_ok = !prefix_text.is_empty()
            && prefix_text.len() <= 3
            && prefix_text.bytes().all(|b| b.is_ascii_digit())
            && (prefix_text == "0" || !prefix_text.starts_with('0'));
        if !digits_ok {
            return Err(prefix_err());
        }
        let prefix_len: u8 = prefix_text.parse().map_err(|_| prefix_err())?;
        if prefix_len > max {
            return Err(prefix_err());
        }
        if let IpAddr::V6(v6) = addr
            && v6.to_ipv4_mapped().is_some()
        {
            return Err(CidrError::Ipv4Mapped);
        }
        Ok(Cidr { addr, prefix_len })
    }

    /// The network: the address with the host bits cleared.
    pub fn masked(&self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix_len)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix_len)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Cidr { addr, prefix_len: self.prefix_len }
    }

    /// Whether the host bits are zero.
    pub fn is_masked(&self) -> bool {
        *self == self.masked()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}
