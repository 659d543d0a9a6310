//! The command line of the echo examples, `async_echo` (tokio) and
//! `sync_echo` (one thread, no tokio): the same options for the server and
//! the client, so that their harnesses drive both alike.

use std::net::{IpAddr, Ipv4Addr};

type Res<T> = Result<T, String>;

/// The options: a server when `host` is `None`, else a client of `host`.
#[derive(Debug, Clone)]
pub struct Opts {
    pub host: Option<String>,
    pub port: u16,
    pub bind: IpAddr,
    pub connections: usize,
    pub iters: u32,
    pub size: usize,
    pub exit_after: Option<u64>,
}

/// The usage text of program `prog`.
pub fn usage(prog: &str) -> String {
    format!(
        "usage: {prog} [-p PORT] [-b ADDR] [-s SIZE] [-x N]        (server)\n       {prog} [-p PORT] [-c CONNECTIONS] [-n ITERS] [-s SIZE] HOST   (client)"
    )
}

/// Parses program `prog`'s arguments (without its name).
pub fn parse(prog: &str, args: &[String]) -> Res<Opts> {
    let usage = usage(prog);
    let mut o = Opts {
        host: None,
        port: 7472,
        bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        connections: 100,
        iters: 100,
        size: 64,
        exit_after: None,
    };
    let num_of = |v: &str, what: &str| format!("bad {what}: {v:?}\n{usage}");
    fn num<T: std::str::FromStr>(
        v: &str,
        what: &str,
        bad: impl Fn(&str, &str) -> String,
    ) -> Res<T> {
        v.parse().map_err(|_| bad(v, what))
    }
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (a.as_str(), None),
        };
        let mut value = |what: &str| -> Res<String> {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or(format!("{what} needs a value\n{usage}"))
        };
        match name {
            "-p" | "--port" => o.port = num(&value(name)?, "port", num_of)?,
            "-b" | "--bind" => o.bind = num(&value(name)?, "address", num_of)?,
            "-c" | "--connections" => {
                o.connections = num(&value(name)?, "connection count", num_of)?
            }
            "-n" | "--iters" => o.iters = num(&value(name)?, "iteration count", num_of)?,
            "-s" | "--size" => o.size = num(&value(name)?, "size", num_of)?,
            "-x" | "--exit-after" => {
                o.exit_after = Some(num(&value(name)?, "connection count", num_of)?)
            }
            "-h" | "--help" => return Err(usage),
            s if s.starts_with('-') => return Err(format!("unknown option {s}\n{usage}")),
            host if o.host.is_none() => o.host = Some(host.to_owned()),
            extra => return Err(format!("unexpected argument {extra:?}\n{usage}")),
        }
    }
    if !(8..=4096).contains(&o.size) {
        return Err(format!("size {} is outside 8..=4096\n{usage}", o.size));
    }
    if o.connections == 0 || o.iters == 0 {
        return Err(format!("-c and -n must be at least 1\n{usage}"));
    }
    Ok(o)
}
