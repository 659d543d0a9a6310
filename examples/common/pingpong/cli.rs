//! The pingpong examples' command line, as the C programs parse theirs:
//! `getopt_long` with their option tables ([`OptDef`], [`Program`]), C's
//! number syntax, the usage text, the parsed [`Config`], and
//! [`main_with`], which runs a program's body on it and exits as C does.

use std::process::ExitCode;

use rdma_verbs::Mtu;

use super::Res;

/// One option, as in a `struct option` table plus the short option string.
#[derive(Debug, Clone, Copy)]
pub struct OptDef {
    /// The short form (`-p`).
    pub short: char,
    /// The long form without dashes (`port`).
    pub long: &'static str,
    /// Whether it takes an argument.
    pub has_arg: bool,
}

/// Shorthand for an [`OptDef`].
pub const fn opt(short: char, long: &'static str, has_arg: bool) -> OptDef {
    OptDef {
        short,
        long,
        has_arg,
    }
}

/// A program: its options, its usage text and its defaults.
pub struct Program {
    /// The options it accepts.
    pub opts: &'static [OptDef],
    /// The option lines of its usage text.
    pub help: &'static [&'static str],
    /// Default message size.
    pub default_size: usize,
}

/// The settings every pingpong program understands.
#[derive(Debug, Clone)]
pub struct Config {
    /// The server to connect to; `None`: be the server.
    pub servername: Option<String>,
    /// TCP port (`-p`, default 18515).
    pub port: u16,
    /// Device name (`-d`; default: the first device).
    pub ib_devname: Option<String>,
    /// Device port (`-i`, default 1).
    pub ib_port: u8,
    /// Message size (`-s`).
    pub size: usize,
    /// Path MTU (`-m`, default 1024).
    pub mtu: Mtu,
    /// Receives posted at a time (`-r`, default 500).
    pub rx_depth: usize,
    /// Exchanges (`-n`, default 1000).
    pub iters: u32,
    /// Service level (`-l`, default 0).
    pub sl: u8,
    /// Sleep on CQ events (`-e`).
    pub use_event: bool,
    /// Local GID index (`-g`; `None` when not given or negative).
    pub gidx: Option<u8>,
    /// Validate received buffers (`-c`).
    pub validate: bool,
    /// Number of QPs (`-q`, srq_pingpong, default 16).
    pub num_qp: usize,
    /// Post sends through the `ibv_wr_*` API (`-N`): the QPs are created
    /// with `ibv_create_qp_ex` and `IBV_QP_EX_WITH_SEND`.
    pub new_send: bool,
    /// Completion timestamps (`-t`, rc_pingpong).
    pub timestamps: bool,
    /// On-demand paging for the buffers (`-o`, `-P`, rc_pingpong).
    pub odp: Odp,
    /// Other flag options given (`-o`, `-t`, ...), each once, in order.
    pub flags: Vec<char>,
}

/// Whether the buffers are registered on demand (`IBV_ACCESS_ON_DEMAND`,
/// `-o`), and then prefetched with `ibv_advise_mr` (`-P`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Odp {
    /// Pinned at registration, as by default.
    #[default]
    Off,
    /// On demand; `prefetch`: fault the pages in before the first exchange.
    On {
        /// `-P`.
        prefetch: bool,
    },
}

/// The options found, in order, with their arguments, and the positional
/// arguments.
pub type ParsedArgs = (Vec<(char, Option<String>)>, Vec<String>);

