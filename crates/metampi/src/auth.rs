//! The job-secret handshake of every connection (`metampi_launch::auth`, shared with the
//! launcher's bootstrap exchange), and where a rank or router finds the secret.

use std::io;

pub use metampi_launch::auth::{
    accept, check, connect, connect_on, hex, nonce, same, Acceptance, Secret, NONCE, TAG,
    VERTICAL_CTX,
};

/// The job's secret from `METAMPI_SECRET` or the file `METAMPI_SECRET_FILE`.
pub fn secret_from_env() -> io::Result<Secret> {
    let text = match (
        crate::knobs::text("METAMPI_SECRET"),
        crate::knobs::os("METAMPI_SECRET_FILE"),
    ) {
        (Some(s), _) => s,
        (_, Some(path)) => std::fs::read_to_string(&path).map_err(|e| {
            io::Error::other(format!(
                "cannot read the job secret from {}: {e}",
                std::path::Path::new(&path).display()
            ))
        })?,
        _ => {
            return Err(io::Error::other(
                "no job secret: METAMPI_SECRET is not set (start jobs with `metampi run`)",
            ))
        }
    };
    Secret::from_hex(&text)
        .ok_or_else(|| io::Error::other("the job secret is not 64 hexadecimal digits"))
}
