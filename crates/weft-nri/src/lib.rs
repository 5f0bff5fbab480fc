//! NRI (containerd Node Resource Interface) for weft: the wire protocol (the one-socket
//! multiplexer, ttrpc services and the messages weft needs) and a plugin runtime.
//!
//! - [`api`]: messages and ttrpc services generated from `proto/nri.proto`.
//! - [`mux`]: the trunk multiplexer both sides use.
//! - [`event`]: events and subscription masks.
//! - [`plugin`]: connect, register, serve a [`plugin::Handler`], reconnect.

pub mod event;
pub mod mux;
pub mod plugin;

/// The NRI messages and ttrpc services weft uses (generated from `proto/nri.proto`).
pub mod api {
    #[allow(
        missing_docs,
        dead_code,
        non_camel_case_types,
        non_snake_case,
        non_upper_case_globals,
        unused_mut,
        unused_imports,
        unused_results,
        trivial_casts,
        rust_2018_idioms,
        clippy::all,
        clippy::unwrap_used
    )]
    mod nri {
        include!(concat!(env!("OUT_DIR"), "/nri.rs"));
    }
    #[allow(
        missing_docs,
        dead_code,
        non_camel_case_types,
        non_snake_case,
        unused_imports,
        unused_results,
        rust_2018_idioms,
        clippy::all,
        clippy::unwrap_used
    )]
    mod nri_ttrpc {
        include!(concat!(env!("OUT_DIR"), "/nri_ttrpc.rs"));
    }
    pub use nri::*;
    pub use nri_ttrpc::*;
}
