//! Optional CURVE security (libzmq's CurveZMQ) for the EC control channel and the P2P
//! transport. The reference runs both unauthenticated (NULL); with CURVE a server only
//! talks to clients that know its public key, and every frame is encrypted.
//!
//! libzmq supports CURVE only when built with libsodium. The `zmq` crate's bundled
//! libzmq is not, so the `curve` cargo feature is built against the system library
//! (Debian: `libzmq3-dev`), see `docs/hostile-input.md`. [`check_support`] turns a build
//! without it into a clear error instead of a socket that silently stays NULL.
//!
//! Keys are Z85 text (40 characters for 32 bytes). A key file holds the public key on its
//! first line and the secret key on its second, as `ctlplane curve-keygen` writes it.

use std::path::Path;
use thiserror::Error;

/// Why keys could not be loaded or applied.
#[derive(Debug, Error)]
pub enum CurveError {
    #[error("this build's libzmq has no CURVE support: build with `--features curve` against the system libzmq")]
    Unsupported,
    #[error("cannot read the CURVE key file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} is not a Z85 CURVE key (40 characters)")]
    BadKey { what: String },
    #[error("cannot set CURVE options on a socket")]
    Socket(#[source] zmq::Error),
}

/// A CURVE key pair, raw 32-byte keys.
#[derive(Clone)]
pub struct KeyPair {
    pub public: [u8; 32],
    pub secret: [u8; 32],
}

impl std::fmt::Debug for KeyPair {
    /// Never prints the secret key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair").field("public", &z85(&self.public)).finish_non_exhaustive()
    }
}

impl KeyPair {
    /// A fresh key pair from libzmq (libsodium's CSPRNG).
    pub fn generate() -> Result<Self, CurveError> {
        check_support()?;
        let pair = zmq::CurveKeyPair::new().map_err(|_| CurveError::Unsupported)?;
        Ok(KeyPair { public: pair.public_key, secret: pair.secret_key })
    }

    /// Reads a key file: the Z85 public key, then the Z85 secret key, one per line.
    pub fn load(path: &Path) -> Result<Self, CurveError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| CurveError::Read { path: path.display().to_string(), source })?;
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let what = |line: &str| format!("line {line} of {}", path.display());
        let public = parse_key(lines.next().unwrap_or(""), &what("1"))?;
        let secret = parse_key(lines.next().unwrap_or(""), &what("2"))?;
        Ok(KeyPair { public, secret })
    }

    /// The key file text [`Self::load`] reads.
    pub fn to_file_text(&self) -> String {
        format!("{}\n{}\n", z85(&self.public), z85(&self.secret))
    }

    /// The public key as Z85, what clients pass as the server key.
    pub fn public_z85(&self) -> String {
        z85(&self.public)
    }
}

/// A Z85 key given on the command line or in a file.
pub fn parse_key(text: &str, what: &str) -> Result<[u8; 32], CurveError> {
    let bad = || CurveError::BadKey { what: what.to_string() };
    if text.len() != 40 {
        return Err(bad());
    }
    let raw = zmq::z85_decode(text).map_err(|_| bad())?;
    <[u8; 32]>::try_from(raw.as_slice()).map_err(|_| bad())
}

fn z85(key: &[u8; 32]) -> String {
    // 32 bytes is a multiple of 4: encoding cannot fail.
    zmq::z85_encode(key).unwrap_or_default()
}

/// Errs unless the linked libzmq can do CURVE.
pub fn check_support() -> Result<(), CurveError> {
    if zmq::has("curve") == Some(true) {
        Ok(())
    } else {
        Err(CurveError::Unsupported)
    }
}

/// The server side of a socket: clients must know `keys.public`.
#[derive(Clone, Debug)]
pub struct CurveServer {
    pub keys: KeyPair,
}

impl CurveServer {
    /// Makes `socket` a CURVE server; call before `bind`.
    pub fn apply(&self, socket: &zmq::Socket) -> Result<(), CurveError> {
        check_support()?;
        socket.set_curve_server(true).map_err(CurveError::Socket)?;
        socket.set_curve_secretkey(&self.keys.secret).map_err(CurveError::Socket)
    }
}

/// The client side of a socket: the server's public key and our own key pair.
#[derive(Clone, Debug)]
pub struct CurveClient {
    pub server_key: [u8; 32],
    pub keys: KeyPair,
}

impl CurveClient {
    /// Makes `socket` a CURVE client of `server_key`; call before `connect`.
    pub fn apply(&self, socket: &zmq::Socket) -> Result<(), CurveError> {
        check_support()?;
        socket.set_curve_serverkey(&self.server_key).map_err(CurveError::Socket)?;
        socket.set_curve_publickey(&self.keys.public).map_err(CurveError::Socket)?;
        socket.set_curve_secretkey(&self.keys.secret).map_err(CurveError::Socket)
    }
}

/// `zmq::Error` for a socket option that could not be applied (the drivers' socket
/// helpers speak `zmq::Result`).
pub(crate) fn as_zmq(error: CurveError) -> zmq::Error {
    match error {
        CurveError::Socket(e) => e,
        _ => zmq::Error::ENOTSUP,
    }
}
