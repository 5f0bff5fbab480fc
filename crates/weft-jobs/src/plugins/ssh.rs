//! The `ssh` plugin: one RSA key pair per job, shared by all its pods, and an ssh client config
//! naming every pod.
//!
//! Volcano's `pkg/controllers/job/plugins/ssh`:
//! - `OnJobAdd`: Secret `<job>-ssh` with `id_rsa` (PKCS#1 PEM), `id_rsa.pub` and
//!   `authorized_keys` (`ssh-rsa AAAA…\n`, no comment) and `config`. With `--ssh-private-key` the
//!   user's strings are stored as they are (the public key as authorized_keys too).
//! - `OnPodCreate`: the Secret as a volume (items under `.ssh/`, mode 0600, or 0644 when the key
//!   path is not `/root/.ssh`), mounted at the key path with `subPath: .ssh` in every container
//!   and init container.
//!
//! The Volcano flavor reproduces Volcano's leniency (a port outside 1..=65535 becomes 22, a public
//! key without a private key is ignored) with warnings; weft rejects those arguments.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{KeyToPath, Pod, Secret, SecretVolumeSource, Volume, VolumeMount};

use crate::flags::{FlagDef, FlagError};
use crate::job::Job;
use crate::naming;
use crate::plugin::{
    self, BuildInput, Flavor, JobObject, JobPlugin, ObjectContext, PluginError, SshKeyPair, SshKeySource,
};

/// The plugin's name.
pub const NAME: &str = "ssh";

/// The plugin's flags (Volcano's names and defaults).
pub const FLAGS: &[FlagDef] = &[
    FlagDef::string("ssh-key-file-path", DEFAULT_KEY_PATH),
    FlagDef::string("ssh-private-key", ""),
    FlagDef::string("ssh-public-key", ""),
    FlagDef::int("ssh-port", "22"),
];

/// Where the keys are mounted by default (and the only path that gets mode 0600).
pub const DEFAULT_KEY_PATH: &str = "/root/.ssh";
/// Secret key of the private key.
pub const PRIVATE_KEY: &str = "id_rsa";
/// Secret key of the public key.
pub const PUBLIC_KEY: &str = "id_rsa.pub";
/// Secret key of the authorized keys (the public key again).
pub const AUTHORIZED_KEYS: &str = "authorized_keys";
/// Secret key of the ssh client config.
pub const CONFIG: &str = "config";
/// The directory inside the volume, and the mount's `subPath`.
pub const RELATIVE_PATH: &str = ".ssh";
/// The volume's mode when the keys go to [`DEFAULT_KEY_PATH`] (octal 0600).
pub const ROOT_MODE: i32 = 0o600;
/// The volume's mode elsewhere, so a non-root user can read them (octal 0644).
pub const NON_ROOT_MODE: i32 = 0o644;

/// Generates a fresh RSA-2048 key pair each time it is asked, in the formats Volcano writes:
/// PKCS#1 PEM private key, `ssh-rsa AAAA…\n` public key without comment.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomKeys;

impl SshKeySource for RandomKeys {
    fn key_pair(&self) -> Result<SshKeyPair, String> {
        use rsa::pkcs1::{EncodeRsaPrivateKey, LineEnding};

        let private = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048)
            .map_err(|e| format!("generating an RSA-2048 key: {e}"))?;
        let pem = private.to_pkcs1_pem(LineEnding::LF).map_err(|e| format!("encoding the RSA private key: {e}"))?;
        let public = ssh_key::public::RsaPublicKey::try_from(&private.to_public_key())
            .map_err(|e| format!("encoding the RSA public key: {e}"))?;
        let line = ssh_key::PublicKey::from(ssh_key::public::KeyData::Rsa(public))
            .to_openssh()
            .map_err(|e| format!("encoding the RSA public key: {e}"))?;
        Ok(SshKeyPair { private_key: pem.as_str().to_owned(), public_key: format!("{line}\n") })
    }
}

