//! `tcp-hello`: a tiny TCP server and client that the harness's e2e tests run inside pods,
//! so networking tests need no host tool (`nc` differs between distributions).
//!
//! - `tcp-hello serve ADDR MESSAGE`: listens on `ADDR` (`IP:PORT`) and answers every
//!   connection with `MESSAGE` and a newline, then closes it. Prints `listening on ADDR`.
//! - `tcp-hello get ADDR`: connects, prints what the server sent, exits 0; exits 1 (with
//!   the error on stderr) if the connection fails or the server sends nothing.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["serve", addr, message] => serve(addr, message),
        ["get", addr] => get(addr),
        _ => {
            eprintln!("usage: tcp-hello serve IP:PORT MESSAGE | tcp-hello get IP:PORT");
            ExitCode::from(2)
        }
    }
}

fn serve(addr: &str, message: &str) -> ExitCode {
    let listener = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("tcp-hello: binding {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("listening on {addr}");
    for conn in listener.incoming() {
        match conn {
            Ok(mut s) => {
                let _ = writeln!(s, "{message}");
            }
            Err(e) => eprintln!("tcp-hello: accept: {e}"),
        }
    }
    ExitCode::SUCCESS
}

fn get(addr: &str) -> ExitCode {
    let mut stream = match TcpStream::connect(addr) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tcp-hello: connecting to {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut reply = String::new();
    match stream.read_to_string(&mut reply) {
        Ok(_) if !reply.is_empty() => {
            print!("{reply}");
            ExitCode::SUCCESS
        }
        Ok(_) => {
            eprintln!("tcp-hello: {addr} closed the connection without a reply");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tcp-hello: reading from {addr}: {e}");
            ExitCode::FAILURE
        }
    }
}
