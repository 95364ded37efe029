//! TLS 1.3 on the links between routers (cargo feature `tls`, on by default:
//! rustls with the ring provider).
//!
//! A link with `TLS = auto` or `TLS = on` in the description (see
//! `docs/description-language.md` and `docs/security.md`) runs TLS directly
//! on its TCP connection; both ends present a certificate and each checks
//! the other's. The job-secret challenge and response (`auth.rs`) then runs
//! inside the encrypted channel as on a plain link (defence in depth).
//!
//! - `TLS = auto`: every router derives an Ed25519 key and a self-signed
//!   certificate from the job secret and its router id ([`auto_identity`]),
//!   and pins the certificate its peer router derives in the same way. So
//!   nothing has to be handed out: routers started by ssh or by hand get
//!   the secret anyway, and no key is ever written to a file or put in an
//!   environment. Who holds the job secret could act as a router, exactly as
//!   on a plain link; what TLS adds is encryption with forward secrecy and
//!   integrity against anyone without it.
//! - `TLS = on`: the meta hosts' own certificates and keys (PEM files that
//!   the routers read on their machines), checked against the peer meta
//!   host's pins and/or CA bundle with its DNS name.
//!
//! What crosses the process boundary is plain data ([`Identity`],
//! [`LinkTls`]: paths and fingerprints), carried in the router's spec
//! (`metampi_launch::router_spec`, so that launchers need no TLS library).
//! Without the feature these types remain, a spec that asks for TLS is
//! refused with a message that says why, and the stream types are
//! uninhabited, so the router's TLS branches compile to nothing.
//!
//! The router drives a `TlsStream` from its event loop over the same
//! non-blocking socket as a plain link: ciphertext is read in large chunks
//! into a buffer of its own (rustls would read 4 KiB per call, a system call
//! each), decrypted, and appended to the bytes handed to the wire protocol;
//! outgoing frames are encrypted into rustls's buffer, whose size is
//! limited, and written with `writev` as the socket takes them.

use std::io;

pub use metampi_launch::router_spec::{auto_name, Identity, LinkTls, PeerCheck, TLS_AVAILABLE};

#[cfg(feature = "tls")]
pub(crate) use imp::{describe_error, setup, Acceptor, Dialer, TlsStream};
#[cfg(not(feature = "tls"))]
pub(crate) use off::{describe_error, setup, Acceptor, Dialer, TlsStream};

/// A router's TLS ends: per outgoing link and per listener, `None` where
/// the link is plain.
pub(crate) type Ends = (Vec<Option<Dialer>>, Vec<Option<Acceptor>>);

/// SHA-256 of a DER certificate (what `TLSPIN` and `openssl x509
/// -fingerprint -sha256` give).
pub fn fingerprint(der: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(der).into()
}

/// The `TLS = auto` identity of router `router` of the job whose secret is
/// `secret`: an Ed25519 key whose seed is an HMAC of the secret, and a
/// self-signed certificate for [`auto_name`] (Ed25519 signatures and
/// rcgen's fixed fields make it the same bytes wherever it is made).
/// Returns the certificate (DER), the key (PKCS#8 DER) and the
/// certificate's fingerprint.
///
/// # Errors
/// Without the `tls` feature, or if rcgen refuses the key.
pub fn auto_identity(
    secret: &metampi::auth::Secret,
    router: usize,
) -> io::Result<(Vec<u8>, Vec<u8>, [u8; 32])> {
    #[cfg(feature = "tls")]
    {
        // The connector tag is the secret's HMAC with a context label; no
        // handshake uses this label, so the seed is never sent anywhere.
        let seed = secret.connector_tag(
            "metampi tls-auto ed25519 key",
            &(router as u64).to_le_bytes(),
            &[],
            &[],
        );
        // PKCS#8 v1 of an Ed25519 private key (RFC 8410): fixed prefix, seed.
        let mut pkcs8 = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        pkcs8.extend_from_slice(&seed);
        let bad = |e: rcgen::Error| io::Error::other(format!("making a TLS certificate: {e}"));
        let der = rustls::pki_types::PrivatePkcs8KeyDer::from(pkcs8.clone());
        let key = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&der, &rcgen::PKCS_ED25519)
            .map_err(bad)?;
        let cert = rcgen::CertificateParams::new(vec![auto_name(router)])
            .map_err(bad)?
            .self_signed(&key)
            .map_err(bad)?;
        let cert = cert.der().to_vec();
        let fp = fingerprint(&cert);
        Ok((cert, pkcs8, fp))
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = (secret, router);
        Err(not_built())
    }
}

#[cfg(not(feature = "tls"))]
fn not_built() -> io::Error {
    io::Error::other(
        "this metampi was built without TLS (cargo feature `tls`), but the description asks \
         for TLS on a router link: rebuild with default features, or set TLS = off",
    )
}

#[cfg(feature = "tls")]
mod imp {
    use std::fmt;
    use std::io::{self, BufRead, IoSlice, Read, Write};
    use std::net::TcpStream;
    use std::sync::Arc;

