//! Network namespaces and the link, address and route calls weft-cni makes, over rtnetlink.
//!
//! A netlink socket acts on the network namespace it was created in, for its whole life. So
//! [`Netns::links`] creates the socket for a pod's namespace on a short-lived thread that enters the
//! namespace with `setns(2)` and ends right after: the caller's thread never leaves the host
//! namespace, and every call on the returned [`Links`] acts inside the pod.

use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use ipnet::IpNet;
use nix::sched::CloneFlags;
use nix::sys::statfs::{NSFS_MAGIC, fstatfs};
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{LinkAttribute, LinkExtentMask, LinkFlags, LinkMessage};
use rtnetlink::packet_route::route::{RouteAttribute, RouteMetric, RouteScope};
use rtnetlink::{LinkUnspec, RouteMessageBuilder};

use crate::pf::Mac;
use crate::result::Route;

/// A network namespace, held open.
#[derive(Debug)]
pub struct Netns {
    path: PathBuf,
    file: File,
}

/// Why a network namespace could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Nothing at the path.
    #[error("network namespace {0} does not exist")]
    Gone(PathBuf),
    /// Something that is not a network namespace at the path.
    #[error("{0} is not a network namespace")]
    NotNetns(PathBuf),
    /// It could not be read.
    #[error("network namespace {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// A failed link, address or route call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct LinkError {
    /// What was being done.
    pub op: String,
    /// The kernel's errno, when it answered with one.
    pub errno: Option<i32>,
    /// The error text.
    pub message: String,
}

impl LinkError {
    fn new(op: impl Into<String>, e: &rtnetlink::Error) -> LinkError {
        let errno = match e {
            rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
            _ => None,
        };
        let message = match errno {
            Some(n) => io::Error::from_raw_os_error(n).to_string(),
            None => e.to_string(),
        };
        LinkError { op: op.into(), errno, message }
    }

    fn io(op: impl Into<String>, e: &io::Error) -> LinkError {
        LinkError { op: op.into(), errno: e.raw_os_error(), message: e.to_string() }
    }

    /// Whether the kernel said the object does not exist.
    pub fn is_no_device(&self) -> bool {
        self.errno == Some(nix::errno::Errno::ENODEV as i32)
    }
}

impl Netns {
    /// Open the namespace at `path` (`/run/netns/<name>`, `/proc/<pid>/ns/net`).
    pub fn open(path: &Path) -> Result<Netns, NetnsError> {
        let file = File::open(path).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => NetnsError::Gone(path.to_path_buf()),
            _ => NetnsError::Io { path: path.to_path_buf(), source },
        })?;
        let fs = fstatfs(&file).map_err(|e| NetnsError::Io { path: path.to_path_buf(), source: e.into() })?;
        if fs.filesystem_type() != NSFS_MAGIC {
            return Err(NetnsError::NotNetns(path.to_path_buf()));
        }
        Ok(Netns { path: path.to_path_buf(), file })
    }

    /// The namespace of the calling thread.
    pub fn current() -> Result<Netns, NetnsError> {
        Netns::open(Path::new("/proc/thread-self/ns/net"))
    }

    /// Whether a network namespace exists at `path`.
    pub fn alive(path: &Path) -> bool {
        Netns::open(path).is_ok()
    }

    /// The path it was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open descriptor (for `IFLA_NET_NS_FD`).
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Whether `other` is the same namespace (same nsfs inode), whatever the paths.
    pub fn same_as(&self, other: &Netns) -> bool {
        match (self.file.metadata(), other.file.metadata()) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }

    /// A netlink connection acting inside this namespace. Must be called within a tokio runtime
    /// (the connection's task is spawned on it).
    pub fn links(&self) -> Result<Links, LinkError> {
        let op = format!("netlink socket in {}", self.path.display());
        let rt = tokio::runtime::Handle::try_current().map_err(|e| LinkError {
            op: op.clone(),
            errno: None,
            message: e.to_string(),
        })?;
        let fd = self.file.try_clone().map_err(|e| LinkError::io(&op, &e))?;
        let made = std::thread::scope(|s| {
            s.spawn(move || -> io::Result<_> {
                // This thread ends right after the socket exists; nothing else runs in the pod.
                nix::sched::setns(fd.as_raw_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                let _entered = rt.enter();
                let (connection, handle, _) = rtnetlink::new_connection()?;
                Ok((connection, handle))
            })
            .join()
        });
        let (connection, handle) = match made {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(LinkError::io(&op, &e)),
            Err(_) => return Err(LinkError { op, errno: None, message: "the namespace thread panicked".into() }),
        };
        tokio::spawn(connection);
        Ok(Links { handle, netns: self.path.display().to_string() })
    }
}

