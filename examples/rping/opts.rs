//! The command line, parsed as the C program's `getopt` loop parses it:
//! same options, same messages, same exit codes, same quirks.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

use crate::out;

/// The C program's `getopt` string: `-t` takes an argument but has no case
/// (it leads to the usage text).
const OPTSTRING: &str = "a:I:Pp:C:S:t:scvVdq";

/// `EINVAL`: the exit status of usage errors.
const EINVAL: i32 = 22;

/// `RPING_MIN_BUFSIZE`: `sizeof(stringify(INT_MAX)) + sizeof(RPING_MSG_FMT)`
/// (the macro name is not expanded, so 8 + 15).
pub const MIN_SIZE: i32 = 23;
/// `RPING_BUFSIZE - 1`; the message claims 65536 is allowed.
pub const MAX_SIZE: i32 = 65535;

/// What the options say.
#[derive(Debug, Clone)]
pub struct Opts {
    /// `-s` (true) or `-c` (false).
    pub server: bool,
    /// `-P`.
    pub persistent: bool,
    /// `-a`: the address to bind (server) or connect to (client); the C
    /// default is the IPv4 wildcard. The port is [`Opts::port`].
    pub addr: SocketAddr,
    /// `-I`: the client's source address.
    pub src: Option<SocketAddr>,
    /// `-p` (default 7174).
    pub port: u16,
    /// `-C` (client; 0: ping forever).
    pub count: i32,
    /// `-S` (default 64).
    pub size: i32,
    /// `-v`.
    pub verbose: bool,
    /// `-V` (client).
    pub validate: bool,
    /// `-q`: create and move the QP itself.
    pub self_create_qp: bool,
}

impl Opts {
    /// The address with the port set, as the C program sets `sin_port`.
    pub fn addr_with_port(&self) -> SocketAddr {
        let mut a = self.addr;
        a.set_port(self.port);
        a
    }
}

/// The usage text (stdout), with the program name the C program gives
/// (`basename("rping")`).
pub fn usage() {
    for line in [
        "rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]",
        "rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]",
        "\t-c\t\tclient side",
        "\t-I\t\tSource address to bind to for client.",
        "\t-s\t\tserver side.  To bind to any address with IPv6 use -a ::0",
        "\t-v\t\tdisplay ping data to stdout",
        "\t-V\t\tvalidate ping data",
        "\t-d\t\tdebug printfs",
        "\t-S size \tping data size",
        "\t-C count\tping count times",
        "\t-a addr\t\taddress",
        "\t-p port\t\tport",
        "\t-P\t\tpersistent server mode allowing multiple connections",
        "\t-q\t\tuse self-created, self-modified QP",
    ] {
        outln!("{line}");
    }
}

/// One result of `getopt`: an option with its argument, or `'?'` (an
/// unknown option or a missing argument; `opterr = 0`, so getopt itself
/// prints nothing).
enum Got {
    Opt(char, Option<String>),
    Bad,
}

/// glibc's `getopt` on short options: GNU argument permutation (options
/// may follow other arguments, which are ignored; with `POSIXLY_CORRECT`
/// set, the first non-option ends the options), grouped flags (`-vV`),
/// arguments attached (`-C10`) or separate (`-C 10`, taken even if it
/// starts with `-`), `--` ending the options. Stops at the first `Bad`.
fn getopt(args: &[String]) -> Vec<Got> {
    let posix = std::env::var_os("POSIXLY_CORRECT").is_some();
    let mut found = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            break;
        }
        if arg.len() < 2 || !arg.starts_with('-') {
            if posix {
                break;
            }
            continue;
        }
        let chars: Vec<char> = arg[1..].chars().collect();
        let mut k = 0;
        while k < chars.len() {
            let c = chars[k];
            k += 1;
            let spec = match OPTSTRING.find(c) {
                Some(pos) if c != ':' => pos,
                _ => {
                    found.push(Got::Bad);
                    return found;
                }
            };
            if !OPTSTRING[spec + c.len_utf8()..].starts_with(':') {
                found.push(Got::Opt(c, None));
                continue;
            }
            let rest: String = chars[k..].iter().collect();
            let value = if !rest.is_empty() {
                rest
            } else if i < args.len() {
                i += 1;
                args[i - 1].clone()
            } else {
                found.push(Got::Bad);
                return found;
            };
            found.push(Got::Opt(c, Some(value)));
            break;
        }
    }
    found
}