    use bytes::BytesMut;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::WebPkiServerVerifier;
    use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
    use rustls::server::WebPkiClientVerifier;
    use rustls::{
        CertificateError, ClientConfig, ClientConnection, Connection, DigitallySignedStruct,
        DistinguishedName, RootCertStore, ServerConfig, ServerConnection, SignatureScheme,
    };

    use super::{fingerprint, Identity, LinkTls, PeerCheck};
    use metampi::auth;
    use metampi_launch::router_spec::RouterSpec;

    /// Ciphertext read from the socket per system call on an established
    /// link (the router's plain links read 256 KiB at a time as well).
    const LINK_READ: usize = 256 << 10;
    /// While the handshake runs: one TLS record. A stranger that never
    /// finishes the handshake costs this much, not a link's buffer.
    const HELLO_READ: usize = 17 << 10;
    /// Encrypted records waiting for the socket (and plaintext waiting for
    /// the handshake): writes into the connection stop at this much, so a
    /// link holds at most this beyond the wire protocol's own send buffer.
    const SEND_LIMIT: usize = 256 << 10;

    /// The dialling end of a TLS link: configuration and the name to ask for.
    #[derive(Clone)]
    pub(crate) struct Dialer {
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    }

    /// The listening end of a TLS link.
    #[derive(Clone)]
    pub(crate) struct Acceptor {
        config: Arc<ServerConfig>,
    }

    /// Per outgoing link and per listener of `spec`: its TLS end, or `None`
    /// for a plain link. Reads the certificate and key files of `TLS = on`
    /// and derives the `TLS = auto` identities from `secret`.
    pub(crate) fn setup(spec: &RouterSpec, secret: &auth::Secret) -> io::Result<super::Ends> {
        let used = spec
            .out
            .iter()
            .filter_map(|o| o.tls.as_ref())
            .chain(spec.listen_tls.iter().flatten())
            .count();
        if used == 0 {
            return Ok((vec![None; spec.out.len()], vec![None; spec.listen.len()]));
        }
        let provider = Arc::new(provider());
        let ids = spec
            .identities
            .iter()
            .map(|id| load_identity(id, secret, spec.id))
            .collect::<io::Result<Vec<_>>>()?;
        let identity = |l: &LinkTls| {
            ids.get(l.identity).ok_or_else(|| {
                io::Error::other(format!(
                    "TLS identity {} named by a link is not in the spec",
                    l.identity
                ))
            })
        };
        let mut dialers = Vec::new();
        for o in &spec.out {
            dialers.push(match &o.tls {
                None => None,
                Some(l) => Some(dialer(&provider, identity(l)?, &expect(&l.peer, secret)?)?),
            });
        }
        let mut acceptors = Vec::new();
        for i in 0..spec.listen.len() {
            acceptors.push(match spec.listen_tls.get(i).and_then(Option::as_ref) {
                None => None,
                Some(l) => Some(acceptor(
                    &provider,
                    identity(l)?,
                    &expect(&l.peer, secret)?,
                )?),
            });
        }
        Ok((dialers, acceptors))
    }

    /// ring's TLS 1.3 suites with AES-128-GCM first: with AES-NI it is the
    /// fastest of them, and both ends are ours, so the order decides.
    fn provider() -> CryptoProvider {
        let mut p = rustls::crypto::ring::default_provider();
        p.cipher_suites = vec![
            rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
            rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384,
            rustls::crypto::ring::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        ];
        p
    }

    struct Loaded {
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    }

    fn read_file(path: &str, what: &str) -> io::Result<Vec<u8>> {
        let expanded = expand_home(path);
        std::fs::read(&expanded)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot read {what} {path}: {e}")))
    }

    /// `~/x` is the home directory's `x`, as in `SECRET_FILE`.
    fn expand_home(path: &str) -> std::path::PathBuf {
        metampi_config::home_path(path)
    }

