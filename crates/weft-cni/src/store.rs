//! weft's own IPAM (`"ipam": {"type": "weft"}`): addresses from the physnet's subnet in the
//! physnet configuration file, kept the way host-local keeps them (reference §5) so operators can
//! read both alike. The store of a physnet is `<cacheDir>/ipam/<physnet>/`:
//!
//! - one file per address, named after it, holding `<containerID>\r\n<ifname>`;
//! - `last_reserved_ip.0`, the last address handed out: the next search starts after it, so
//!   addresses go round the range before one is reused;
//! - `lock`, `flock`ed while the directory is read or changed.
//!
//! The range is `rangeStart`–`rangeEnd` of the physnet (defaults: the subnet's first and last
//! host); the gateway, the network address and the IPv4 broadcast address are never handed out.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use weft_net::config::Subnet;

use crate::error::{CniError, code};

const LAST_RESERVED: &str = "last_reserved_ip.0";
const LINE_BREAK: &str = "\r\n";

/// One physnet's address store.
#[derive(Clone, Debug)]
pub struct RangeStore {
    dir: PathBuf,
}

struct Locked {
    _file: File,
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v) => u128::from(u32::from(v)),
        IpAddr::V6(v) => u128::from(v),
    }
}

fn from_u128(n: u128, v4: bool) -> IpAddr {
    if v4 { IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX))) } else { IpAddr::V6(Ipv6Addr::from(n)) }
}

fn io_err(path: &Path, e: &io::Error) -> CniError {
    CniError::io(format!("weft IPAM store {}", path.display()), e)
}

