//! What is wrong with a Pipeline, each problem naming where.

use std::fmt;

/// One problem in a Pipeline: where (a field path as `kubectl explain` writes it, e.g.
/// `spec.edges[1].numaNetwork.connectionType`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct Problem {
    /// The field, from the object's root.
    pub path: String,
    /// What is wrong and, where it helps, what to do.
    pub message: String,
}

impl Problem {
    /// A problem at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem { path: path.into(), message: message.into() }
    }
}

/// Every problem found in one Pipeline (never empty when returned as an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    /// The problems.
    pub fn problems(&self) -> &[Problem] {
        &self.0
    }

    /// The problem at `path`, if any.
    pub fn at(&self, path: &str) -> Option<&Problem> {
        self.0.iter().find(|p| p.path == path)
    }

    /// Each problem as `path: message`.
    pub fn messages(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// Collects problems, dropping exact repeats so each problem is reported once.
#[derive(Debug, Default)]
pub(crate) struct Collector(pub(crate) Vec<Problem>);

impl Collector {
    pub(crate) fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        let p = Problem::new(path, message);
        if !self.0.contains(&p) {
            self.0.push(p);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