/// `getopt_long` with GNU argument permutation: options may come before or
/// after the positional arguments; `-p 1`, `-p1`, `--port=1`, `--port 1`,
/// grouped flags (`-ec`), unambiguous long-name prefixes and `--` work as
/// there. Returns the options in order and the positional arguments.
pub fn getopt_long(argv0: &str, args: &[String], defs: &[OptDef]) -> Result<ParsedArgs, String> {
    let mut found = Vec::new();
    let mut positional = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            positional.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(body) = arg.strip_prefix("--") {
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (body, None),
            };
            let def = find_long(argv0, defs, name)?;
            if def.has_arg {
                let value = match value {
                    Some(v) => v,
                    None if i < args.len() => {
                        i += 1;
                        args[i - 1].clone()
                    }
                    None => {
                        return Err(format!(
                            "{argv0}: option '--{}' requires an argument",
                            def.long
                        ))
                    }
                };
                found.push((def.short, Some(value)));
            } else if value.is_some() {
                return Err(format!(
                    "{argv0}: option '--{}' doesn't allow an argument",
                    def.long
                ));
            } else {
                found.push((def.short, None));
            }
        } else if arg.len() > 1 && arg.starts_with('-') {
            let chars: Vec<char> = arg[1..].chars().collect();
            let mut k = 0;
            while k < chars.len() {
                let c = chars[k];
                k += 1;
                let def = defs
                    .iter()
                    .find(|d| d.short == c)
                    .ok_or_else(|| format!("{argv0}: invalid option -- '{c}'"))?;
                if !def.has_arg {
                    found.push((c, None));
                    continue;
                }
                let rest: String = chars[k..].iter().collect();
                let value = if !rest.is_empty() {
                    rest
                } else if i < args.len() {
                    i += 1;
                    args[i - 1].clone()
                } else {
                    return Err(format!("{argv0}: option requires an argument -- '{c}'"));
                };
                found.push((c, Some(value)));
                break;
            }
        } else {
            positional.push(arg.clone());
        }
    }
    Ok((found, positional))
}

fn find_long<'a>(argv0: &str, defs: &'a [OptDef], name: &str) -> Result<&'a OptDef, String> {
    if let Some(d) = defs.iter().find(|d| !d.long.is_empty() && d.long == name) {
        return Ok(d);
    }
    let candidates: Vec<&OptDef> = defs
        .iter()
        .filter(|d| !name.is_empty() && d.long.starts_with(name))
        .collect();
    match candidates.as_slice() {
        [one] => Ok(one),
        [] => Err(format!("{argv0}: unrecognized option '--{name}'")),
        many => Err(format!(
            "{argv0}: option '--{name}' is ambiguous; possibilities:{}",
            many.iter()
                .map(|d| format!(" '--{}'", d.long))
                .collect::<String>()
        )),
    }
}

/// A number as `strtol(s, NULL, 0)` reads it (`0x` hex, leading `0` octal,
/// else decimal; leading blanks and one sign allowed), except that text that
/// is not entirely a number is refused rather than read as far as it goes,
/// and so is a number outside `long` (where `strtol` says `ERANGE`).
pub fn parse_c_int(s: &str) -> Option<i64> {
    // strtol's blanks are C's isspace: the ASCII ones only.
    let t = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let (radix, digits) = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        (16, h)
    } else if t.len() > 1 && t.starts_with('0') {
        (8, &t[1..])
    } else {
        (10, t)
    };
    // Digits only: `from_str_radix` would take a second sign ("--5", "0-5").
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let v = u64::from_str_radix(digits, radix).ok()?;
    if neg {
        0i64.checked_sub_unsigned(v)
    } else {
        i64::try_from(v).ok()
    }
}

/// `pp_mtu_to_enum`: 256, 512, 1024, 2048 or 4096 bytes.
pub fn mtu_from_bytes(bytes: i64) -> Option<Mtu> {
    u32::try_from(bytes).ok().and_then(Mtu::from_bytes)
}

fn usage(argv0: &str, prog: &Program) {
    println!("Usage:");
    println!("  {argv0}            start a server and wait for connection");
    println!("  {argv0} <host>     connect to server at <host>");
    println!();
    println!("Options:");
    for line in prog.help {
        println!("{line}");
    }
}

/// Parses the command line for `prog`. On a usage error it prints what
/// getopt would and the usage text, and gives the exit code (1) to return.
pub fn parse_args(prog: &Program) -> Result<Config, ExitCode> {
    let mut argv = std::env::args();
    let argv0 = argv.next().unwrap_or_else(|| "pingpong".into());
    let args: Vec<String> = argv.collect();
    match parse_config(&argv0, &args, prog) {
        Ok(cfg) => Ok(cfg),
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("{msg}");
            }
            usage(&argv0, prog);
            Err(ExitCode::FAILURE)
        }
    }
}

