//! Where the control socket may live, and whom its clients may trust.
//!
//! The control socket tells `forkpool status` (and operators' scripts) what
//! the pool is doing, so another local user must not be able to take its
//! place. Three rules:
//!
//! - The default location is a private directory: `$XDG_RUNTIME_DIR`
//!   (made by the login manager, mode 0700), else `TMPDIR/forkpool-UID/`,
//!   which the supervisor creates with mode 0700 and, when it already
//!   exists, accepts only if it is a real directory owned by this user
//!   with no access for anybody else.
//! - Any control path is refused when its directory is owned by another
//!   user (other than root), or when other users can write to it, unless
//!   the directory is sticky (like `/tmp`) and any file already at the
//!   path is this user's own.
//! - A client checks who serves the socket (`SO_PEERCRED`): the same user
//!   or root, else it refuses to read it.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::unistd::{geteuid, Uid};

/// The file name of the control socket in its default directory.
pub const SOCKET_NAME: &str = "forkpool.sock";

/// The default control socket path: `$XDG_RUNTIME_DIR/forkpool.sock`, else
/// `TMPDIR/forkpool-UID/forkpool.sock` (`TMPDIR` defaulting to `/tmp`).
pub fn default_path() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join(SOCKET_NAME),
        _ => std::env::temp_dir()
            .join(format!("forkpool-{}", geteuid().as_raw()))
            .join(SOCKET_NAME),
    }
}

fn refuse(text: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, text)
}

/// Checks (and, if missing, creates with mode 0700) the directory that
/// will hold the control socket at `path`, and any file already there.
/// A directory this call creates, or one named `forkpool-UID` in the
/// temporary directory, must be private: owned by us, no access for
/// group or others.
///
/// One function on purpose: a flat list of checks on the same directory
/// and its metadata, each refusing with its own fix, in the order a
/// sysadmin would check them.
pub fn prepare(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let me = geteuid();
    let private = dir.file_name().is_some_and(|name| {
        name.to_str() == Some(&format!("forkpool-{}", me.as_raw()))
            && dir.parent() == Some(std::env::temp_dir().as_path())
    });
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "cannot create the control socket directory {}: {e}",
                    dir.display()
                ),
            ))
        }
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.file_type().is_dir() {
        return Err(refuse(format!(
            "{} is not a directory (a symlink?); remove it or pass --control PATH",
            dir.display()
        )));
    }
    let owner = Uid::from_raw(meta.uid());
    if owner != me && !owner.is_root() {
        return Err(refuse(format!(
            "the control socket directory {} belongs to uid {owner}, not to you (uid {me}): \
             another user could replace the socket; remove the directory or pass --control \
             PATH in a directory of your own",
            dir.display()
        )));
    }
    let mode = meta.mode();
    if private && (owner != me || mode & 0o077 != 0) {
        return Err(refuse(format!(
            "the control socket directory {} must be yours with mode 0700, and is uid {owner} \
             mode {:o}: remove it (forkpool makes it again) or pass --control PATH",
            dir.display(),
            mode & 0o7777
        )));
    }
    if mode & 0o022 != 0 {
        if mode & 0o1000 == 0 {
            return Err(refuse(format!(
                "the control socket directory {} is writable by other users (mode {:o}) and not \
                 sticky: anyone could replace the socket; use a private directory \
                 (chmod go-w, or pass --control PATH elsewhere)",
                dir.display(),
                mode & 0o7777
            )));
        }
        match std::fs::symlink_metadata(path) {
            Ok(file) if file.uid() != me.as_raw() => {
                return Err(refuse(format!(
                    "{} already exists and belongs to uid {}, not to you (uid {me}): another \
                     user may be spoofing the control socket; remove it or pass --control PATH",
                    path.display(),
                    file.uid()
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks that the server on the other end of `socket` runs as this user
/// or as root (`SO_PEERCRED`); `path` names it in the error.
pub fn check_server(socket: impl AsFd, path: &Path) -> io::Result<()> {
    let creds = nix::sys::socket::getsockopt(&socket, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| {
        io::Error::other(format!("cannot check who serves {}: {e}", path.display()))
    })?;
    let server = Uid::from_raw(creds.uid());
    let me = geteuid();
    if server == me || server.is_root() {
        return Ok(());
    }
    Err(refuse(format!(
        "{} is served by uid {server} (pid {}), not by you (uid {me}) or root: it is not \
         your pool, and may be another user spoofing it; not trusting it (remove the file, \
         or pass --control PATH)",
        path.display(),
        creds.pid()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "forkpool-control-path-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_missing_directory_is_made_private() {
        let dir = scratch("missing");
        prepare(&dir.join("c.sock")).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_world_writable_directory_is_refused_unless_sticky() {
        let dir = scratch("open");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare(&dir.join("c.sock")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        prepare(&dir.join("c.sock")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_symlink_is_not_a_directory() {
        let dir = scratch("link");
        std::os::unix::fs::symlink("/", &dir).unwrap();
        assert!(prepare(&dir.join("c.sock")).is_err());
        std::fs::remove_file(&dir).unwrap();
    }
}
