//! The float order of quantized dot products, chosen once at start-up.
//!
//! A 32-element block's products sum exactly in integers; what differs is how the float
//! scales are applied:
//!
//! * [`DotOrder::Llama`] (the default) keeps eight float lanes per output, each adding
//!   its four products' integer sum times the block scale with one FMA, as llama.cpp's
//!   x86 kernels do. Logits are then bit-identical to llama.cpp's, and greedy output
//!   matches it token for token. This model amplifies last-bit differences until tokens
//!   flip, so only this order reproduces llama.cpp's text.
//! * [`DotOrder::Block`] adds each block's whole integer sum with one FMA. Per 32 products
//!   that is one convert and one FMA instead of eight of each, so batched matrix products
//!   run about 1.65× faster, and the result is as precise or more. Outputs are just as
//!   deterministic (the same on every CPU, batch and thread split) but differ from
//!   llama.cpp's in the last bits, and so now and then in a token.
//!
//! `Q4_0`, `IQ4_NL` and `MXFP4` know only the block order: llama.cpp's x86 build repacks their
//! matrices (eight interleaved rows) and its kernels for those add whole block sums. (It
//! does not repack a matrix whose row count is not a multiple of eight, and multiplies
//! that one in the lanes order; Blink does not follow it there.)
//!
//! In the llama order a row also follows how llama.cpp would batch it
//! ([`crate::gemm::RowForm`]): `Q4_K` rows in groups of four, and the tiled products of
//! `Q5_K`, `Q6_K` and `IQ4_XS` for micro-batches of eight rows or more
//! ([`crate::quant::vec_dot_tiled`]).
//!
//! `BLINK_DOT_ORDER=llama|block` (or [`force`], behind the CLI's `--dot-order`) picks one.

use std::fmt;
use std::sync::OnceLock;

/// How a quantized dot product applies its block scales (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DotOrder {
    /// Eight float lanes per output: llama.cpp's x86 order.
    #[default]
    Llama,
    /// One float step per block.
    Block,
}

impl DotOrder {
    pub fn name(self) -> &'static str {
        match self {
            DotOrder::Llama => "llama",
            DotOrder::Block => "block",
        }
    }

    pub fn parse(s: &str) -> Option<DotOrder> {
        [DotOrder::Llama, DotOrder::Block].into_iter().find(|o| o.name() == s)
    }
}

impl fmt::Display for DotOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

static ACTIVE: OnceLock<DotOrder> = OnceLock::new();

/// Why an order cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OrderError {
    #[error("unknown dot order '{0}' (use llama or block)")]
    Unknown(String),
    #[error("the dot order is already fixed to {0}")]
    AlreadySet(DotOrder),
}

/// Fix the order before first use. Fails if another one is already in use.
pub fn force(order: DotOrder) -> Result<(), OrderError> {
    let chosen = *ACTIVE.get_or_init(|| order);
    if chosen == order {
        Ok(())
    } else {
        Err(OrderError::AlreadySet(chosen))
    }
}

/// The order in use: forced, else `BLINK_DOT_ORDER`, else [`DotOrder::Llama`].
///
/// An unknown `BLINK_DOT_ORDER` value falls back to the default with a warning on stderr.
pub fn active() -> DotOrder {
    *ACTIVE.get_or_init(|| match std::env::var("BLINK_DOT_ORDER") {
        Ok(v) if !v.is_empty() => DotOrder::parse(&v).unwrap_or_else(|| {
            eprintln!("blink: BLINK_DOT_ORDER: {}; using {}", OrderError::Unknown(v), DotOrder::default());
            DotOrder::default()
        }),
        _ => DotOrder::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for order in [DotOrder::Llama, DotOrder::Block] {
            assert_eq!(DotOrder::parse(order.name()), Some(order));
        }
        assert_eq!(DotOrder::parse("fast"), None);
    }
}
