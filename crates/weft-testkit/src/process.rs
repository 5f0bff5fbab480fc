//! Child processes under test.

use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::time::Duration;

/// Waits for `child` to exit, at most `hang_guard` (a hang guard, not a measurement): its status,
/// or `None` when it had not exited by then (it is then killed with SIGKILL).
pub fn wait_exit(mut child: Child, hang_guard: Duration) -> Option<ExitStatus> {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(hang_guard) {
        Ok(status) => Some(status.unwrap()),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            None
        }
    }
}