/// The options of `args` as settings; `Err(message)` means print the
/// message (if any) and the usage text.
pub fn parse_config(argv0: &str, args: &[String], prog: &Program) -> Result<Config, String> {
    let (found, positional) = getopt_long(argv0, args, prog.opts)?;
    let mut cfg = Config {
        servername: None,
        port: 18515,
        ib_devname: None,
        ib_port: 1,
        size: prog.default_size,
        mtu: Mtu::Mtu1024,
        rx_depth: 500,
        iters: 1000,
        sl: 0,
        use_event: false,
        gidx: None,
        validate: false,
        num_qp: 16,
        new_send: false,
        timestamps: false,
        odp: Odp::Off,
        flags: Vec::new(),
    };
    for (c, value) in found {
        let v = value.as_deref().unwrap_or("");
        let num =
            || parse_c_int(v).ok_or_else(|| format!("{argv0}: invalid number '{v}' for -{c}"));
        let unsigned = |max: i64| -> Result<i64, String> {
            match num()? {
                n if (0..=max).contains(&n) => Ok(n),
                n => Err(format!("{argv0}: -{c} {n} is out of range 0..={max}")),
            }
        };
        match c {
            'p' => cfg.port = unsigned(65535)? as u16,
            'd' => cfg.ib_devname = Some(v.to_owned()),
            'i' => match num()? {
                n @ 1..=255 => cfg.ib_port = n as u8,
                _ => return Err(String::new()),
            },
            's' => cfg.size = unsigned(i64::from(u32::MAX))? as usize,
            'm' => cfg.mtu = mtu_from_bytes(num()?).ok_or_else(String::new)?,
            'r' => cfg.rx_depth = unsigned(i64::from(u32::MAX))? as usize,
            'n' => cfg.iters = unsigned(i64::from(i32::MAX))? as u32,
            'l' => cfg.sl = unsigned(255)? as u8,
            'e' => cfg.use_event = true,
            'g' => {
                cfg.gidx = match num()? {
                    n if n < 0 => None,
                    n => Some(
                        u8::try_from(n)
                            .map_err(|_| format!("{argv0}: GID index {n} is above 255"))?,
                    ),
                }
            }
            'c' => cfg.validate = true,
            'q' => cfg.num_qp = unsigned(i64::from(u32::MAX))? as usize,
            'N' => cfg.new_send = true,
            't' => cfg.timestamps = true,
            other => {
                if !cfg.flags.contains(&other) {
                    cfg.flags.push(other)
                }
            }
        }
    }
    match positional.as_slice() {
        [] => {}
        [host] => cfg.servername = Some(host.clone()),
        _ => return Err(String::new()),
    }
    Ok(cfg)
}

/// The message for an option of the C program that this port cannot run:
/// `PROG: option -o/--odp (on-demand paging) is not available in this Rust
/// port: <what rdma-verbs lacks>`.
pub fn unsupported(prog: &str, flag: char) -> String {
    let (option, reason) = match flag {
        'o' => (
            "-o/--odp (on-demand paging)",
            "this program does not register its buffers on demand (rc_pingpong does)",
        ),
        'O' => (
            "-O/--iodp (implicit on-demand paging)",
            "rdma-verbs does not offer implicit ODP (ibv_reg_mr(pd, NULL, SIZE_MAX, ...)): its keys \
             would reach every byte of the process",
        ),
        'P' => (
            "-P/--prefetch (prefetch an ODP MR)",
            "this program does not register its buffers on demand (rc_pingpong does)",
        ),
        'j' => (
            "-j/--dm (device memory)",
            "rdma-verbs has no device memory (ibv_alloc_dm, ibv_reg_dm_mr, ibv_memcpy_to_dm)",
        ),
        'U' => ("-U", "it is not implemented"),
        _ => ("this option", "it is not implemented"),
    };
    format!("{prog}: option {option} is not available in this Rust port: {reason}")
}

/// Runs `body` on the parsed command line; prints its error and exits 1 on
/// failure, as the C programs do.
pub fn main_with(prog: &Program, body: fn(Config) -> Res<()>) -> ExitCode {
    let cfg = match parse_args(prog) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match body(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}
