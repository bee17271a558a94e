//! CURVE flags of the commands. They exist only in builds with the `curve` feature (which
//! link the system libzmq); other builds take none and run with NULL security, as the
//! reference.

use clap::Args;
use ctlplane_zmq::{ControlClient, CurveClient, CurveServer};
use std::error::Error;

#[cfg(feature = "curve")]
mod enabled {
    use super::*;
    use ctlplane_zmq::curve::parse_key;
    use ctlplane_zmq::KeyPair;
    use std::io::Write;
    use std::path::PathBuf;

    /// A server's key: `--curve-secret-key-file`.
    #[derive(Args)]
    pub struct ServerCurve {
        /// Serve with CURVE: the server's key file (Z85 public key, then secret key, one
        /// per line, as `ctlplane curve-keygen` writes it). Clients need its public key.
        #[arg(long)]
        curve_secret_key_file: Option<PathBuf>,
    }

    impl ServerCurve {
        pub fn server(&self) -> Result<Option<CurveServer>, Box<dyn Error>> {
            let Some(path) = &self.curve_secret_key_file else { return Ok(None) };
            Ok(Some(CurveServer { keys: KeyPair::load(path)? }))
        }
    }

    /// A client's keys: `--curve-server-key` and an optional `--curve-secret-key-file`.
    #[derive(Args)]
    pub struct ClientCurve {
        /// Talk CURVE to servers with this Z85 public key.
        #[arg(long)]
        curve_server_key: Option<String>,
        /// The client's own key file (a fresh key pair when absent).
        #[arg(long, requires = "curve_server_key")]
        curve_secret_key_file: Option<PathBuf>,
    }

    impl ClientCurve {
        pub fn client(&self) -> Result<Option<CurveClient>, Box<dyn Error>> {
            let Some(server_key) = &self.curve_server_key else { return Ok(None) };
            let server_key = parse_key(server_key, "--curve-server-key")?;
            let keys = match &self.curve_secret_key_file {
                Some(path) => KeyPair::load(path)?,
                None => KeyPair::generate()?,
            };
            Ok(Some(CurveClient { server_key, keys }))
        }

        pub fn apply(&self, client: ControlClient) -> Result<ControlClient, Box<dyn Error>> {
            Ok(match self.client()? {
                Some(curve) => client.with_curve(curve),
                None => client,
            })
        }
    }

    /// A P2P node: its own key file (ROUTER server key, DEALER client key) and the
    /// peers' ROUTER public key.
    #[derive(Args)]
    pub struct PeerCurve {
        /// This node's key file; with --curve-server-key, turns CURVE on.
        #[arg(long, requires = "curve_server_key")]
        curve_secret_key_file: Option<PathBuf>,
        /// The Z85 public key of the peers' ROUTERs.
        #[arg(long, requires = "curve_secret_key_file")]
        curve_server_key: Option<String>,
    }

    impl PeerCurve {
        pub fn peer(&self) -> Result<Option<CurveClient>, Box<dyn Error>> {
            let (Some(path), Some(server_key)) = (&self.curve_secret_key_file, &self.curve_server_key) else {
                return Ok(None);
            };
            Ok(Some(CurveClient {
                server_key: parse_key(server_key, "--curve-server-key")?,
                keys: KeyPair::load(path)?,
            }))
        }
    }

    /// `ctlplane curve-keygen`: write a fresh key pair to a file, print its public key.
    #[derive(Args)]
    pub struct KeygenArgs {
        /// Where to write the key file (created with mode 0600; must not exist).
        #[arg(long)]
        out: PathBuf,
    }

    pub fn keygen(args: KeygenArgs) -> Result<std::process::ExitCode, Box<dyn Error>> {
        use std::os::unix::fs::OpenOptionsExt;
        let keys = KeyPair::generate()?;
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&args.out)?;
        file.write_all(keys.to_file_text().as_bytes())?;
        println!("{}", keys.public_z85());
        Ok(std::process::ExitCode::SUCCESS)
    }
}

#[cfg(feature = "curve")]
pub use enabled::*;

#[cfg(not(feature = "curve"))]
mod disabled {
    use super::*;

    /// No CURVE in this build.
    #[derive(Args)]
    pub struct ServerCurve {}

    impl ServerCurve {
        pub fn server(&self) -> Result<Option<CurveServer>, Box<dyn Error>> {
            Ok(None)
        }
    }

    /// No CURVE in this build.
    #[derive(Args)]
    pub struct ClientCurve {}

    impl ClientCurve {
        pub fn apply(&self, client: ControlClient) -> Result<ControlClient, Box<dyn Error>> {
            Ok(client)
        }
    }

    /// No CURVE in this build.
    #[derive(Args)]
    pub struct PeerCurve {}

    impl PeerCurve {
        pub fn peer(&self) -> Result<Option<CurveClient>, Box<dyn Error>> {
            Ok(None)
        }
    }
}

#[cfg(not(feature = "curve"))]
pub use disabled::*;
