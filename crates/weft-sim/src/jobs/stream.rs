//! Job streams: gangs of 2–64 pods of 1–8 GPUs mixed with single pods, each with an arrival, a
//! duration and an optional tier constraint (Volcano's `networkTopology`: hard up to a tier, or
//! soft). Generated deterministically from a seed (ChaCha8), or listed in a `kind: SimJobs` file.
//!
//! ```yaml
//! apiVersion: weft.io/v1alpha1
//! kind: SimJobs
//! generate: {jobs: 2000, seed: 7, load: 0.9}     # the defaults for everything else
//! jobs:                                           # and/or jobs listed one by one
//!   - {name: train-a, members: 16, gpus: 4, arrival: 0, duration: 3600, topology: "hard:sim.weft.io/leaf"}
//!   - {name: one, members: 1, gpus: 8, arrival: 5, duration: 600}
//! ```
//!
//! `topology` is weft's annotation value (`soft`, `hard:<tier number or name>`); none: the job
//! states no constraint.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use weft_gang::TierConstraint;

use crate::SimError;

/// One job: `members` pods of `gpus` GPUs each, placed all together or not at all.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimJob {
    /// Name.
    pub name: String,
    /// Pods (1: a single pod).
    pub members: usize,
    /// GPUs per pod (1-8).
    pub gpus: usize,
    /// Arrival, seconds.
    pub arrival: f64,
    /// Run time once placed, seconds.
    pub duration: f64,
    /// weft's `weft.io/network-topology` value, when the job states a constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
}

impl SimJob {
    /// The job's constraint, read as weft's annotation is read.
    pub fn constraint(&self) -> Result<Option<TierConstraint>, SimError> {
        let Some(v) = &self.topology else { return Ok(None) };
        let a: BTreeMap<String, String> =
            [(weft_gang::constraint::GANG_TOPOLOGY_ANNOTATION.to_string(), v.clone())].into_iter().collect();
        TierConstraint::from_annotations(&a).map_err(|e| SimError::Format {
            source_name: "jobs".into(),
            message: format!("job '{}': topology: {e}", self.name),
        })
    }

    /// GPUs of the whole job.
    pub fn total_gpus(&self) -> usize {
        self.members * self.gpus
    }
}

fn default_jobs() -> usize {
    2000
}
fn default_load() -> f64 {
    0.9
}
fn default_single() -> f64 {
    0.4
}
fn default_duration() -> f64 {
    3600.0
}

/// Generator parameters (every field has a default).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobGenerate {
    /// Jobs.
    #[serde(default = "default_jobs")]
    pub jobs: usize,
    /// RNG seed.
    #[serde(default)]
    pub seed: u64,
    /// Share of the cluster's GPUs the stream offers in expectation (sets the arrival rate).
    #[serde(default = "default_load")]
    pub load: f64,
    /// Share of jobs that are single pods.
    #[serde(default = "default_single")]
    pub single_share: f64,
    /// Mean run time, seconds (exponential).
    #[serde(default = "default_duration")]
    pub mean_duration_seconds: f64,
    /// Gang sizes and their weights.
    #[serde(default = "default_members")]
    pub members: BTreeMap<usize, f64>,
    /// GPUs per pod of a gang and their weights.
    #[serde(default = "default_gang_gpus")]
    pub gang_gpus: BTreeMap<usize, f64>,
    /// GPUs of a single pod and their weights.
    #[serde(default = "default_single_gpus")]
    pub single_gpus: BTreeMap<usize, f64>,
    /// Constraints of gangs (`none`, `soft`, `hard:<tier>`) and their weights.
    #[serde(default = "default_topologies")]
    pub topologies: BTreeMap<String, f64>,
}

