//! `weft install-cni`: copies the CNI plugin binary (`weft-cni`) from the image into the host's CNI
//! binary directory. It is the init container of the node agent's DaemonSet with the SR-IOV
//! component (`deploy/components/sriov`); it exists because the image is distroless (no shell, no
//! `cp`).
//!
//! The copy is atomic: the bytes go to a temporary file in the target directory, which is synced,
//! made 0755 and renamed over the old binary (then the directory is synced), so a runtime executing
//! the plugin at that moment runs the old file or the new one, never a part of one. A target whose
//! bytes already equal the source's is left alone (same inode, same mtime), so a restarted agent pod
//! rewrites nothing. Every error names the path it is about.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::Args;

#[derive(Args, Debug)]
pub struct InstallCniArgs {
    /// The plugin binary to install (in the image: /usr/local/bin/weft-cni).
    #[arg(long, value_name = "FILE")]
    from: PathBuf,
    /// The host's CNI binary directory, mounted into the container (/opt/cni/bin on the host).
    #[arg(long, value_name = "DIR")]
    to: PathBuf,
    /// The installed file's name in DIR: the `type` of the network configurations that use it.
    #[arg(long, value_name = "NAME", default_value = "weft-cni")]
    name: String,
}

/// What [`install`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Installed {
    /// No file of that name was there.
    New { bytes: u64 },
    /// A different file was replaced.
    Replaced { bytes: u64 },
    /// The file there already had the same bytes; it was not rewritten.
    Unchanged,
}

pub fn run(a: InstallCniArgs) -> anyhow::Result<()> {
    let target = a.to.join(&a.name);
    let done = install(&a.from, &a.to, &a.name)?;
    let (from, target) = (a.from.display(), target.display());
    match done {
        Installed::New { bytes } => outln!("installed {from} as {target} ({bytes} bytes)")?,
        Installed::Replaced { bytes } => outln!("replaced {target} with {from} ({bytes} bytes)")?,
        Installed::Unchanged => outln!("{target} is already identical to {from}: left unchanged")?,
    }
    Ok(())
}

/// Installs `from` as `dir/name` (see the module's documentation).
pub fn install(from: &Path, dir: &Path, name: &str) -> anyhow::Result<Installed> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        bail!("--name {name:?} is not a file name (it is the plugin's `type` in network configurations)");
    }
    let mut source = File::open(from).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => anyhow::anyhow!("the plugin binary {} does not exist", from.display()),
        _ => anyhow::Error::new(e).context(format!("opening the plugin binary {}", from.display())),
    })?;
    let meta = source.metadata().with_context(|| format!("reading the plugin binary {}", from.display()))?;
    if !meta.is_file() {
        bail!("the plugin binary {} is not a regular file", from.display());
    }
    if meta.len() == 0 {
        bail!("the plugin binary {} is empty", from.display());
    }
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("the CNI binary directory {} is not a directory", dir.display()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            bail!("the CNI binary directory {} does not exist (mount the host's CNI bin dir there)", dir.display())
        }
        Err(e) => return Err(e).with_context(|| format!("reading the CNI binary directory {}", dir.display())),
    }
    let target = dir.join(name);

    // The file there, when it is a regular file (not followed if it is a symlink: a link is replaced).
    let existing = match fs::symlink_metadata(&target) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", target.display())),
    };
    if let Some(m) = &existing
        && m.is_file()
        && m.len() == meta.len()
        && same_bytes(&mut source, from, &target)?
    {
        if m.permissions().mode() & 0o777 != 0o755 {
            fs::set_permissions(&target, fs::Permissions::from_mode(0o755))
                .with_context(|| format!("making {} executable (0755)", target.display()))?;
        }
        return Ok(Installed::Unchanged);
    }
    if existing.as_ref().is_some_and(|m| m.is_dir()) {
        bail!("{} is a directory; remove it to install the plugin there", target.display());
    }

    // A name of our own in the same directory (a rename is atomic only within one file system). A
    // stale one from a run that was killed (PID 1 in every container) is removed first; O_EXCL then
    // never follows a link someone left at that name.
    let tmp = dir.join(format!(".{name}.weft-install-{}", std::process::id()));
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing the stale temporary file {}", tmp.display())),
    }
    let result = write_and_rename(&mut source, from, &tmp, &target, dir);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    let bytes = result?;
    Ok(if existing.is_some() { Installed::Replaced { bytes } } else { Installed::New { bytes } })
}

fn write_and_rename(source: &mut File, from: &Path, tmp: &Path, target: &Path, dir: &Path) -> anyhow::Result<u64> {
    let mut out = OpenOptions::new().write(true).create_new(true).mode(0o700).open(tmp).with_context(|| {
        format!("cannot write to the CNI binary directory {}: creating {}", dir.display(), tmp.display())
    })?;
    source.rewind().with_context(|| format!("reading {}", from.display()))?;
    let bytes =
        io::copy(source, &mut out).with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    out.set_permissions(fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable (0755)", tmp.display()))?;
    out.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
    drop(out);
    fs::rename(tmp, target).with_context(|| format!("renaming {} to {}", tmp.display(), target.display()))?;
    // The rename itself survives a crash only once the directory is synced.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing the CNI binary directory {}", dir.display()))?;
    Ok(bytes)
}

/// Whether `target` holds exactly the bytes of `source` (same length already checked).
fn same_bytes(source: &mut File, from: &Path, target: &Path) -> anyhow::Result<bool> {
    let mut other = match File::open(target) {
        Ok(f) => f,
        // Unreadable (mode 0): not known to be the same, so it is replaced.
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("reading {}", target.display())),
    };
    source.rewind().with_context(|| format!("reading {}", from.display()))?;
    let (mut a, mut b) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = read_full(source, &mut a).with_context(|| format!("reading {}", from.display()))?;
        let m = read_full(&mut other, &mut b).with_context(|| format!("reading {}", target.display()))?;
        if n != m || a[..n] != b[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Reads until `buf` is full or the file ends; the count read.
fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_a_slash_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let from = dir.path().join("plugin");
        fs::write(&from, b"x").expect("write");
        for bad in ["", ".", "..", "a/b"] {
            let e = install(&from, dir.path(), bad).expect_err(bad).to_string();
            assert!(e.contains("not a file name"), "{bad}: {e}");
        }
    }
}