/// C's `atoi`: leading white space, a sign, decimal digits up to the first
/// other character (none: 0); the `long` that `strtol` gives (saturated)
/// cut to an `int`, as glibc's `atoi` does.
pub fn atoi(s: &str) -> i32 {
    let t = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    // strtol's result: the value, saturated at LONG_MIN and LONG_MAX.
    let limit = if neg {
        -i128::from(i64::MIN)
    } else {
        i128::from(i64::MAX)
    };
    let mut v: i128 = 0;
    for b in digits.bytes().take_while(u8::is_ascii_digit) {
        v = (v * 10 + i128::from(b - b'0')).min(limit);
    }
    let v = (if neg { -v } else { v }) as i64;
    v as i32
}

/// `get_addr`: the first address `getaddrinfo(name)` gives. On failure
/// prints the C program's line (stdout) and returns the `EAI_*` code.
fn get_addr(name: &str) -> Result<SocketAddr, i32> {
    match (name, 0u16).to_socket_addrs() {
        Ok(mut addrs) => addrs.next().ok_or(-1),
        Err(e) => {
            // std reports a failed getaddrinfo as "failed to lookup address
            // information: <gai_strerror>", and EAI_SYSTEM as the errno.
            let (text, code) = if e.raw_os_error().is_some() {
                ("System error".to_owned(), -11)
            } else {
                let text = crate::gai::text_in(&e);
                let code = crate::gai::code_of(&text).unwrap_or(-2);
                (text, code)
            };
            outln!("getaddrinfo failed ({text}) - invalid hostname or IP address");
            Err(code)
        }
    }
}

/// Parses the arguments (without the program name). `Err(status)`: the
/// program ends with that status (the messages are printed).
pub fn parse(args: &[String]) -> Result<Opts, i32> {
    let mut o = Opts {
        server: false,
        persistent: false,
        addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        src: None,
        port: 7174,
        count: 0,
        size: 64,
        verbose: false,
        validate: false,
        self_create_qp: false,
    };
    let mut role = None;
    // As in C, `ret` is overwritten by every -a and -I: a later good address
    // clears an earlier error (of any option).
    let mut ret = 0;
    for got in getopt(args) {
        let (c, arg) = match got {
            Got::Opt(c, arg) if c != 't' => (c, arg.unwrap_or_default()),
            _ => {
                usage();
                return Err(EINVAL);
            }
        };
        match c {
            'a' => match get_addr(&arg) {
                Ok(a) => {
                    o.addr = a;
                    ret = 0;
                }
                Err(code) => ret = code,
            },
            'I' => match get_addr(&arg) {
                Ok(a) => {
                    o.src = Some(a);
                    ret = 0;
                }
                Err(code) => ret = code,
            },
            'P' => o.persistent = true,
            'p' => {
                let v = atoi(&arg);
                o.port = v as u16;
                debug_log!("port {v}");
            }
            's' => {
                role = Some(true);
                debug_log!("server");
            }
            'c' => {
                role = Some(false);
                debug_log!("client");
            }
            'S' => {
                o.size = atoi(&arg);
                if o.size < MIN_SIZE || o.size > MAX_SIZE {
                    eprintln!(
                        "Invalid size {} (valid range is {MIN_SIZE} to {})",
                        o.size,
                        MAX_SIZE + 1
                    );
                    ret = EINVAL;
                } else {
                    debug_log!("size {}", o.size);
                }
            }
            'C' => {
                o.count = atoi(&arg);
                if o.count < 0 {
                    eprintln!("Invalid count {}", o.count);
                    ret = EINVAL;
                } else {
                    debug_log!("count {}", o.count);
                }
            }
            'v' => {
                o.verbose = true;
                debug_log!("verbose");
            }
            'V' => {
                o.validate = true;
                debug_log!("validate data");
            }
            'd' => out::set_debug(),
            'q' => o.self_create_qp = true,
            _ => unreachable!("every option of OPTSTRING has a case"),
        }
    }
    if ret != 0 {
        return Err(ret);
    }
    match role {
        Some(server) => {
            o.server = server;
            Ok(o)
        }
        None => {
            usage();
            Err(EINVAL)
        }
    }
}
