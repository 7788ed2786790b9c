//! # Layout
//! The domain, under the `ssr` feature: every rule of the product is written once here and
//! called by both the JSON API (`server`) and the portal's server functions.
//!
//! - `error`, `validate`: the contract's error type and FastAPI-shaped validation;
//! - `state`: settings and the per-process state;
//! - `crypto`: password hashes, tokens, keys, codes (hashes only are stored);
//! - `accounts`, `keys`, `projects`, `memories`, `tasks`, `machines`, `claims`,
//!   `conversations`: resources;
//! - `proxy`: the LLM proxy's upstreams (keys sealed), memory injection and request records;
//! - `embed`, `encoder`, `dense`, `classify`, `llm`, `ingest`: the model (its encoder layer and
//!   dense products), the classifier and the queue job;
//! - `search`: hybrid search; `terms`: cached term statistics for its BM25; `dates`: the days
//!   a query or a memory's metadata names;
//! - `mail`, `smtp`: outgoing mail and the development mailbox;
//! - `ratelimit`, `usage`: rate limits shared through the database in leases, batched API-call counts;
//! - `stats`: an account's statistics from daily roll-ups; `plans`: plans, quotas (402) and
//!   the billing webhook;
//! - `transfer`: an account's export and import as JSON Lines;
//! - `group`: group commit, for the writes many requests or jobs make at once.
pub mod accounts;
pub mod claims;
pub mod classify;
pub mod clientaddr;
pub mod conversations;
pub mod crypto;
pub mod dates;
pub mod dense;
pub mod embed;
pub mod encoder;
pub mod error;
pub mod group;
pub mod ingest;
pub mod keys;
pub mod llm;
pub mod machines;
pub mod mail;
pub mod memories;
pub mod models;
pub mod plans;
pub mod projects;
pub mod proxy;
pub mod ratelimit;
pub mod search;
pub mod smtp;
pub mod state;
pub mod stats;
pub mod tasks;
pub mod terms;
pub mod time;
pub mod transfer;
pub mod usage;
pub mod validate;