fn default_members() -> BTreeMap<usize, f64> {
    [(2, 0.3), (4, 0.25), (8, 0.2), (16, 0.12), (32, 0.08), (64, 0.05)].into_iter().collect()
}
fn default_gang_gpus() -> BTreeMap<usize, f64> {
    [(1, 0.1), (2, 0.15), (4, 0.4), (8, 0.35)].into_iter().collect()
}
fn default_single_gpus() -> BTreeMap<usize, f64> {
    [(1, 0.4), (2, 0.2), (4, 0.2), (8, 0.2)].into_iter().collect()
}
fn default_topologies() -> BTreeMap<String, f64> {
    [
        ("none".to_string(), 0.4),
        ("soft".to_string(), 0.3),
        (format!("hard:{}", super::network::LEAF_LABEL), 0.2),
        (format!("hard:{}", super::network::SPINE_LABEL), 0.1),
    ]
    .into_iter()
    .collect()
}

impl Default for JobGenerate {
    fn default() -> Self {
        JobGenerate {
            jobs: default_jobs(),
            seed: 0,
            load: default_load(),
            single_share: default_single(),
            mean_duration_seconds: default_duration(),
            members: default_members(),
            gang_gpus: default_gang_gpus(),
            single_gpus: default_single_gpus(),
            topologies: default_topologies(),
        }
    }
}

fn pick<K: Clone>(rng: &mut ChaCha8Rng, weights: &BTreeMap<K, f64>) -> K {
    let total: f64 = weights.values().sum();
    let mut u = rng.random::<f64>() * total;
    let mut last = None;
    for (k, w) in weights {
        last = Some(k);
        if u < *w {
            return k.clone();
        }
        u -= w;
    }
    last.expect("weights checked non-empty").clone()
}

fn exp_sample(rng: &mut ChaCha8Rng, mean: f64) -> f64 {
    let u: f64 = rng.random::<f64>();
    -mean * (1.0 - u).ln()
}

impl JobGenerate {
    /// Most jobs a stream may have.
    pub const MAX_JOBS: usize = 1_000_000;

    fn check(&self) -> Result<(), SimError> {
        let bad = |m: String| SimError::Format { source_name: "jobs generate".into(), message: m };
        if self.jobs > Self::MAX_JOBS {
            return Err(SimError::TooLarge { what: "jobs".into(), asked: self.jobs as u128, limit: Self::MAX_JOBS });
        }
        for (what, v, lo, hi) in [
            ("load", self.load, f64::MIN_POSITIVE, f64::MAX),
            ("singleShare", self.single_share, 0.0, 1.0),
            ("meanDurationSeconds", self.mean_duration_seconds, f64::MIN_POSITIVE, f64::MAX),
        ] {
            if !(v.is_finite() && v >= lo && v <= hi) {
                return Err(bad(format!("{what}: {v} is out of range")));
            }
        }
        let weights = |what: &str, w: &mut dyn Iterator<Item = f64>| -> Result<(), SimError> {
            let w: Vec<f64> = w.collect();
            if w.iter().any(|x| !(x.is_finite() && *x >= 0.0)) || w.iter().sum::<f64>() <= 0.0 {
                return Err(bad(format!("{what}: weights must be ≥ 0 with a positive sum")));
            }
            Ok(())
        };
        weights("members", &mut self.members.values().copied())?;
        weights("gangGpus", &mut self.gang_gpus.values().copied())?;
        weights("singleGpus", &mut self.single_gpus.values().copied())?;
        weights("topologies", &mut self.topologies.values().copied())?;
        if let Some(m) = self.members.keys().find(|&&m| !(2..=1024).contains(&m)) {
            return Err(bad(format!("members: a gang has 2 to 1024 pods, not {m}")));
        }
        for (what, map) in [("gangGpus", &self.gang_gpus), ("singleGpus", &self.single_gpus)] {
            if let Some(g) = map.keys().find(|&&g| !(1..=weft_alloc::MAX_GPUS).contains(&g)) {
                return Err(bad(format!("{what}: a pod asks 1 to {} GPUs, not {g}", weft_alloc::MAX_GPUS)));
            }
        }
        for t in self.topologies.keys() {
            if t != "none" {
                SimJob {
                    name: "generate".into(),
                    members: 2,
                    gpus: 1,
                    arrival: 0.0,
                    duration: 0.0,
                    topology: Some(t.clone()),
                }
                .constraint()
                .map_err(|e| bad(format!("topologies: '{t}': {e}")))?;
            }
        }
        Ok(())
    }

