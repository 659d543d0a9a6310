//! Helper macros shared by the object modules.

/// Declares a Rust enum that mirrors a C enum of `sys`, with `from_raw`,
/// `as_raw`, `c_name` and `ALL`. Each variant is documented with its C name.
///
/// ```text
/// c_enum! {
///     /// Doc.
///     pub enum QpState(ibv_qp_state): u32 {
///         /// Doc.
///         Reset = IBV_QPS_RESET,
///     }
/// }
/// ```
/// The part in parentheses names a module, in scope where the macro is
/// used, that holds the C constants (usually one of `sys`'s enum modules).
macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident ($m:ident) : $repr:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $cname:ident, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $(
                $(#[$vmeta])*
                #[doc = concat!("\n\nC: `", stringify!($cname), "`.")]
                $variant,
            )+
        }

        impl $name {
            /// Every value, in the C enum's order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// Decodes a C value; `None` for a value this crate does not know.
            pub fn from_raw(raw: $repr) -> Option<Self> {
                $(
                    if raw == $m::$cname as $repr {
                        return Some(Self::$variant);
                    }
                )+
                None
            }

            /// The C value.
            pub fn as_raw(self) -> $repr {
                match self {
                    $(Self::$variant => $m::$cname as $repr,)+
                }
            }

            /// The C name of the value.
            pub fn c_name(self) -> &'static str {
                match self {
                    $(Self::$variant => stringify!($cname),)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.c_name())
            }
        }
    };
}
