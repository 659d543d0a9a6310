//! A closed stdout (`example | head`) ends an example quietly, as it ends
//! a C program (which SIGPIPE kills): Rust ignores SIGPIPE, so a write to
//! the closed pipe fails with EPIPE and `println!` panics. [`install`]
//! turns that one panic into a quiet exit with the status a shell shows
//! for SIGPIPE (141); every other panic goes to the default hook.

/// The status a shell gives a process SIGPIPE killed (128 + 13).
pub const SIGPIPE_STATUS: i32 = 141;

/// Installs the hook; call it first in `main`.
pub fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        // `println!`'s and `eprintln!`'s message for EPIPE (errno 32).
        if msg.starts_with("failed printing to std") && msg.ends_with("(os error 32)") {
            std::process::exit(SIGPIPE_STATUS);
        }
        default(info)
    }));
}
