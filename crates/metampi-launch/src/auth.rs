//! Who may connect: every connection between processes of a job (rank to
//! launcher, rank to rank, rank to router, router to router) proves knowledge of the job's
//! secret by challenge and response, in both directions, without sending the
//! secret. The launcher makes a random 256-bit secret per job and hands it to
//! ranks and routers in `METAMPI_SECRET` (64 hex digits); a site started by
//! hand reads it from a file instead (`METAMPI_SECRET_FILE`).
//!
//! The exchange, acceptor A and connector C, context string X (what the
//! connection is for), HMAC-SHA256 under the secret K:
//!
//! 1. A -> C: `nA` (16 random bytes);
//! 2. C -> A: `nC` (16 random bytes), `HMAC(K, "C" X nA nC H)`, then `H`, the
//!    connection's hello (who C is), so the hello cannot be altered;
//! 3. A -> C: `HMAC(K, "A" X nC nA)`.
//!
//! A fresh `nA` per connection makes a recorded step 2 worthless on any other
//! connection (replay), and a peer of another job (other K) or a stranger (no
//! K) cannot produce step 2 or 3.

//! The bootstrap exchange (`pmi`) runs the same steps as text lines (`AUTH`, `HELLO`,
//! `OK`); ranks and routers run them as bytes on their connections ([`connect`],
//! [`accept`]; [`Acceptance`] and [`check`] where one thread accepts many at once).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Handshake context of a rank's connection to its router.
pub const VERTICAL_CTX: &str = "metampi rank-router";

/// Bytes of a challenge.
pub const NONCE: usize = 16;
/// Bytes of a response.
pub const TAG: usize = 32;
/// How long a peer may take to answer during the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A job's secret.
#[derive(Clone)]
pub struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A new random secret.
    ///
    /// # Errors
    /// The OS random source cannot be read.
    pub fn random() -> io::Result<Secret> {
        random_bytes().map(Secret)
    }

    /// Parses 64 hex digits (surrounding white space ignored).
    pub fn from_hex(text: &str) -> Option<Secret> {
        Some(Secret(unhex(text.trim())?.try_into().ok()?))
    }

    /// As 64 hex digits (for `METAMPI_SECRET`).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; TAG] {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }

    /// Step 2's response of a connector that was challenged with `na`, chose `nc` and
    /// introduces itself with `hello`.
    pub fn connector_tag(&self, ctx: &str, na: &[u8], nc: &[u8], hello: &[u8]) -> [u8; TAG] {
        self.mac(&[b"C", ctx.as_bytes(), na, nc, hello])
    }

    /// Step 3's response of an acceptor.
    pub fn acceptor_tag(&self, ctx: &str, nc: &[u8], na: &[u8]) -> [u8; TAG] {
        self.mac(&[b"A", ctx.as_bytes(), nc, na])
    }
}

/// Compares in time independent of where the inputs differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// A fresh challenge.
///
/// # Errors
/// The OS random source cannot be read.
pub fn nonce() -> io::Result<[u8; NONCE]> {
    random_bytes()
}

/// `N` bytes from the operating system's random source.
///
/// # Errors
/// The source cannot be read (no `getrandom` call and no `/dev/urandom`).
pub fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(format!("random source: {e}")))?;
    Ok(b)
}

