//! # Layout
//! The Engram portal and, under the `ssr` feature, the domain both the JSON API and the portal
//! call.
//! - `types`: records as the API and the portal show them (server and browser);
//! - `portal`: Leptos pages and their server functions (one module per area);
//! - `core` (`ssr` only): the domain, database access, model and queue job.
#![recursion_limit = "256"]

#[cfg(feature = "ssr")]
pub mod core;
pub mod portal;
pub mod types;

pub use portal::{shell, App};
