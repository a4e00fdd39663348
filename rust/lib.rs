//! comppo-core kernels: Comp-GAE (gated GAE), one-step TD targets, the
//! concentration → retention-gate mapping, group-relative outcome advantages,
//! broadcasting, masked whitening and credit diagnostics, over padded or packed batches.
//!
//! Plain Rust, no Python: the bindings live in `bindings.rs` behind the `python`
//! feature, so `cargo test` needs no libpython.

pub mod broadcast;
pub mod buffers;
pub mod checks;
pub mod cpu;
pub mod element;
pub mod error;
pub mod exp;
pub mod gae;
pub mod gating;
pub mod layout;
pub mod outcome;
pub mod pool;
pub mod stats;
pub mod td;
pub mod whiten;

pub use element::{AllValid, Float, MaskElem, UnitGates};
pub use error::{KernelError, Result};
pub use gae::{gae, GaeParams};
pub use gating::{gates_from_concentration, GateParams, Normalize};
pub use layout::Layout;
pub use td::td_targets;

#[cfg(feature = "python")]
mod bindings;