/// The key pair stored in an existing `<job>-ssh` Secret (keys `id_rsa` and `id_rsa.pub`, from
/// `data` or else `stringData`), so the controller keeps a job's keys when it rewrites the Secret.
/// `None` when either is missing, empty or not UTF-8.
pub fn keys_from_secret(secret: &Secret) -> Option<SshKeyPair> {
    let get = |key: &str| -> Option<String> {
        let from_data = secret.data.as_ref().and_then(|d| d.get(key)).and_then(|b| String::from_utf8(b.0.clone()).ok());
        from_data.or_else(|| secret.string_data.as_ref().and_then(|d| d.get(key)).cloned()).filter(|s| !s.is_empty())
    };
    Some(SshKeyPair { private_key: get(PRIVATE_KEY)?, public_key: get(PUBLIC_KEY)? })
}

/// `<job>-ssh`.
pub fn secret_name(job: &str) -> String {
    format!("{job}-{NAME}")
}

/// The `config` key: Volcano's `generateSSHConfig`. A `Host` block for every replica of every
/// task (one block for a task whose template fixes the hostname).
pub fn ssh_config(job: &Job, port: i64) -> String {
    let job_name = job.job_name();
    let mut config = String::from("StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n");
    for task in &job.spec.tasks {
        let fixed = naming::template_sets_hostname(task);
        let n = if fixed { naming::replicas(task).min(1) } else { naming::replicas(task) };
        for i in 0..n {
            let host = match task.template.spec.as_ref().and_then(|s| s.hostname.as_deref()) {
                Some(h) if fixed => h.to_owned(),
                _ => naming::pod_name(job_name, &task.name, i),
            };
            let domain = naming::domain_name(job_name, task, i);
            config.push_str(&format!("Host {host}\n  HostName {domain}\n  Port {port}\n"));
        }
    }
    config
}