    fn load_identity(id: &Identity, secret: &auth::Secret, router: usize) -> io::Result<Loaded> {
        let (cert, key) = match id {
            Identity::Auto => {
                let (cert, key, _) = super::auto_identity(secret, router)?;
                return Ok(Loaded {
                    chain: vec![CertificateDer::from(cert)],
                    key: PrivateKeyDer::Pkcs8(key.into()),
                });
            }
            Identity::Files { cert, key } => (cert, key),
        };
        let cert_pem = read_file(cert, "the TLS certificate")?;
        let key_pem = read_file(key, "the TLS key")?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io::Error::other(format!("TLS certificate {cert}: not PEM ({e:?})")))?;
        if chain.is_empty() {
            return Err(io::Error::other(format!(
                "TLS certificate {cert}: no CERTIFICATE in the file"
            )));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            io::Error::other(format!("TLS key {key}: no usable private key ({e:?})"))
        })?;
        Ok(Loaded { chain, key })
    }

    fn roots(path: &str) -> io::Result<Arc<RootCertStore>> {
        let pem = read_file(path, "the TLS CA bundle")?;
        let mut store = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&pem) {
            let c =
                c.map_err(|e| io::Error::other(format!("TLS CA bundle {path}: not PEM ({e:?})")))?;
            store.add(c).map_err(|e| {
                io::Error::other(format!("TLS CA bundle {path}: bad certificate: {e}"))
            })?;
        }
        if store.is_empty() {
            return Err(io::Error::other(format!(
                "TLS CA bundle {path}: no CERTIFICATE in the file"
            )));
        }
        Ok(Arc::new(store))
    }

    fn tls_error(what: &str, e: rustls::Error) -> io::Error {
        io::Error::other(format!("{what}: {e}"))
    }

    /// What a [`PeerCheck`] asks for, made concrete: the name, the CA bundle's
    /// path, the accepted fingerprints.
    pub(crate) struct Expect {
        name: ServerName<'static>,
        ca: Option<String>,
        pins: Vec<[u8; 32]>,
    }

    pub(crate) fn expect(check: &PeerCheck, secret: &auth::Secret) -> io::Result<Expect> {
        let (name, ca, pins) = match check {
            PeerCheck::Auto { router } => {
                let (_, _, pin) = super::auto_identity(secret, *router)?;
                (super::auto_name(*router), None, vec![pin])
            }
            PeerCheck::Certificate { name, ca, pins } => (name.clone(), ca.clone(), pins.clone()),
        };
        if pins.is_empty() && ca.is_none() {
            return Err(io::Error::other(
                "a TLS link needs a CA bundle or pinned certificates to check its peer",
            ));
        }
        let name = ServerName::try_from(name.clone())
            .map_err(|_| io::Error::other(format!("TLS name `{name}` is not a DNS name")))?;
        Ok(Expect { name, ca, pins })
    }

    fn dialer(provider: &Arc<CryptoProvider>, id: &Loaded, e: &Expect) -> io::Result<Dialer> {
        let check = Verifier::new(provider, e)?;
        let mut config = ClientConfig::builder_with_provider(Arc::clone(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls_error("TLS client configuration", e))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(check))
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|e| tls_error("TLS certificate and key", e))?;
        // Every connection authenticates in full; a reconnect is rare.
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Dialer {
            config: Arc::new(config),
            name: e.name.clone(),
        })
    }

    fn acceptor(provider: &Arc<CryptoProvider>, id: &Loaded, e: &Expect) -> io::Result<Acceptor> {
        let check = Verifier::new(provider, e)?;
        let mut config = ServerConfig::builder_with_provider(Arc::clone(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls_error("TLS server configuration", e))?
            .with_client_cert_verifier(Arc::new(check))
            .with_single_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|e| tls_error("TLS certificate and key", e))?;
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        Ok(Acceptor {
            config: Arc::new(config),
        })
    }

    /// A dialler from a DER certificate and PKCS#8 key (unit tests).
    #[cfg(test)]
    pub(crate) fn dialer_for_test(cert: &[u8], key: &[u8], e: &Expect) -> io::Result<Dialer> {
        dialer(&Arc::new(provider()), &loaded_for_test(cert, key), e)
    }

    /// An acceptor from a DER certificate and PKCS#8 key (unit tests).
    #[cfg(test)]
    pub(crate) fn acceptor_for_test(cert: &[u8], key: &[u8], e: &Expect) -> io::Result<Acceptor> {
        acceptor(&Arc::new(provider()), &loaded_for_test(cert, key), e)
    }

    #[cfg(test)]
    fn loaded_for_test(cert: &[u8], key: &[u8]) -> Loaded {
        Loaded {
            chain: vec![CertificateDer::from(cert.to_vec())],
            key: PrivateKeyDer::Pkcs8(key.to_vec().into()),
        }
    }

    /// Why a peer's certificate was refused (shown in the router's log).
    #[derive(Debug)]
    struct Refused(String);

    impl fmt::Display for Refused {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for Refused {}

    fn refuse(why: String) -> rustls::Error {
        rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(
            Refused(why),
        ))))
    }

    /// How one end checks the other's certificate: every check that is
    /// configured must pass (a pin, and a CA with the name).
    struct Verifier {
        pins: Vec<[u8; 32]>,
        name: ServerName<'static>,
        server_ca: Option<Arc<WebPkiServerVerifier>>,
        client_ca: Option<Arc<dyn ClientCertVerifier>>,
        algorithms: WebPkiSupportedAlgorithms,
    }

    impl fmt::Debug for Verifier {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("Verifier")
                .field("pins", &self.pins.len())
                .field("name", &self.name)
                .field("ca", &self.server_ca.is_some())
                .finish()
        }
    }

    impl Verifier {
        fn new(provider: &Arc<CryptoProvider>, e: &Expect) -> io::Result<Verifier> {
            let (server_ca, client_ca) = match &e.ca {
                None => (None, None),
                Some(path) => {
                    let roots = roots(path)?;
                    let s = WebPkiServerVerifier::builder_with_provider(
                        Arc::clone(&roots),
                        Arc::clone(provider),
                    )
                    .build()
                    .map_err(|e| io::Error::other(format!("TLS CA bundle {path}: {e}")))?;
                    let c =
                        WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(provider))
                            .build()
                            .map_err(|e| io::Error::other(format!("TLS CA bundle {path}: {e}")))?;
                    (Some(s), Some(c))
                }
            };
            Ok(Verifier {
                pins: e.pins.clone(),
                name: e.name.clone(),
                server_ca,
                client_ca,
                algorithms: provider.signature_verification_algorithms,
            })
        }

        fn check_pin(&self, cert: &CertificateDer<'_>) -> Result<(), rustls::Error> {
            if self.pins.is_empty() {
                return Ok(());
            }
            let fp = fingerprint(cert.as_ref());
            if self.pins.iter().any(|p| auth::same(p, &fp)) {
                Ok(())
            } else {
                Err(refuse(format!(
                    "its certificate {} is not one pinned for this link",
                    metampi_config::format_pin(&fp)
                )))
            }
        }
    }

    impl ServerCertVerifier for Verifier {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            ocsp_response: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            self.check_pin(end_entity)?;
            if let Some(v) = &self.server_ca {
                // The name configured for the link, whatever was asked for.
                v.verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)?;
            }
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.algorithms.supported_schemes()
        }
    }

    impl ClientCertVerifier for Verifier {
        fn root_hint_subjects(&self) -> &[DistinguishedName] {
            self.client_ca
                .as_ref()
                .map_or(&[], |c| c.root_hint_subjects())
        }

        fn verify_client_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            now: UnixTime,
        ) -> Result<ClientCertVerified, rustls::Error> {
            self.check_pin(end_entity)?;
            if let Some(v) = &self.client_ca {
                v.verify_client_cert(end_entity, intermediates, now)?;
                // WebPKI checks a client's chain but not its name: the dialling
                // router must be the meta host the link comes from.
                let cert = webpki::EndEntityCert::try_from(end_entity)
                    .map_err(|e| refuse(format!("its certificate cannot be parsed: {e}")))?;
                cert.verify_is_valid_for_subject_name(&self.name)
                    .map_err(|_| {
                        refuse(format!(
                            "its certificate is not valid for {}",
                            self.name.to_str()
                        ))
                    })?;
            }
            Ok(ClientCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.algorithms.supported_schemes()
        }
    }

    /// An error of a TLS link in words for the log: the reason a certificate
    /// was refused rather than rustls's nested debug form.
    pub(crate) fn describe_error(e: &io::Error) -> String {
        let Some(inner) = e.get_ref() else {
            return e.to_string();
        };
        match inner.downcast_ref::<rustls::Error>() {
            Some(rustls::Error::InvalidCertificate(CertificateError::Other(o))) => {
                format!("TLS: the peer's certificate is refused: {o}")
            }
            Some(rustls::Error::InvalidCertificate(c)) => {
                format!("TLS: the peer's certificate is refused: {c}")
            }
            Some(other) => format!("TLS: {other}"),
            None => e.to_string(),
        }
    }

    impl Dialer {
        /// Runs TLS and then the job-secret handshake (connector side) on a
        /// blocking connection: the TLS session to hand to the event loop.
        /// Certificate and secret failures are `PermissionDenied`.
        pub(crate) fn connect(
            &self,
            s: &mut TcpStream,
            key: &auth::Secret,
            ctx: &str,
            hello: &[u8],
            timeout: std::time::Duration,
        ) -> io::Result<TlsStream> {
            let mut conn = ClientConnection::new(Arc::clone(&self.config), self.name.clone())
                .map_err(|e| tls_error("TLS", e))?;
            conn.set_buffer_limit(Some(SEND_LIMIT));
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            let res = auth::connect_on(
                &mut rustls::Stream::new(&mut conn, s),
                key,
                ctx,
                hello,
                describe_error,
            );
            if let Err(e) = res {
                let certificate = e
                    .get_ref()
                    .and_then(|i| i.downcast_ref::<rustls::Error>())
                    .is_some_and(|t| {
                        matches!(
                            t,
                            rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_)
                        )
                    });
                return Err(if certificate {
                    io::Error::new(io::ErrorKind::PermissionDenied, describe_error(&e))
                } else {
                    e
                });
            }
            s.set_read_timeout(None)?;
            s.set_write_timeout(None)?;
            let mut t = TlsStream::new(Connection::Client(conn), LINK_READ);
            // What rustls read beyond the acceptor's proof is already inside it.
            t.pending = true;
            Ok(t)
        }
    }

    impl Acceptor {
        /// The server side of a new connection; the handshake runs as the
        /// event loop feeds it.
        pub(crate) fn start(&self) -> io::Result<TlsStream> {
            let mut conn =
                ServerConnection::new(Arc::clone(&self.config)).map_err(|e| tls_error("TLS", e))?;
            conn.set_buffer_limit(Some(SEND_LIMIT));
            Ok(TlsStream::new(Connection::Server(conn), HELLO_READ))
        }
    }

    /// One TLS session over a non-blocking socket, driven by the router.
    pub(crate) struct TlsStream {
        conn: Connection,
        /// Ciphertext read from the socket that rustls has not taken yet.
        inbuf: Vec<u8>,
        start: usize,
        end: usize,
        /// Bytes may be waiting inside the session or `inbuf` although the
        /// socket is not readable: read again without waiting for `poll`.
        pending: bool,
    }

    impl TlsStream {
        fn new(conn: Connection, inbuf: usize) -> TlsStream {
            TlsStream {
                conn,
                inbuf: vec![0; inbuf],
                start: 0,
                end: 0,
                pending: false,
            }
        }

        /// Grows the ciphertext buffer to a link's size once the peer has
        /// proved itself, and has the loop read at once: what arrived with
        /// the hello is inside the session already.
        pub(crate) fn set_link_buffers(&mut self) {
            if self.inbuf.len() < LINK_READ {
                self.inbuf.resize(LINK_READ, 0);
            }
            self.pending = true;
        }

        /// Reads what the socket has, decrypts it and appends the plaintext
        /// to `rx`, until the socket would block or `budget` plaintext bytes
        /// were added. `Ok(false)` when the peer has closed the session.
        /// Handshake messages and alerts rustls owes the peer are written
        /// too.
        pub(crate) fn fill(
            &mut self,
            s: &mut TcpStream,
            rx: &mut BytesMut,
            budget: usize,
        ) -> io::Result<bool> {
            let open = self.fill_inner(s, rx, budget, false);
            // Even after an error: the alert tells the peer why.
            let flushed = self.flush(s);
            let open = open?;
            flushed?;
            Ok(open)
        }

        /// [`TlsStream::fill`] that appends at most `max` bytes (the rest stays
        /// in the session, and `pending` says so): a link reads into its
        /// decoder's buffer, which has room for that much.
        pub(crate) fn fill_at_most(
            &mut self,
            s: &mut TcpStream,
            rx: &mut BytesMut,
            max: usize,
        ) -> io::Result<bool> {
            let open = self.fill_inner(s, rx, max, true);
            let flushed = self.flush(s);
            let open = open?;
            flushed?;
            Ok(open)
        }

        fn fill_inner(
            &mut self,
            s: &mut TcpStream,
            rx: &mut BytesMut,
            budget: usize,
            at_most: bool,
        ) -> io::Result<bool> {
            let mut added = 0;
            self.pending = false;
            loop {
                // Decrypt whole records rustls holds and take their plaintext
                // (also what it read while the handshake ran).
                let state = self
                    .conn
                    .process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let available = state.plaintext_bytes_to_read();
                let mut k = if at_most {
                    available.min(budget.saturating_sub(added))
                } else {
                    available
                };
                let left_in_session = k < available;
                rx.reserve(k);
                while k > 0 {
                    // Straight from rustls's buffer: one copy, no zeroing first.
                    let mut reader = self.conn.reader();
                    let chunk = reader.fill_buf()?;
                    let n = chunk.len().min(k);
                    if n == 0 {
                        break;
                    }
                    rx.extend_from_slice(&chunk[..n]);
                    reader.consume(n);
                    k -= n;
                    added += n;
                }
                if left_in_session {
                    // The end of the stream, if it came, is seen once the rest
                    // of the plaintext has been taken.
                    self.pending = true;
                    return Ok(true);
                }
                if state.peer_has_closed() {
                    return Ok(false);
                }
                if added >= budget {
                    self.pending = true;
                    return Ok(true);
                }
                if self.start < self.end {
                    let mut src = &self.inbuf[self.start..self.end];
                    match self.conn.read_tls(&mut src)? {
                        // Only after the peer's close_notify, which the next
                        // pass reports.
                        0 => self.start = self.end,
                        n => self.start += n,
                    }
                    continue;
                }
                match s.read(&mut self.inbuf) {
                    Ok(0) => return Ok(false),
                    Ok(n) => (self.start, self.end) = (0, n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }

        /// Plaintext or ciphertext is buffered: the loop should read again
        /// without waiting for the socket.
        pub(crate) fn pending(&self) -> bool {
            self.pending
        }

        /// Writes encrypted records while the socket takes them.
        pub(crate) fn flush(&mut self, s: &mut TcpStream) -> io::Result<()> {
            while self.conn.wants_write() {
                match self.conn.write_tls(s) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        }

        /// Encrypts as much of `bufs` as the session's send buffer takes;
        /// the number of bytes taken (0 when it is full: flush first).
        pub(crate) fn write_plain(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            self.conn.writer().write_vectored(bufs)
        }

        /// Encrypted bytes wait for the socket.
        pub(crate) fn wants_write(&self) -> bool {
            self.conn.wants_write()
        }

        /// The handshake has finished (the peer's certificate was accepted).
        pub(crate) fn is_established(&self) -> bool {
            !self.conn.is_handshaking()
        }
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use std::io::{self, IoSlice};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use bytes::BytesMut;

    use super::imp::{acceptor_for_test, dialer_for_test, expect, Acceptor, Dialer, Expect};
    use super::{auto_identity, fingerprint, Identity, LinkTls, PeerCheck};
    use metampi::auth;
    use metampi_launch::router_spec::RouterSpec;

    const CTX: &str = "metampi router-router";

    /// A certificate (DER), its key (PKCS#8 DER), and its fingerprint.
    struct Cert {
        der: Vec<u8>,
        key: Vec<u8>,
        pin: [u8; 32],
    }

    fn self_signed(name: &str) -> Cert {
        let ck = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        Cert {
            der: ck.cert.der().to_vec(),
            key: ck.key_pair.serialize_der(),
            pin: fingerprint(ck.cert.der()),
        }
    }

    /// A CA (PEM) and a certificate it signed for `name`.
    fn ca_signed(name: &str) -> (String, Cert) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = p.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        let pin = fingerprint(cert.der());
        (
            ca.pem(),
            Cert {
                der: cert.der().to_vec(),
                key: key.serialize_der(),
                pin,
            },
        )
    }

    fn check(name: &str, ca: Option<&str>, pins: Vec<[u8; 32]>) -> Expect {
        let c = PeerCheck::Certificate {
            name: name.into(),
            ca: ca.map(str::to_string),
            pins,
        };
        expect(&c, &auth::Secret::random().unwrap()).unwrap()
    }

    /// Runs the dialling end (presenting `cc`, checking with `ck`) against
    /// the listening end (`sc`, `sk`); see [`run_ends`].
    fn run(
        cc: &Cert,
        ck: Expect,
        sc: &Cert,
        sk: Expect,
    ) -> (Result<(), String>, Result<(), String>) {
        let dialer = dialer_for_test(&cc.der, &cc.key, &ck).unwrap();
        let acceptor = acceptor_for_test(&sc.der, &sc.key, &sk).unwrap();
        run_ends(dialer, acceptor)
    }

    /// Runs a dialler against an acceptor as the router does: the listener
    /// non-blocking, driven by `fill`/`flush`, the job-secret handshake
    /// inside. On success, 3 MiB cross from the dialler and come back.
    /// Returns what each end saw.
    fn run_ends(dialer: Dialer, acceptor: Acceptor) -> (Result<(), String>, Result<(), String>) {
        let key = auth::Secret::random().unwrap();
        let hello = *b"0123456789abcdef";
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let k2 = key.clone();
        let client = std::thread::spawn(move || -> Result<(), String> {
            let mut s = TcpStream::connect(addr).unwrap();
            let mut t = dialer
                .connect(&mut s, &k2, CTX, &hello, Duration::from_secs(5))
                .map_err(|e| format!("{:?}: {}", e.kind(), super::describe_error(&e)))?;
            s.set_nonblocking(true).unwrap();
            let data: Vec<u8> = (0..3u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
            let mut off = 0;
            let mut back = BytesMut::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            while back.len() < data.len() {
                assert!(Instant::now() < deadline, "echo timed out");
                if off < data.len() {
                    let n = t.write_plain(&[IoSlice::new(&data[off..])]).unwrap();
                    // Encrypted records wait in a bounded buffer.
                    assert!(off > 0 || (n > 0 && n <= 256 << 10), "took {n}");
                    off += n;
                }
                t.flush(&mut s).unwrap();
                assert!(t.fill(&mut s, &mut back, 1 << 20).unwrap(), "closed");
                std::thread::sleep(Duration::from_micros(200));
            }
            assert!(back[..] == data[..], "echo differs");
            Ok(())
        });
        let (mut s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let server = (|| -> Result<(), String> {
            let mut t = acceptor.start().unwrap();
            let nonce = auth::nonce().unwrap();
            assert_eq!(t.write_plain(&[IoSlice::new(&nonce)]).unwrap(), nonce.len());
            let need = auth::NONCE + auth::TAG + hello.len();
            let mut got = BytesMut::new();
            let deadline = Instant::now() + Duration::from_secs(5);
            while got.len() < need {
                if Instant::now() > deadline {
                    return Err("no hello".into());
                }
                match t.fill(&mut s, &mut got, need) {
                    Ok(true) => {}
                    Ok(false) => return Err("closed".into()),
                    Err(e) => return Err(super::describe_error(&e)),
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(t.is_established());
            let h = auth::check(&key, CTX, &nonce, &got).map_err(|e| e.to_string())?;
            assert_eq!(h, hello);
            let proof = key.acceptor_tag(CTX, &got[..auth::NONCE], &nonce);
            assert_eq!(t.write_plain(&[IoSlice::new(&proof)]).unwrap(), proof.len());
            t.set_link_buffers();
            // Echo 3 MiB; the session's send buffer fills and drains.
            let (mut echoed, mut rx) = (0usize, BytesMut::new());
            let deadline = Instant::now() + Duration::from_secs(20);
            while echoed < 3 << 20 {
                assert!(Instant::now() < deadline, "echo timed out");
                t.flush(&mut s).map_err(|e| e.to_string())?;
                if t.pending() || rx.is_empty() {
                    assert!(t.fill(&mut s, &mut rx, 1 << 20).unwrap(), "closed");
                }
                if !rx.is_empty() {
                    let n = t.write_plain(&[IoSlice::new(&rx)]).unwrap();
                    let _ = rx.split_to(n);
                    echoed += n;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            while t.wants_write() {
                t.flush(&mut s).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        })();
        if server.is_err() {
            drop(s);
        }
        (client.join().unwrap(), server)
    }

    #[test]
    fn pinned_both_ways() {
        let (a, b) = (
            self_signed("router-0.metampi.invalid"),
            self_signed("router-1.metampi.invalid"),
        );
        let (c, s) = run(
            &a,
            check("router-1.metampi.invalid", None, vec![[0; 32], b.pin]),
            &b,
            check("router-0.metampi.invalid", None, vec![a.pin]),
        );
        c.unwrap();
        s.unwrap();
    }

    #[test]
    fn listener_refuses_an_unpinned_dialler() {
        let (a, b, x) = (self_signed("a"), self_signed("b"), self_signed("x"));
        let (c, s) = run(
            &x,
            check("b", None, vec![b.pin]),
            &b,
            check("a", None, vec![a.pin]),
        );
        let s = s.unwrap_err();
        assert!(s.contains("is not one pinned for this link"), "{s}");
        assert!(c.unwrap_err().starts_with("PermissionDenied"));
    }

    #[test]
    fn dialler_refuses_an_impostor_listener() {
        let (a, b, x) = (self_signed("a"), self_signed("b"), self_signed("x"));
        let (c, s) = run(
            &a,
            check("b", None, vec![b.pin]),
            &x,
            check("a", None, vec![a.pin]),
        );
        let c = c.unwrap_err();
        assert!(
            c.starts_with("PermissionDenied") && c.contains(&metampi_config::format_pin(&x.pin)),
            "{c}"
        );
        assert!(s.is_err());
    }

    #[test]
    fn ca_and_names() {
        let (ca_b, b) = ca_signed("site-b.example.org");
        let (ca_a, a) = ca_signed("site-a.example.org");
        let dir = std::env::temp_dir().join(format!("metampi-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (pa, pb) = (dir.join("a-ca.pem"), dir.join("b-ca.pem"));
        std::fs::write(&pa, ca_a).unwrap();
        std::fs::write(&pb, ca_b).unwrap();
        let (pa, pb) = (pa.to_str().unwrap(), pb.to_str().unwrap());
        // Right CAs and names, and a pin on top: in.
        let (c, s) = run(
            &a,
            check("site-b.example.org", Some(pb), vec![b.pin]),
            &b,
            check("site-a.example.org", Some(pa), vec![]),
        );
        c.unwrap();
        s.unwrap();
        // The dialler expects another name for the listener.
        let (c, _) = run(
            &a,
            check("site-c.example.org", Some(pb), vec![]),
            &b,
            check("site-a.example.org", Some(pa), vec![]),
        );
        assert!(c.unwrap_err().contains("not valid for name"));
        // The listener expects another name for the dialler: WebPKI alone
        // would accept any client the CA signed.
        let (_, s) = run(
            &a,
            check("site-b.example.org", Some(pb), vec![]),
            &b,
            check("site-c.example.org", Some(pa), vec![]),
        );
        let s = s.unwrap_err();
        assert!(s.contains("not valid for site-c.example.org"), "{s}");
        // A certificate from another CA.
        let (_, s) = run(
            &a,
            check("site-b.example.org", Some(pb), vec![]),
            &b,
            check("site-a.example.org", Some(pb), vec![]),
        );
        assert!(s.unwrap_err().contains("certificate"));
        // CA right but the pin is not this certificate's.
        let (c, _) = run(
            &a,
            check("site-b.example.org", Some(pb), vec![[9; 32]]),
            &b,
            check("site-a.example.org", Some(pa), vec![]),
        );
        assert!(c.unwrap_err().contains("not one pinned"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn auto_identities_are_derived_from_the_secret() {
        let (k1, k2) = (
            auth::Secret::random().unwrap(),
            auth::Secret::random().unwrap(),
        );
        let (cert, key, pin) = auto_identity(&k1, 3).unwrap();
        assert_eq!(pin, fingerprint(&cert));
        // The same everywhere it is made: a peer pins what this router presents.
        assert_eq!(auto_identity(&k1, 3).unwrap(), (cert, key, pin));
        assert_ne!(auto_identity(&k1, 4).unwrap().2, pin, "per router");
        assert_ne!(auto_identity(&k2, 3).unwrap().2, pin, "per job secret");
    }

    /// Two routers' specs as the launcher makes them for `a <-> b` with
    /// `TLS = auto`, set up with the job secrets each router holds.
    fn auto_ends(k0: &auth::Secret, k1: &auth::Secret) -> (Dialer, Acceptor) {
        let layout = metampi_config::parse_str(
            "t.cfg",
            "TLS = auto\nMETAHOST a { LAUNCH = local; }\nMETAHOST b { LAUNCH = local; }\n\
             PAIR a b 1\na <-> b\n",
        )
        .unwrap()
        .layout();
        let specs: Vec<RouterSpec> = metampi_launch::meta::try_router_specs(&layout)
            .unwrap()
            .iter()
            .map(|s| RouterSpec::parse(&s.to_line()).unwrap())
            .collect();
        assert_eq!(specs[0].identities, [Identity::Auto]);
        assert_eq!(
            specs[0].out[0].tls,
            Some(LinkTls {
                identity: 0,
                peer: PeerCheck::Auto { router: 1 }
            })
        );
        let (mut d0, _) = super::setup(&specs[0], k0).unwrap();
        let (_, mut a1) = super::setup(&specs[1], k1).unwrap();
        (d0.remove(0).unwrap(), a1.remove(0).unwrap())
    }

    #[test]
    fn auto_links_of_one_job_meet() {
        let k = auth::Secret::random().unwrap();
        let (d, a) = auto_ends(&k, &k);
        let (c, s) = run_ends(d, a);
        c.unwrap();
        s.unwrap();
    }

    #[test]
    fn auto_links_of_another_job_are_refused() {
        let (d, a) = auto_ends(
            &auth::Secret::random().unwrap(),
            &auth::Secret::random().unwrap(),
        );
        // The dialler checks first: the listener's certificate is not the
        // one its own secret derives for router 1.
        let (c, s) = run_ends(d, a);
        let c = c.unwrap_err();
        assert!(
            c.starts_with("PermissionDenied") && c.contains("not one pinned"),
            "{c}"
        );
        assert!(s.is_err());
    }

    #[test]
    fn user_files_are_read_with_clear_errors() {
        let dir = std::env::temp_dir().join(format!("metampi-tls-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["a".to_string()]).unwrap();
        std::fs::write(dir.join("a.pem"), ck.cert.pem()).unwrap();
        std::fs::write(dir.join("a.key"), ck.key_pair.serialize_pem()).unwrap();
        std::fs::write(dir.join("junk.pem"), "not a certificate\n").unwrap();
        let p = |f: &str| dir.join(f).display().to_string();
        let spec = |cert: &str, key: &str| RouterSpec {
            id: 0,
            vertical: "127.0.0.1:0".into(),
            listen: vec!["127.0.0.1:1".into()],
            listen_tls: vec![Some(LinkTls {
                identity: 0,
                peer: PeerCheck::Certificate {
                    name: "b".into(),
                    ca: None,
                    pins: vec![[1; 32]],
                },
            })],
            out: Vec::new(),
            identities: vec![Identity::Files {
                cert: p(cert),
                key: p(key),
            }],
            error: None,
            node: None,
        };
        let k = auth::Secret::random().unwrap();
        let (_, a) = super::setup(&spec("a.pem", "a.key"), &k).unwrap();
        assert!(a[0].is_some());
        assert!(dir.join("a.key").exists(), "a user's key stays where it is");
        let e = super::setup(&spec("missing.pem", "a.key"), &k)
            .err()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(
            e.to_string().contains("cannot read the TLS certificate"),
            "{e}"
        );
        let e = super::setup(&spec("junk.pem", "a.key"), &k).err().unwrap();
        assert!(e.to_string().contains("no CERTIFICATE"), "{e}");
        let e = super::setup(&spec("a.pem", "a.pem"), &k).err().unwrap();
        assert!(e.to_string().contains("no usable private key"), "{e}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// What the launcher puts in the router specs (`meta::router_specs`).
/// The build without the `tls` feature: a spec that asks for TLS is refused,
/// and the TLS types have no values, so code that handles them is never run.
#[cfg(not(feature = "tls"))]
mod off {
    use std::io::{self, IoSlice};
    use std::net::TcpStream;

    use bytes::BytesMut;

    use metampi::auth;
    use metampi_launch::router_spec::RouterSpec;

    #[derive(Clone)]
    pub(crate) enum Dialer {}
    #[derive(Clone)]
    pub(crate) enum Acceptor {}
    pub(crate) enum TlsStream {}

    pub(crate) fn setup(spec: &RouterSpec, _: &auth::Secret) -> io::Result<super::Ends> {
        if spec.out.iter().any(|o| o.tls.is_some()) || spec.listen_tls.iter().any(Option::is_some) {
            return Err(super::not_built());
        }
        Ok((vec![None; spec.out.len()], vec![None; spec.listen.len()]))
    }

    pub(crate) fn describe_error(e: &io::Error) -> String {
        e.to_string()
    }

    impl Dialer {
        pub(crate) fn connect(
            &self,
            _: &mut TcpStream,
            _: &auth::Secret,
            _: &str,
            _: &[u8],
            _: std::time::Duration,
        ) -> io::Result<TlsStream> {
            match *self {}
        }
    }

    impl Acceptor {
        pub(crate) fn start(&self) -> io::Result<TlsStream> {
            match *self {}
        }
    }

    impl TlsStream {
        pub(crate) fn set_link_buffers(&mut self) {
            match *self {}
        }
        pub(crate) fn fill(
            &mut self,
            _: &mut TcpStream,
            _: &mut BytesMut,
            _: usize,
        ) -> io::Result<bool> {
            match *self {}
        }
        pub(crate) fn fill_at_most(
            &mut self,
            _: &mut TcpStream,
            _: &mut BytesMut,
            _: usize,
        ) -> io::Result<bool> {
            match *self {}
        }
        pub(crate) fn pending(&self) -> bool {
            match *self {}
        }
        pub(crate) fn flush(&mut self, _: &mut TcpStream) -> io::Result<()> {
            match *self {}
        }
        pub(crate) fn write_plain(&mut self, _: &[IoSlice<'_>]) -> io::Result<usize> {
            match *self {}
        }
        pub(crate) fn wants_write(&self) -> bool {
            match *self {}
        }
        pub(crate) fn is_established(&self) -> bool {
            match *self {}
        }
    }
}
