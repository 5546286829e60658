//! How Tandem's processes reach each other and prove who they are: the wall clock of
//! credentials, TLS and the cluster CA, sockets and connections, credentials and the identity
//! agent, and endpoint discovery. The messages they carry are `tandem-proto`'s; this crate
//! does not depend on it.
//!
//! # Layers
//!
//! The modules form one line, each using only those to its left:
//!
//! ```text
//! clock -> tls (tls::ca) -> net (net::conn) -> auth (auth::*) -> endpoint
//! ```
//!
//! - [`clock`]: [`clock::unix_now`], the Unix seconds that the CA dates certificates by and
//!   credentials carry.
//! - [`tls`]: certificates, rustls configurations, the flags that choose TLS or plain text
//!   ([`tls::Options`] and what they make, [`tls::ServerSecurity`] and
//!   [`tls::ClientSecurity`]), and the cluster CA ([`tls::ca`]).
//! - [`net`]: every TCP and Unix socket, listeners with their TLS handshakes, `connect` and
//!   `connect_verifying`, the peer a server learns from the kernel, and the client call
//!   timeout.
//! - [`auth`]: the cluster key, credentials, the replay cache, the identity agent's protocol
//!   and the tonic interceptors.
//! - [`endpoint`]: discovery of the controller (environment, cluster file), and connections
//!   that carry a credential ([`endpoint::AuthChannel`], [`endpoint::connect_to_node`]).
//!
//! A unit test (`layers_only_look_left` below) reads every module's source and fails on a
//! `crate::` path that points right. Documentation may still link anywhere.

pub mod clock;

pub mod tls;

pub mod net;

pub mod auth;

pub mod endpoint;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// The crate's layers, left to right: a module may name only the ones before it.
    const LAYERS: [&str; 5] = ["clock", "tls", "net", "auth", "endpoint"];

    /// `LAYER.rs` and every file under `LAYER/`.
    fn files_of(src: &Path, layer: &str) -> Vec<PathBuf> {
        let mut files = vec![src.join(format!("{layer}.rs"))];
        let mut dirs = vec![src.join(layer)];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries {
                let path = e.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|x| x == "rs") {
                    files.push(path);
                }
            }
        }
        files
    }

    /// The crate modules a line of code names: `crate::X` and `crate::{X, Y::..}`.
    fn modules_named(line: &str) -> Vec<&str> {
        let ident = |s: &str| -> usize {
            s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(s.len())
        };
        let mut out = Vec::new();
        for (i, _) in line.match_indices("crate::") {
            let rest = &line[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // Only the top-level names of the group: `{a::{b, c}, d}` names a and d.
                let mut depth = 0;
                let mut start = true;
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => start = true,
                        c if start && depth == 0 && !c.is_whitespace() => {
                            start = false;
                            let name = &group[j..];
                            out.push(&name[..ident(name)]);
                        }
                        _ => {}
                    }
                }
            } else {
                out.push(&rest[..ident(rest)]);
            }
        }
        out
    }

    #[test]
    fn modules_named_reads_paths_and_groups() {
        assert_eq!(
            modules_named("use crate::net::{LocalPeer, PeerInfo};"),
            ["net"]
        );
        assert_eq!(
            modules_named("use crate::{tls::X, auth::{a, b}, endpoint};"),
            ["tls", "auth", "endpoint"]
        );
        assert_eq!(
            modules_named("let d = crate::clock::unix_now() + crate::tls::f();"),
            ["clock", "tls"]
        );
        assert!(modules_named("use super::*;").is_empty());
    }

    #[test]
    fn layers_only_look_left() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut wrong = Vec::new();
        for (i, layer) in LAYERS.iter().enumerate() {
            let right = &LAYERS[i + 1..];
            let files = files_of(&src, layer);
            assert!(files[0].is_file(), "{} is missing", files[0].display());
            for file in files {
                let text = std::fs::read_to_string(&file).unwrap();
                for (n, line) in text.lines().enumerate() {
                    let code = line.trim_start();
                    if code.starts_with("//") {
                        continue;
                    }
                    for m in modules_named(code) {
                        if right.contains(&m) {
                            wrong.push(format!(
                                "{}:{}: {layer} names crate::{m}, a layer to its right: {}",
                                file.display(),
                                n + 1,
                                code
                            ));
                        }
                    }
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "the layers are {LAYERS:?}, each using only those to its left:\n{}",
            wrong.join("\n")
        );
    }

    #[test]
    fn every_module_is_a_layer() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for e in std::fs::read_dir(&src).unwrap() {
            let path = e.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap();
            assert!(
                name == "lib" || LAYERS.contains(&name),
                "{} is in no layer: add it to LAYERS in lib.rs (and to the crate docs)",
                path.display()
            );
        }
    }
}
