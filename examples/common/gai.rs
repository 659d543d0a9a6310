//! glibc's `getaddrinfo` error codes (`EAI_*`) and their `gai_strerror`
//! texts, shared by the connection manager's examples: the C programs print
//! the text and exit with the code, and the standard library's lookup error
//! carries only the text.
#![allow(dead_code)]

/// Every `EAI_*` code with its text.
pub const GAI_ERRORS: &[(i32, &str)] = &[
    (-1, "Bad value for ai_flags"),
    (-2, "Name or service not known"),
    (-3, "Temporary failure in name resolution"),
    (-4, "Non-recoverable failure in name resolution"),
    (-5, "No address associated with hostname"),
    (-6, "ai_family not supported"),
    (-7, "ai_socktype not supported"),
    (-8, "Servname not supported for ai_socktype"),
    (-9, "Address family for hostname not supported"),
    (-10, "Memory allocation failure"),
    (-11, "System error"),
    (-12, "Argument buffer overflow"),
];

/// `gai_strerror(code)`.
pub fn text_of(code: i32) -> &'static str {
    GAI_ERRORS
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("Unknown error", |(_, t)| t)
}

/// The code whose text is `text`, if glibc has one.
pub fn code_of(text: &str) -> Option<i32> {
    GAI_ERRORS.iter().find(|(_, t)| *t == text).map(|(c, _)| *c)
}

/// The `gai_strerror` text in the standard library's lookup error
/// ("failed to lookup address information: <text>").
pub fn text_in(e: &std::io::Error) -> String {
    let msg = e.to_string();
    msg.strip_prefix("failed to lookup address information: ")
        .unwrap_or(&msg)
        .to_owned()
}