/// A link as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Name.
    pub name: String,
    /// Hardware address.
    pub mac: Option<Mac>,
    /// MTU.
    pub mtu: u32,
    /// Administratively up.
    pub up: bool,
}

impl Link {
    fn from_message(m: &LinkMessage) -> Link {
        let mut link = Link {
            index: m.header.index,
            name: String::new(),
            mac: None,
            mtu: 0,
            up: m.header.flags.contains(LinkFlags::Up),
        };
        for a in &m.attributes {
            match a {
                LinkAttribute::IfName(n) => link.name = n.clone(),
                LinkAttribute::Address(b) => link.mac = Some(Mac(b.clone())),
                LinkAttribute::Mtu(v) => link.mtu = *v,
                _ => {}
            }
        }
        link
    }
}

/// Netlink calls in one network namespace.
#[derive(Clone, Debug)]
pub struct Links {
    handle: rtnetlink::Handle,
    netns: String,
}

impl Links {
    /// A connection in the calling thread's namespace (the host, for the plugin). Must be called
    /// within a tokio runtime.
    pub fn here() -> Result<Links, LinkError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(|e| LinkError::io("netlink socket", &e))?;
        tokio::spawn(connection);
        Ok(Links { handle, netns: "the host network namespace".into() })
    }

    /// Where these calls act (for messages).
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The raw handle (for the PF's VF settings).
    pub fn handle(&self) -> &rtnetlink::Handle {
        &self.handle
    }

    /// The link named `name`, if there is one.
    pub async fn get(&self, name: &str) -> Result<Option<Link>, LinkError> {
        Ok(self.get_message(name, false).await?.map(|m| Link::from_message(&m)))
    }

    /// The link message of `name`, with its VF list when `vfs` (`RTEXT_FILTER_VF`).
    pub async fn get_message(&self, name: &str, vfs: bool) -> Result<Option<LinkMessage>, LinkError> {
        let mut req = self.handle.link().get().match_name(name);
        if vfs {
            req.message_mut().attributes.push(LinkAttribute::ExtMask(vec![LinkExtentMask::Vf]));
        }
        match req.execute().try_next().await {
            Ok(m) => Ok(m),
            Err(e) => {
                let e = LinkError::new(format!("looking up link {name} in {}", self.netns), &e);
                if e.is_no_device() { Ok(None) } else { Err(e) }
            }
        }
    }

    /// Every link's name.
    pub async fn names(&self) -> Result<Vec<String>, LinkError> {
        let links: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| LinkError::new(format!("listing links in {}", self.netns), &e))?;
        Ok(links.iter().map(|m| Link::from_message(m).name).collect())
    }

    /// Send a prepared RTM_SETLINK.
    pub async fn set_message(&self, op: impl Into<String>, message: LinkMessage) -> Result<(), LinkError> {
        self.handle.link().set(message).execute().await.map_err(|e| LinkError::new(op, &e))
    }

    /// Bring link `index` (named `name` in messages) up or down.
    pub async fn set_up(&self, index: u32, name: &str, up: bool) -> Result<(), LinkError> {
        let b = LinkUnspec::new_with_index(index);
        let m = if up { b.up() } else { b.down() }.build();
        self.set_message(format!("setting {name} {} in {}", if up { "up" } else { "down" }, self.netns), m).await
    }

    /// Rename link `index` from `from` to `to` (the link must be down).
    pub async fn rename(&self, index: u32, from: &str, to: &str) -> Result<(), LinkError> {
        let m = LinkUnspec::new_with_index(index).name(to.to_string()).build();
        self.set_message(format!("renaming {from} to {to} in {}", self.netns), m).await
    }

    /// Set the MTU of link `index`.
    pub async fn set_mtu(&self, index: u32, name: &str, mtu: u32) -> Result<(), LinkError> {
        let m = LinkUnspec::new_with_index(index).mtu(mtu).build();
        self.set_message(format!("setting MTU {mtu} on {name} in {}", self.netns), m).await
    }

    /// Set the hardware address of link `index`.
    pub async fn set_mac(&self, index: u32, name: &str, mac: &Mac) -> Result<(), LinkError> {
        let m = LinkUnspec::new_with_index(index).address(mac.0.clone()).build();
        self.set_message(format!("setting MAC {mac} on {name} in {}", self.netns), m).await
    }

    /// Move link `index` into `target`. Without a new name the link keeps its name, and the kernel
    /// refuses the move if that name is taken there.
    pub async fn move_to(&self, index: u32, name: &str, target: &Netns) -> Result<(), LinkError> {
        let m = LinkUnspec::new_with_index(index).setns_by_fd(target.fd()).build();
        self.set_message(format!("moving {name} from {} to {}", self.netns, target.path().display()), m).await
    }

    /// Add `address` (with its prefix) to link `index`.
    pub async fn add_address(&self, index: u32, name: &str, address: IpNet) -> Result<(), LinkError> {
        self.handle
            .address()
            .add(index, address.addr(), address.prefix_len())
            .execute()
            .await
            .map_err(|e| LinkError::new(format!("adding address {address} to {name} in {}", self.netns), &e))
    }

    /// The addresses on link `index`.
    pub async fn addresses(&self, index: u32) -> Result<Vec<IpNet>, LinkError> {
        let messages: Vec<_> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(|e| LinkError::new(format!("listing addresses in {}", self.netns), &e))?;
        let mut out = Vec::new();
        for m in messages {
            if m.header.index != index {
                continue;
            }
            let addr = m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            if let Some(ip) = addr
                && let Ok(net) = IpNet::new(ip, m.header.prefix_len)
            {
                out.push(net);
            }
        }
        Ok(out)
    }

    /// Add `route` through link `index`; a route without `gw` goes through `default_gw` when the
    /// families match (as the reference plugins apply IPAM routes).
    pub async fn add_route(
        &self,
        index: u32,
        name: &str,
        route: &Route,
        default_gw: &[IpAddr],
    ) -> Result<(), LinkError> {
        let op = format!("adding route {} to {name} in {}", route.dst, self.netns);
        let bad = |m: String| LinkError { op: op.clone(), errno: None, message: m };
        let dst: IpNet = route.dst.parse().map_err(|_| bad(format!("'{}' is not a CIDR", route.dst)))?;
        let gw: Option<IpAddr> = match &route.gw {
            Some(g) => Some(g.parse().map_err(|_| bad(format!("'{g}' is not an IP address")))?),
            None => default_gw.iter().copied().find(|g| g.is_ipv4() == dst.addr().is_ipv4()),
        };
        let mut b = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.network(), dst.prefix_len())
            .map_err(|e| bad(e.to_string()))?
            .output_interface(index);
        if let Some(g) = gw {
            b = b.gateway(g).map_err(|e| bad(e.to_string()))?;
        }
        if let Some(p) = route.priority {
            b = b.priority(p);
        }
        if let Some(t) = route.table {
            b = b.table_id(t);
        }
        if let Some(s) = route.scope {
            b = b.scope(RouteScope::from(s));
        } else if gw.is_none() {
            b = b.scope(RouteScope::Link);
        }
        let mut message = b.build();
        let metrics: Vec<RouteMetric> =
            route.mtu.map(RouteMetric::Mtu).into_iter().chain(route.advmss.map(RouteMetric::Advmss)).collect();
        if !metrics.is_empty() {
            message.attributes.push(RouteAttribute::Metrics(metrics));
        }
        self.handle.route().add(message).execute().await.map_err(|e| LinkError::new(op, &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_file_is_not_a_network_namespace_and_a_missing_one_is_gone() {
        let dir = std::env::temp_dir();
        let file = dir.join(format!("weft-cni-not-netns-{}", std::process::id()));
        std::fs::write(&file, "x").expect("temp file");
        assert!(matches!(Netns::open(&file), Err(NetnsError::NotNetns(_))));
        let _ = std::fs::remove_file(&file);
        assert!(matches!(Netns::open(&dir.join("weft-cni-no-such-netns")), Err(NetnsError::Gone(_))));
        // The thread's own namespace opens (any user can read their own).
        let a = Netns::current().expect("own netns");
        let b = Netns::open(Path::new("/proc/self/ns/net")).expect("own netns");
        assert!(a.same_as(&b));
    }
}