impl RangeStore {
    /// The store of `physnet` under `cache_dir`.
    pub fn new(cache_dir: &Path, physnet: &str) -> RangeStore {
        RangeStore { dir: cache_dir.join("ipam").join(physnet) }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock(&self) -> Result<Locked, CniError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| io_err(&self.dir, &e))?;
        let path = self.dir.join("lock");
        let file =
            OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(|e| io_err(&path, &e))?;
        file.lock().map_err(|e| io_err(&path, &e))?;
        Ok(Locked { _file: file })
    }

    /// Every reservation: address and the `containerID\r\nifname` it holds.
    fn reservations(&self) -> Vec<(IpAddr, String)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let ip: IpAddr = e.file_name().to_str()?.parse().ok()?;
                let owner = std::fs::read_to_string(e.path()).ok()?;
                Some((ip, owner.trim().to_string()))
            })
            .collect()
    }

    fn candidates(subnet: &Subnet) -> (u128, u128, Vec<u128>) {
        let (start, end) = (to_u128(subnet.range_start), to_u128(subnet.range_end));
        let mut never: Vec<u128> = vec![to_u128(subnet.cidr.network())];
        if let IpNet::V4(n) = subnet.cidr {
            never.push(u128::from(u32::from(n.broadcast())));
        }
        if let Some(g) = subnet.gateway {
            never.push(to_u128(g));
        }
        (start, end, never)
    }

    /// An address for (`container_id`, `ifname`): the one it already holds, else the next free one
    /// after the last handed out. `RANGE_EXHAUSTED` (107) when none is left.
    pub fn allocate(&self, subnet: &Subnet, container_id: &str, ifname: &str) -> Result<IpAddr, CniError> {
        let _lock = self.lock()?;
        let owner = format!("{}{LINE_BREAK}{ifname}", container_id.trim());
        let taken = self.reservations();
        if let Some((ip, _)) = taken.iter().find(|(ip, o)| *o == owner && subnet.cidr.contains(ip)) {
            return Ok(*ip);
        }
        let used: HashSet<u128> = taken.iter().map(|(ip, _)| to_u128(*ip)).collect();
        let (start, end, never) = Self::candidates(subnet);
        let size = end - start + 1;
        let last = std::fs::read_to_string(self.dir.join(LAST_RESERVED))
            .ok()
            .and_then(|t| t.trim().parse::<IpAddr>().ok())
            .map(to_u128)
            .filter(|n| (start..=end).contains(n));
        let first = match last {
            Some(n) if n < end => n + 1,
            _ => start,
        };
        // Among `used.len() + never.len() + 1` consecutive candidates one must be free, unless the
        // range is that small: the search never needs to look further.
        let bound = size.min(used.len() as u128 + never.len() as u128 + 1);
        let v4 = subnet.cidr.addr().is_ipv4();
        for step in 0..bound {
            let n = start + (first - start + step) % size;
            if used.contains(&n) || never.contains(&n) {
                continue;
            }
            let ip = from_u128(n, v4);
            let path = self.dir.join(ip.to_string());
            let mut f = match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(&path, &e)),
            };
            if let Err(e) = f.write_all(owner.as_bytes()) {
                let _ = std::fs::remove_file(&path);
                return Err(io_err(&path, &e));
            }
            let last_path = self.dir.join(LAST_RESERVED);
            std::fs::write(&last_path, ip.to_string()).map_err(|e| io_err(&last_path, &e))?;
            return Ok(ip);
        }
        Err(CniError::new(
            code::RANGE_EXHAUSTED,
            format!(
                "no free address in {}-{} of subnet {} ({} reserved in {})",
                subnet.range_start,
                subnet.range_end,
                subnet.cidr,
                used.len(),
                self.dir.display()
            ),
        ))
    }

    /// The addresses (`container_id`, `ifname`) holds.
    pub fn held_by(&self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>, CniError> {
        let _lock = self.lock()?;
        let owner = format!("{}{LINE_BREAK}{ifname}", container_id.trim());
        let mut ips: Vec<IpAddr> =
            self.reservations().into_iter().filter(|(_, o)| *o == owner).map(|(ip, _)| ip).collect();
        ips.sort();
        Ok(ips)
    }

    /// Release what (`container_id`, `ifname`) holds (nothing held is fine).
    pub fn release(&self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>, CniError> {
        let _lock = self.lock()?;
        let owner = format!("{}{LINE_BREAK}{ifname}", container_id.trim());
        self.remove_where(|o| o == owner)
    }

    /// Release every reservation whose container is not in `valid_containers`.
    pub fn gc(&self, valid_containers: &HashSet<String>) -> Result<Vec<IpAddr>, CniError> {
        let _lock = self.lock()?;
        self.remove_where(|o| !valid_containers.contains(o.split(LINE_BREAK).next().unwrap_or_default()))
    }

    fn remove_where(&self, doomed: impl Fn(&str) -> bool) -> Result<Vec<IpAddr>, CniError> {
        let mut gone = Vec::new();
        for (ip, owner) in self.reservations() {
            if doomed(&owner) {
                let path = self.dir.join(ip.to_string());
                match std::fs::remove_file(&path) {
                    Ok(()) => gone.push(ip),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(&path, &e)),
                }
            }
        }
        gone.sort();
        Ok(gone)
    }

    /// How many addresses are still free.
    pub fn free(&self, subnet: &Subnet) -> Result<u128, CniError> {
        let _lock = self.lock()?;
        let (start, end, never) = Self::candidates(subnet);
        let mut blocked: HashSet<u128> = self.reservations().into_iter().map(|(ip, _)| to_u128(ip)).collect();
        blocked.extend(never);
        let inside = blocked.iter().filter(|n| (start..=end).contains(*n)).count() as u128;
        Ok((end - start + 1).saturating_sub(inside))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn subnet(cidr: &str, start: &str, end: &str, gw: Option<&str>) -> Subnet {
        Subnet {
            cidr: cidr.parse().unwrap(),
            range_start: start.parse().unwrap(),
            range_end: end.parse().unwrap(),
            gateway: gw.map(|g| g.parse().unwrap()),
        }
    }

    #[test]
    fn hands_out_round_robin_skips_the_gateway_and_runs_out() {
        let dir = tempfile::tempdir().unwrap();
        let s = RangeStore::new(dir.path(), "physnet2");
        let net = subnet("10.56.0.0/29", "10.56.0.1", "10.56.0.6", Some("10.56.0.1"));
        let a = s.allocate(&net, "c1", "net1").unwrap();
        assert_eq!(a.to_string(), "10.56.0.2");
        // The same attachment gets the same address back.
        assert_eq!(s.allocate(&net, "c1", "net1").unwrap(), a);
        let b = s.allocate(&net, "c2", "net1").unwrap();
        assert_eq!(b.to_string(), "10.56.0.3");
        assert_eq!(std::fs::read_to_string(s.dir().join("10.56.0.3")).unwrap(), "c2\r\nnet1");
        // Released addresses are reused only after the range went round.
        assert_eq!(s.release("c1", "net1").unwrap(), vec![a]);
        for (i, want) in ["10.56.0.4", "10.56.0.5", "10.56.0.6", "10.56.0.2"].iter().enumerate() {
            assert_eq!(s.allocate(&net, &format!("d{i}"), "net1").unwrap().to_string(), *want);
        }
        assert_eq!(s.free(&net).unwrap(), 0);
        let e = s.allocate(&net, "e", "net1").unwrap_err();
        assert_eq!(e.code, code::RANGE_EXHAUSTED);
        assert!(e.msg.contains("10.56.0.1-10.56.0.6"), "{e}");
        let valid: HashSet<String> = ["c2".to_string()].into();
        assert_eq!(s.gc(&valid).unwrap().len(), 4);
        assert_eq!(s.held_by("c2", "net1").unwrap(), vec![b]);
    }

    #[test]
    fn ipv6_ranges_work_without_walking_them() {
        let dir = tempfile::tempdir().unwrap();
        let s = RangeStore::new(dir.path(), "p6");
        let net = subnet("fd00::/64", "fd00::1", "fd00::ffff:ffff:ffff:ffff", None);
        assert_eq!(s.allocate(&net, "c1", "net1").unwrap().to_string(), "fd00::1");
        assert_eq!(s.allocate(&net, "c2", "net1").unwrap().to_string(), "fd00::2");
    }
}