    /// The stream for a cluster of `cluster_gpus` GPUs: shapes, durations and constraints drawn
    /// first, then arrivals at the rate that offers `load` of the cluster in expectation.
    pub fn jobs(&self, cluster_gpus: usize) -> Result<Vec<SimJob>, SimError> {
        self.check()?;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let mut jobs = Vec::with_capacity(self.jobs);
        for i in 0..self.jobs {
            let single = rng.random::<f64>() < self.single_share;
            let (members, gpus, topology) = if single {
                (1, pick(&mut rng, &self.single_gpus), None)
            } else {
                let m = pick(&mut rng, &self.members);
                let g = pick(&mut rng, &self.gang_gpus);
                let t = pick(&mut rng, &self.topologies);
                (m, g, (t != "none").then_some(t))
            };
            let duration = exp_sample(&mut rng, self.mean_duration_seconds);
            jobs.push(SimJob { name: format!("job-{i}"), members, gpus, arrival: 0.0, duration, topology });
        }
        let gpu_seconds: f64 = jobs.iter().map(|j| j.total_gpus() as f64 * j.duration).sum();
        let mean = gpu_seconds / jobs.len().max(1) as f64;
        let interarrival = mean / (self.load * cluster_gpus.max(1) as f64);
        let mut t = 0.0;
        for j in &mut jobs {
            t += exp_sample(&mut rng, interarrival);
            j.arrival = t;
        }
        Ok(jobs)
    }
}

/// A `kind: SimJobs` file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobsFile {
    /// `weft.io/v1alpha1`.
    pub api_version: String,
    /// `SimJobs`.
    pub kind: String,
    /// A generated stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate: Option<JobGenerate>,
    /// Jobs listed one by one (merged with the generated ones by arrival).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<SimJob>,
}

impl JobsFile {
    /// Parse a jobs file's text (YAML or JSON); `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<JobsFile, SimError> {
        let f: JobsFile = serde_saphyr::from_str(text)
            .map_err(|e| SimError::Format { source_name: source.to_string(), message: e.to_string() })?;
        if f.kind != "SimJobs" || f.api_version != crate::API_VERSION {
            return Err(SimError::Format {
                source_name: source.to_string(),
                message: format!(
                    "expected apiVersion {} kind SimJobs, found {} {}",
                    crate::API_VERSION,
                    f.api_version,
                    f.kind
                ),
            });
        }
        Ok(f)
    }

    /// The stream: generated and listed jobs, by arrival (ties: listed order, generated first).
    pub fn jobs(&self, cluster_gpus: usize, source: &str) -> Result<Vec<SimJob>, SimError> {
        let mut out = match &self.generate {
            Some(g) => g.jobs(cluster_gpus)?,
            None => Vec::new(),
        };
        for (i, j) in self.jobs.iter().enumerate() {
            let bad = |m: String| SimError::Format {
                source_name: source.to_string(),
                message: format!("jobs[{i}] ('{}'): {m}", j.name),
            };
            if j.members == 0 || j.gpus == 0 || j.gpus > weft_alloc::MAX_GPUS {
                return Err(bad(format!(
                    "members ≥ 1 and gpus 1 to {} (got {} × {})",
                    weft_alloc::MAX_GPUS,
                    j.members,
                    j.gpus
                )));
            }
            if !(j.arrival.is_finite() && j.arrival >= 0.0 && j.duration.is_finite() && j.duration >= 0.0) {
                return Err(bad("arrival and duration must be finite and ≥ 0".into()));
            }
            j.constraint().map_err(|e| bad(e.to_string()))?;
            out.push(j.clone());
        }
        if out.len() > JobGenerate::MAX_JOBS {
            return Err(SimError::TooLarge {
                what: "jobs".into(),
                asked: out.len() as u128,
                limit: JobGenerate::MAX_JOBS,
            });
        }
        out.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
        Ok(out)
    }
}
