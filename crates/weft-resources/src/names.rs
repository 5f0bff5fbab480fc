//! Kubernetes object names as the API server validates them (apimachinery `validation.go`).

/// A DNS-1123 label (`IsDNS1123Label`): 1–63 lowercase letters, digits and `-`, starting and
/// ending with a letter or digit. Namespaces, Service names, container names.
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_label_shape(s)
}

/// A DNS-1123 subdomain (`IsDNS1123Subdomain`): at most 253 characters, parts of a label's shape
/// (of any length) joined by `.`. Pod, Node and ResourceClaim names.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label_shape)
}

/// Lowercase letters, digits and `-`, at least one, starting and ending with a letter or digit.
fn is_label_shape(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    b.first().is_some_and(alnum) && b.last().is_some_and(alnum) && b.iter().all(|c| alnum(c) || *c == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_is_dns1123_label() {
        for ok in ["a", "ml", "a-b", "0", "x".repeat(63).as_str()] {
            assert!(is_dns1123_label(ok), "{ok:?}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", "x".repeat(64).as_str(), "gp3?dryRun=All"] {
            assert!(!is_dns1123_label(bad), "{bad:?}");
        }
    }

    #[test]
    fn subdomains_follow_is_dns1123_subdomain() {
        let long_part = "x".repeat(100);
        for ok in ["a", "a.b", "gpu-0.ml", long_part.as_str(), "x".repeat(253).as_str()] {
            assert!(is_dns1123_subdomain(ok), "{ok:?}");
        }
        for bad in ["", ".a", "a.", "a..b", "../../nodes/n1", "A.b", "x".repeat(254).as_str()] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
    }
}
