//! Debian's `docker-registry` (the CNCF distribution registry) on a free loopback port, with
//! its storage in a temporary folder, for the tests that pull and push.

use super::s;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// Installs the registry (and `htpasswd`) with apt when they are missing; fails, never skips.
pub fn ensure_installed() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        super::apt_install(
            &["docker-registry", "apache2-utils"],
            &[REGISTRY_BIN, "/usr/bin/htpasswd"],
            "the registry tests",
        )
    });
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `docker-registry` serving from a temporary folder; killed on drop.
pub struct Registry {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub host: String,
}

impl Registry {
    pub fn start() -> Registry {
        Registry::start_with(None)
    }

    /// With `login`, the registry asks for HTTP basic auth (htpasswd, bcrypt).
    pub fn start_with(login: Option<(&str, &str)>) -> Registry {
        ensure_installed();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut auth = String::new();
        if let Some((user, password)) = login {
            let htpasswd = dir.path().join("htpasswd");
            let st = Command::new("htpasswd")
                .args(["-Bbc", s(&htpasswd), user, password])
                .output()
                .unwrap();
            assert!(st.status.success(), "{st:?}");
            auth = format!(
                "auth:\n  htpasswd:\n    realm: zimage-test\n    path: {}\n",
                htpasswd.display()
            );
        }
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new(REGISTRY_BIN)
            .args(["serve", s(&config)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry starts");
        let host = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&host).is_err() {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry { child, dir, host }
    }

    /// The file the registry keeps a blob in.
    pub fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    pub fn get(&self, path: &str) -> reqwest::blocking::Response {
        reqwest::blocking::Client::new()
            .get(format!("http://{}{path}", self.host))
            .header(
                "Accept",
                "application/vnd.docker.distribution.manifest.v2+json",
            )
            .send()
            .unwrap()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
