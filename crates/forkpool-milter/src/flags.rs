//! The two bit sets negotiated at `SMFIC_OPTNEG`: what the filter may
//! change (`SMFIF_*`) and which steps the MTA sends and awaits a reply to
//! (`SMFIP_*`), and the stages macros are asked for (`SMFIM_*`).

use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign, Not};

macro_rules! bit_set {
    ($(#[$doc:meta])* $name:ident { $($(#[$bdoc:meta])* $bit:ident = $value:expr;)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub u32);

        impl $name {
            /// No bit set.
            pub const NONE: $name = $name(0);
            $($(#[$bdoc])* pub const $bit: $name = $name($value);)*
            /// Every bit this crate knows, with its name.
            pub const NAMED: &'static [(&'static str, $name)] = &[$((stringify!($bit), $name::$bit)),*];

            /// Whether every bit of `other` is set here.
            pub fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// The raw bits.
            pub fn bits(self) -> u32 {
                self.0
            }
        }

        impl BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }

        impl BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: $name) {
                self.0 |= rhs.0;
            }
        }

        impl BitAnd for $name {
            type Output = $name;
            fn bitand(self, rhs: $name) -> $name {
                $name(self.0 & rhs.0)
            }
        }

        impl Not for $name {
            type Output = $name;
            fn not(self) -> $name {
                $name(!self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut rest = self.0;
                let mut first = true;
                write!(f, "{}(", stringify!($name))?;
                for (name, bit) in $name::NAMED {
                    if self.0 & bit.0 == bit.0 && bit.0 != 0 && rest & bit.0 != 0 {
                        write!(f, "{}{name}", if first { "" } else { " | " })?;
                        rest &= !bit.0;
                        first = false;
                    }
                }
                if rest != 0 || first {
                    write!(f, "{}{rest:#x}", if first { "" } else { " | " })?;
                }
                f.write_str(")")
            }
        }
    };
}

bit_set! {
    /// What the filter may do at end of message (`SMFIF_*`).
    Actions {
        /// `SMFIF_ADDHDRS`: add and insert headers.
        ADD_HEADERS = 0x01;
        /// `SMFIF_CHGBODY`: replace the body.
        CHANGE_BODY = 0x02;
        /// `SMFIF_ADDRCPT`: add recipients.
        ADD_RCPT = 0x04;
        /// `SMFIF_DELRCPT`: delete recipients.
        DELETE_RCPT = 0x08;
        /// `SMFIF_CHGHDRS`: change and delete headers.
        CHANGE_HEADERS = 0x10;
        /// `SMFIF_QUARANTINE`: quarantine the message.
        QUARANTINE = 0x20;
        /// `SMFIF_CHGFROM`: change the envelope sender.
        CHANGE_FROM = 0x40;
        /// `SMFIF_ADDRCPT_PAR`: add recipients with ESMTP arguments.
        ADD_RCPT_PAR = 0x80;
        /// `SMFIF_SETSYMLIST`: ask for the macros wanted per stage.
        SET_SYMLIST = 0x100;
    }
}

bit_set! {
    /// Which steps the MTA sends, and which it awaits no reply to
    /// (`SMFIP_*`).
    Protocol {
        /// `SMFIP_NOCONNECT`: no connect.
        NO_CONNECT = 0x1;
        /// `SMFIP_NOHELO`: no HELO.
        NO_HELO = 0x2;
        /// `SMFIP_NOMAIL`: no MAIL.
        NO_MAIL = 0x4;
        /// `SMFIP_NORCPT`: no RCPT.
        NO_RCPT = 0x8;
        /// `SMFIP_NOBODY`: no body chunks.
        NO_BODY = 0x10;
        /// `SMFIP_NOHDRS`: no headers.
        NO_HEADERS = 0x20;
        /// `SMFIP_NOEOH`: no end of headers.
        NO_EOH = 0x40;
        /// `SMFIP_NR_HDR`: no reply to headers.
        NR_HEADER = 0x80;
        /// `SMFIP_NOUNKNOWN`: no unknown commands.
        NO_UNKNOWN = 0x100;
        /// `SMFIP_NODATA`: no DATA.
        NO_DATA = 0x200;
        /// `SMFIP_SKIP`: the MTA understands `SMFIR_SKIP` in the body.
        SKIP = 0x400;
        /// `SMFIP_RCPT_REJ`: send recipients the MTA rejected, too.
        RCPT_REJECTED = 0x800;
        /// `SMFIP_NR_CONN`: no reply to connect.
        NR_CONNECT = 0x1000;
        /// `SMFIP_NR_HELO`: no reply to HELO.
        NR_HELO = 0x2000;
        /// `SMFIP_NR_MAIL`: no reply to MAIL.
        NR_MAIL = 0x4000;
        /// `SMFIP_NR_RCPT`: no reply to RCPT.
        NR_RCPT = 0x8000;
        /// `SMFIP_NR_DATA`: no reply to DATA.
        NR_DATA = 0x10000;
        /// `SMFIP_NR_UNKN`: no reply to unknown commands.
        NR_UNKNOWN = 0x20000;
        /// `SMFIP_NR_EOH`: no reply to end of headers.
        NR_EOH = 0x40000;
        /// `SMFIP_NR_BODY`: no reply to body chunks.
        NR_BODY = 0x80000;
        /// `SMFIP_HDR_LEADSPC`: header values keep their leading space,
        /// both ways.
        HEADER_LEADING_SPACE = 0x100000;
        /// `SMFIP_MDS_256K`: body chunks up to 256 KiB.
        MAX_DATA_256K = 0x10000000;
        /// `SMFIP_MDS_1M`: body chunks up to 1 MiB.
        MAX_DATA_1M = 0x20000000;
    }
}

/// A stage the filter can ask macros for (`SMFIM_*`, in `setsymlist`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// `SMFIM_CONNECT`
    Connect,
    /// `SMFIM_HELO`
    Helo,
    /// `SMFIM_ENVFROM`
    Mail,
    /// `SMFIM_ENVRCPT`
    Rcpt,
    /// `SMFIM_DATA`
    Data,
    /// `SMFIM_EOM`
    Eom,
    /// `SMFIM_EOH`
    Eoh,
}

impl Stage {
    /// Every stage, in `SMFIM_*` order.
    pub const ALL: [Stage; 7] = [
        Stage::Connect,
        Stage::Helo,
        Stage::Mail,
        Stage::Rcpt,
        Stage::Data,
        Stage::Eom,
        Stage::Eoh,
    ];

    /// The number on the wire.
    pub fn code(self) -> u32 {
        match self {
            Stage::Connect => 0,
            Stage::Helo => 1,
            Stage::Mail => 2,
            Stage::Rcpt => 3,
            Stage::Data => 4,
            Stage::Eom => 5,
            Stage::Eoh => 6,
        }
    }

    /// The stage of a number on the wire.
    pub fn from_code(code: u32) -> Option<Stage> {
        Stage::ALL.get(usize::try_from(code).ok()?).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_names_the_bits() {
        let p = Protocol::NR_HEADER | Protocol::SKIP | Protocol(0x4000_0000);
        assert_eq!(format!("{p:?}"), "Protocol(NR_HEADER | SKIP | 0x40000000)");
        assert_eq!(format!("{:?}", Actions::NONE), "Actions(0x0)");
    }

    #[test]
    fn stages_round_trip() {
        for stage in Stage::ALL {
            assert_eq!(Stage::from_code(stage.code()), Some(stage));
        }
        assert_eq!(Stage::from_code(7), None);
    }
}