/// Lowercase hex digits of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of an even number of hex digits (at most 64 bytes).
pub fn unhex(t: &str) -> Option<Vec<u8>> {
    if t.len() % 2 != 0 || t.len() > 128 {
        return None;
    }
    (0..t.len() / 2)
        .map(|i| u8::from_str_radix(t.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

fn refused(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, what)
}

/// The connector's side over any byte stream (a socket, or a TLS session on one):
/// answers the challenge, sends `hello`, and checks the acceptor's proof. `ctx` names what
/// the connection is for; both sides must use the same. `describe` words a failure to read
/// the proof (a TLS alert says more than its error's text).
///
/// # Errors
/// `PermissionDenied` when either side does not know the secret; the stream's errors.
pub fn connect_on(
    io: &mut (impl Read + Write),
    key: &Secret,
    ctx: &str,
    hello: &[u8],
    describe: impl Fn(&io::Error) -> String,
) -> io::Result<()> {
    let mut na = [0u8; NONCE];
    io.read_exact(&mut na)?;
    let nc = nonce()?;
    let mut msg = Vec::with_capacity(NONCE + TAG + hello.len());
    msg.extend_from_slice(&nc);
    msg.extend_from_slice(&key.connector_tag(ctx, &na, &nc, hello));
    msg.extend_from_slice(hello);
    io.write_all(&msg)?;
    io.flush()?;
    let mut ta = [0u8; TAG];
    io.read_exact(&mut ta)
        .map_err(|e| refused(format!("the peer refused this process ({})", describe(&e))))?;
    if !same(&ta, &key.acceptor_tag(ctx, &nc, &na)) {
        return Err(refused("the peer does not know the job secret".into()));
    }
    Ok(())
}

/// [`connect_on`] a blocking TCP stream, with the handshake's timeout.
///
/// # Errors
/// As [`connect_on`]; a peer that stays silent for 10 seconds.
pub fn connect(s: &mut TcpStream, key: &Secret, ctx: &str, hello: &[u8]) -> io::Result<()> {
    let old = s.read_timeout()?;
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    connect_on(s, key, ctx, hello, ToString::to_string)?;
    s.set_read_timeout(old)?;
    Ok(())
}

/// The acceptor's side on a blocking stream: challenges, checks the answer,
/// proves itself, and returns the connector's `hello_len`-byte hello.
///
/// # Errors
/// `PermissionDenied` for a connector without the secret; the stream's errors.
pub fn accept(s: &mut TcpStream, key: &Secret, ctx: &str, hello_len: usize) -> io::Result<Vec<u8>> {
    let old = s.read_timeout()?;
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let na = nonce()?;
    s.write_all(&na)?;
    let mut msg = vec![0u8; NONCE + TAG + hello_len];
    s.read_exact(&mut msg)?;
    let hello = check(key, ctx, &na, &msg)?;
    s.write_all(&key.acceptor_tag(ctx, &msg[..NONCE], &na))?;
    s.set_read_timeout(old)?;
    Ok(hello.to_vec())
}

/// The acceptor's side of one handshake on a non-blocking stream, taken a step further
/// whenever the stream is readable: one thread runs many at once, each costing its socket
/// and a buffer of its answer.
#[derive(Debug)]
pub struct Acceptance {
    stream: TcpStream,
    na: [u8; NONCE],
    got: Vec<u8>,
    need: usize,
    since: Instant,
}

impl Acceptance {
    /// Starts on a fresh connection whose connector sends a `hello_len`-byte hello: makes
    /// it non-blocking and sends the challenge (into an empty socket buffer).
    ///
    /// # Errors
    /// The socket's.
    pub fn start(stream: TcpStream, hello_len: usize) -> io::Result<Acceptance> {
        stream.set_nonblocking(true)?;
        let na = nonce()?;
        (&stream).write_all(&na)?;
        let need = NONCE + TAG + hello_len;
        Ok(Acceptance {
            stream,
            na,
            got: Vec::with_capacity(need),
            need,
            since: Instant::now(),
        })
    }

    /// The connection.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// The handshake has taken longer than a peer that knows the secret needs.
    pub fn overdue(&self) -> bool {
        self.since.elapsed() > HANDSHAKE_TIMEOUT
    }

    /// Reads what has arrived. `Ok(Some(hello))` once the answer is whole and right (the
    /// proof is then sent back and the stream is the caller's: [`Acceptance::into_stream`]);
    /// `Ok(None)` while more is to come.
    ///
    /// # Errors
    /// `PermissionDenied` for a connector without the secret; `UnexpectedEof` when it
    /// closed the connection; the socket's.
    pub fn advance(&mut self, key: &Secret, ctx: &str) -> io::Result<Option<Vec<u8>>> {
        let mut b = [0u8; 256];
        while self.got.len() < self.need {
            let want = (self.need - self.got.len()).min(b.len());
            match (&self.stream).read(&mut b[..want]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.got.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let hello = check(key, ctx, &self.na, &self.got)?.to_vec();
        let proof = key.acceptor_tag(ctx, &self.got[..NONCE], &self.na);
        (&self.stream).write_all(&proof)?;
        Ok(Some(hello))
    }

    /// The stream of a finished handshake.
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }
}

/// Checks a connector's step 2 (`msg`) against challenge `na`; the hello on success.
///
/// # Errors
/// `PermissionDenied` for a short message or a wrong response.
pub fn check<'m>(key: &Secret, ctx: &str, na: &[u8], msg: &'m [u8]) -> io::Result<&'m [u8]> {
    if msg.len() < NONCE + TAG {
        return Err(refused("short handshake".into()));
    }
    let (nc, rest) = msg.split_at(NONCE);
    let (tag, hello) = rest.split_at(TAG);
    if !same(tag, &key.connector_tag(ctx, na, nc, hello)) {
        return Err(refused(
            "the connection does not know the job secret".into(),
        ));
    }
    Ok(hello)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(ka: Secret, kc: Secret) -> (io::Result<Vec<u8>>, io::Result<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            connect(&mut s, &kc, "test", b"hello")
        });
        let (mut s, _) = l.accept().unwrap();
        let a = accept(&mut s, &ka, "test", 5);
        drop(s);
        (a, t.join().unwrap())
    }

    /// Many handshakes on one thread: a silent connection stays pending while a peer that
    /// knows the secret gets through, and a wrong answer is refused.
    #[test]
    fn acceptances_run_side_by_side_without_blocking() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let k = Secret::random().unwrap();
        let _silent = TcpStream::connect(addr).unwrap();
        let mut silent = Acceptance::start(l.accept().unwrap().0, 4).unwrap();
        let kc = k.clone();
        let good = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            connect(&mut s, &kc, "test", b"rank")
        });
        let mut a = Acceptance::start(l.accept().unwrap().0, 4).unwrap();
        let hello = loop {
            assert!(silent.advance(&k, "test").unwrap().is_none());
            if let Some(h) = a.advance(&k, "test").unwrap() {
                break h;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(hello, b"rank");
        good.join().unwrap().unwrap();
        assert!(!silent.overdue());
        let bad = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            connect(&mut s, &Secret::random().unwrap(), "test", b"rank")
        });
        let mut a = Acceptance::start(l.accept().unwrap().0, 4).unwrap();
        let e = loop {
            match a.advance(&k, "test") {
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Ok(Some(_)) => panic!("a wrong secret passed"),
                Err(e) => break e,
            }
        };
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        drop(a);
        assert!(bad.join().unwrap().is_err());
    }

    #[test]
    fn same_secret_passes_both_ways() {
        let k = Secret::random().unwrap();
        let (a, c) = pair(k.clone(), k);
        assert_eq!(a.unwrap(), b"hello");
        c.unwrap();
    }

    #[test]
    fn other_secret_is_refused() {
        let (a, c) = pair(Secret::random().unwrap(), Secret::random().unwrap());
        assert_eq!(a.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert!(c.is_err());
    }

    #[test]
    fn hex_round_trip() {
        let k = Secret::random().unwrap();
        assert!(same(&Secret::from_hex(&k.to_hex()).unwrap().0, &k.0));
        assert!(Secret::from_hex("12").is_none());
        assert!(Secret::from_hex(&"zz".repeat(32)).is_none());
    }
}