/// Builds the plugin for one job.
pub fn build(input: BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError> {
    let (flags, mut warnings) = super::common::parse_args(NAME, FLAGS, &[], &input)?;
    let strict = input.flavor == Flavor::Weft;
    let args_error = |source| PluginError::Args { plugin: NAME, source };

    let mut port = flags.int("ssh-port");
    if !(1..=65535).contains(&port) {
        if strict {
            return Err(args_error(FlagError::BadValue {
                flag: "ssh-port".into(),
                value: port.to_string(),
                expected: "a port from 1 to 65535",
            }));
        }
        warnings.push(format!("plugin {NAME}: invalid ssh port {port}; Volcano falls back to port 22"));
        port = 22;
    }

    let key_path = flags.string("ssh-key-file-path").to_owned();
    if !key_path.starts_with('/') {
        if strict {
            return Err(args_error(FlagError::BadValue {
                flag: "ssh-key-file-path".into(),
                value: key_path,
                expected: "an absolute path (it is a mountPath)",
            }));
        }
        warnings.push(format!(
            "plugin {NAME}: -ssh-key-file-path {key_path:?} is not an absolute path; the API server rejects every pod \
             Volcano creates with it as a mountPath"
        ));
    }

    let (private, public) = (flags.string("ssh-private-key"), flags.string("ssh-public-key"));
    let user_keys = match (private.is_empty(), public.is_empty()) {
        (true, true) => None,
        (false, false) => Some(SshKeyPair { private_key: private.to_owned(), public_key: public.to_owned() }),
        (false, true) => {
            if strict {
                return Err(PluginError::Invalid {
                    plugin: NAME,
                    message: "flag -ssh-private-key is given without -ssh-public-key: give both (the public key \
                              becomes id_rsa.pub and authorized_keys) or neither (weft generates a key pair)"
                        .to_owned(),
                });
            }
            warnings.push(format!(
                "plugin {NAME}: -ssh-private-key is given without -ssh-public-key; Volcano stores an empty id_rsa.pub and \
                 authorized_keys, so no pod accepts the key"
            ));
            Some(SshKeyPair { private_key: private.to_owned(), public_key: String::new() })
        }
        (true, false) => {
            if strict {
                return Err(PluginError::Invalid {
                    plugin: NAME,
                    message: "flag -ssh-public-key is given without -ssh-private-key: give both or neither (weft \
                              generates a key pair)"
                        .to_owned(),
                });
            }
            warnings.push(format!(
                "plugin {NAME}: -ssh-public-key is given without -ssh-private-key; Volcano ignores it and generates a key pair"
            ));
            None
        }
    };

    let job = input.job;
    let name = secret_name(job.job_name());
    let mode = if key_path == DEFAULT_KEY_PATH { ROOT_MODE } else { NON_ROOT_MODE };
    let items = [PRIVATE_KEY, PUBLIC_KEY, AUTHORIZED_KEYS, CONFIG]
        .iter()
        .map(|k| KeyToPath { key: (*k).to_owned(), path: format!("{RELATIVE_PATH}/{k}"), mode: None })
        .collect();
    let volume = Volume {
        name: name.clone(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(name.clone()),
            items: Some(items),
            default_mode: Some(mode),
            optional: None,
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: name.clone(),
        mount_path: key_path,
        sub_path: Some(RELATIVE_PATH.to_owned()),
        ..Default::default()
    };

    Ok(Box::new(Ssh {
        job: job.clone(),
        secret_name: name,
        config: ssh_config(job, port),
        user_keys,
        volume,
        mount,
        warnings,
    }))
}

#[derive(Debug)]
struct Ssh {
    job: Job,
    secret_name: String,
    config: String,
    /// Keys from `--ssh-private-key`/`--ssh-public-key`; `None`: the context's keys.
    user_keys: Option<SshKeyPair>,
    volume: Volume,
    mount: VolumeMount,
    warnings: Vec<String>,
}

impl JobPlugin for Ssh {
    fn name(&self) -> &'static str {
        NAME
    }

    fn on_pod_create(&self, pod: &mut Pod) -> Result<(), PluginError> {
        let spec = pod.spec.get_or_insert_with(Default::default);
        spec.volumes.get_or_insert_with(Vec::new).push(self.volume.clone());
        for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
            c.volume_mounts.get_or_insert_with(Vec::new).push(self.mount.clone());
        }
        Ok(())
    }

    fn job_objects(&self, ctx: &ObjectContext<'_>) -> Result<Vec<JobObject>, PluginError> {
        let keys = match &self.user_keys {
            Some(k) => k.clone(),
            None => ctx
                .ssh_keys
                .key_pair()
                .map_err(|e| PluginError::Invalid { plugin: NAME, message: format!("no ssh key pair: {e}") })?,
        };
        let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
        let data = BTreeMap::from([
            (PRIVATE_KEY.to_owned(), bytes(&keys.private_key)),
            (PUBLIC_KEY.to_owned(), bytes(&keys.public_key)),
            (AUTHORIZED_KEYS.to_owned(), bytes(&keys.public_key)),
            (CONFIG.to_owned(), bytes(&self.config)),
        ]);
        Ok(vec![JobObject::Secret(Secret {
            metadata: plugin::object_meta(&self.job, self.secret_name.clone()),
            data: Some(data),
            type_: Some("Opaque".to_owned()),
            ..Default::default()
        })])
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

#[cfg(test)]
mod tests {
    use rsa::pkcs1::DecodeRsaPrivateKey;

    use super::*;
    use crate::flags::{self, Mode};
    use crate::job::{JobSpec, TaskSpec};
    use crate::plugin::BuildOptions;
    use crate::plugin::Flavor;

    fn built(args: &[&str], flavor: Flavor) -> Result<Box<dyn JobPlugin>, PluginError> {
        let job = Job::new(
            "j",
            JobSpec {
                tasks: vec![TaskSpec { name: "w".into(), replicas: 1, ..Default::default() }],
                ..Default::default()
            },
        );
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        build(BuildInput { job: &job, args: &args, flavor, options: &BuildOptions::default() })
    }

    #[test]
    fn defaults_parse() {
        let (f, w) = flags::parse(FLAGS, &[], Mode::Strict).expect("defaults parse");
        assert!(w.is_none());
        assert_eq!((f.string("ssh-key-file-path"), f.int("ssh-port")), ("/root/.ssh", 22));
        assert_eq!((f.string("ssh-private-key"), f.string("ssh-public-key")), ("", ""));
    }

    #[test]
    fn generated_keys_parse_back_and_match() {
        let pair = RandomKeys.key_pair().expect("generates");
        assert!(pair.private_key.starts_with("-----BEGIN RSA PRIVATE KEY-----\n"), "{}", pair.private_key);
        assert!(pair.private_key.ends_with("-----END RSA PRIVATE KEY-----\n"));
        assert!(pair.public_key.starts_with("ssh-rsa AAAA") && pair.public_key.ends_with('\n'));
        assert_eq!(pair.public_key.matches(' ').count(), 1, "no comment: {:?}", pair.public_key);
        assert_eq!(pair.public_key.matches('\n').count(), 1);

        let private = rsa::RsaPrivateKey::from_pkcs1_pem(&pair.private_key).expect("PKCS#1 PEM parses");
        private.validate().expect("valid key");
        assert_eq!(rsa::traits::PublicKeyParts::size(&private), 256, "2048 bits");
        let public = ssh_key::PublicKey::from_openssh(pair.public_key.trim_end()).expect("authorized-key line parses");
        assert_eq!(public.comment(), "");
        let ssh_key::public::KeyData::Rsa(rsa_public) = public.key_data() else { panic!("not an RSA key") };
        let from_ssh = rsa::RsaPublicKey::try_from(rsa_public).expect("converts");
        assert_eq!(from_ssh, private.to_public_key(), "public key belongs to the private key");

        let again = RandomKeys.key_pair().expect("generates");
        assert_ne!(again.public_key, pair.public_key, "fresh keys each time");
    }

    #[test]
    fn keys_from_secret_reads_data_then_string_data() {
        let mut s = Secret {
            data: Some(BTreeMap::from([(PRIVATE_KEY.to_owned(), ByteString(b"priv".to_vec()))])),
            string_data: Some(BTreeMap::from([(PUBLIC_KEY.to_owned(), "pub\n".to_owned())])),
            ..Default::default()
        };
        let pair = keys_from_secret(&s).expect("both keys");
        assert_eq!((pair.private_key.as_str(), pair.public_key.as_str()), ("priv", "pub\n"));
        s.string_data = None;
        assert_eq!(keys_from_secret(&s), None);
        s.data = Some(BTreeMap::from([
            (PRIVATE_KEY.to_owned(), ByteString(vec![0xff])),
            (PUBLIC_KEY.to_owned(), ByteString(b"pub".to_vec())),
        ]));
        assert_eq!(keys_from_secret(&s), None, "not UTF-8");
        assert_eq!(keys_from_secret(&Secret::default()), None);
    }

    #[test]
    fn strict_rejects_what_volcano_tolerates() {
        for (args, needle) in [
            (&["--ssh-port=0"][..], "plugin ssh: flag -ssh-port: invalid value \"0\""),
            (&["--ssh-port=65536"], "flag -ssh-port"),
            (&["--ssh-key-file-path=home/.ssh"], "flag -ssh-key-file-path"),
            (&["--ssh-private-key=k"], "flag -ssh-private-key is given without -ssh-public-key"),
            (&["--ssh-public-key=k"], "flag -ssh-public-key is given without -ssh-private-key"),
            (&["--ssh-prot=22"], "plugin ssh: unknown flag -ssh-prot"),
        ] {
            let e = built(args, Flavor::Weft).expect_err("strict rejects").to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
            let p = built(args, Flavor::Volcano).expect("Volcano tolerates");
            assert_eq!(p.warnings().len(), 1, "{args:?}: {:?}", p.warnings());
            assert!(p.warnings()[0].starts_with("plugin ssh: "), "{:?}", p.warnings());
        }
    }
}
