//! A set of logical CPUs in the kernel's list format (`0-19,40-59`), as sysfs, cgroups and
//! `nvidia-smi topo -m` write it.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::TopologyError;

/// Largest CPU number accepted (guards against `0-4294967295` eating memory).
pub const MAX_CPU: u32 = 1 << 16;

/// A set of logical CPU numbers. Serialised in list format.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<u32>);

impl CpuSet {
    /// The empty set.
    pub fn new() -> CpuSet {
        CpuSet::default()
    }

    /// Number of CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    /// CPUs in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// Add a CPU.
    pub fn insert(&mut self, cpu: u32) {
        self.0.insert(cpu);
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<T: IntoIterator<Item = u32>>(iter: T) -> Self {
        CpuSet(iter.into_iter().collect())
    }
}

impl CpuSet {
    /// Parses a list of `what` numbers (`CPU`, `GPU`) in the kernel's list format; errors name
    /// `what`.
    pub fn parse_list(s: &str, what: &'static str) -> Result<CpuSet, TopologyError> {
        let mut set = BTreeSet::new();
        let s = s.trim();
        if s.is_empty() {
            return Ok(CpuSet(set));
        }
        let bad = |why: String| TopologyError::IdList { what, list: s.to_string(), why };
        for part in s.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part, part),
            };
            let lo: u32 = lo.parse().map_err(|_| bad(format!("'{part}' is not a {what} number or range")))?;
            let hi: u32 = hi.parse().map_err(|_| bad(format!("'{part}' is not a {what} number or range")))?;
            if lo > hi {
                return Err(bad(format!("range '{part}' runs backwards")));
            }
            if hi > MAX_CPU {
                return Err(bad(format!("{what} {hi} is above the supported maximum {MAX_CPU}")));
            }
            set.extend(lo..=hi);
        }
        Ok(CpuSet(set))
    }
}

impl FromStr for CpuSet {
    type Err = TopologyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuSet::parse_list(s, "CPU")
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end { write!(f, "{start}")? } else { write!(f, "{start}-{end}")? }
        }
        Ok(())
    }
}

impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_list_format_and_prints_it_back() {
        let set: CpuSet = "0-19,40-59".parse().unwrap();
        assert_eq!(set.len(), 40);
        assert!(set.contains(19) && set.contains(40) && !set.contains(20));
        assert_eq!(set.to_string(), "0-19,40-59");
        let single: CpuSet = "3,5,6,7".parse().unwrap();
        assert_eq!(single.to_string(), "3,5-7");
    }

    #[test]
    fn rejects_garbage_with_the_offending_part() {
        let err = "0-3,x".parse::<CpuSet>().unwrap_err().to_string();
        assert!(err.contains("'x'"), "{err}");
        assert!("7-3".parse::<CpuSet>().unwrap_err().to_string().contains("backwards"));
        assert!("0-4294967295".parse::<CpuSet>().is_err());
    }

    #[test]
    fn errors_name_what_the_numbers_are() {
        let err = CpuSet::parse_list("0,x", "GPU").unwrap_err().to_string();
        assert_eq!(err, "bad GPU list '0,x': 'x' is not a GPU number or range");
        assert!(!err.contains("CPU"), "{err}");
    }
}
