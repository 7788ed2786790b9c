//! Shared state of one process: the pool, the settings, and the in-memory helpers.
use std::sync::Arc;

use axum::extract::FromRef;
use leptos::config::LeptosOptions;
use sqlx::PgPool;

use super::embed::EmbedderHandle;
use super::ratelimit::RateLimiter;
use super::usage::UsageCounter;

/// A database connection idle longer than this is checked with a round trip before use (the
/// pool's and the memory writer's alike); one used more recently is trusted as it is.
pub const CHECK_IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);
/// Longest a request waits for a database connection before it answers 503.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Settings the domain needs, read once from the environment by the server.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `production` or `development`.
    pub production: bool,
    /// HS256 secret for access tokens.
    pub jwt_secret: Vec<u8>,
    /// Access token lifetime in seconds.
    pub jwt_ttl_secs: i64,
    /// Public URL of the portal, used in e-mailed links.
    pub public_url: String,
    /// Rate limits (requests per window).
    pub limits: LimitSettings,
    /// Outgoing mail; `None` keeps mail in the development mailbox.
    pub smtp_url: Option<String>,
    /// The From address of outgoing mail.
    pub mail_from: String,
    /// An OpenAI-compatible classifier, when configured.
    pub llm: Option<LlmSettings>,
    /// How long a claim code lives, in seconds.
    pub claim_ttl_secs: i64,
    /// Whether API keys' owners are cached (see `keys::KeyCache`).
    pub key_cache: bool,
    /// Proxies whose `X-Forwarded-For` names the client (see `clientaddr`).
    pub trusted_proxies: super::clientaddr::TrustedProxies,
    /// The LLM proxy: upstreams, the key sealing theirs, injection.
    pub proxy: super::proxy::ProxySettings,
    /// Plans and billing.
    pub billing: BillingSettings,
}

/// Plans and billing: the plan new accounts get, the webhook's secret, how to change plans.
#[derive(Clone, Debug)]
pub struct BillingSettings {
    /// `ENGRAM_DEFAULT_PLAN` (`unlimited` unless set).
    pub default_plan: String,
    /// The billing webhook's signing secret; `None`: the webhook is off.
    pub webhook_secret: Option<String>,
    /// Where a user goes to change plans, when billing is configured.
    pub checkout_url: Option<String>,
    /// Whom a user asks to change plans (the operator).
    pub contact: Option<String>,
}

impl BillingSettings {
    pub fn for_tests() -> Self {
        Self {
            default_plan: "unlimited".into(),
            webhook_secret: Some("whsec_engram_tests".into()),
            checkout_url: None,
            contact: Some("the operator of this server".into()),
        }
    }
    pub fn view(&self) -> crate::types::Billing {
        crate::types::Billing {
            checkout_url: self.checkout_url.clone(),
            contact: self.contact.clone(),
        }
    }
}

/// Rate limits of the contract; each can be raised by configuration.
#[derive(Clone, Debug)]
pub struct LimitSettings {
    pub login_per_minute: u32,
    pub register_per_hour: u32,
    pub auto_register_per_hour: u32,
    pub api_per_minute: u32,
    /// Public model-catalogue searches per client address per minute.
    pub models_per_minute: u32,
    pub claims: ClaimLimits,
}

/// Limits on claiming machines, counted in the database (see `claims`).
#[derive(Clone, Debug)]
pub struct ClaimLimits {
    /// `claim/init` calls per machine per hour.
    pub init_per_machine_per_hour: u32,
    /// `claim/init` calls naming one e-mail per hour (also the most codes it is mailed).
    pub init_per_email_per_hour: u32,
    /// Wrong codes per machine per day, across claims.
    pub wrong_per_machine_per_day: u32,
    /// Wrong codes per e-mail per day through the agents API, across machines.
    pub wrong_per_email_per_day: u32,
}

impl Default for ClaimLimits {
    fn default() -> Self {
        Self {
            init_per_machine_per_hour: 5,
            init_per_email_per_hour: 20,
            wrong_per_machine_per_day: 10,
            wrong_per_email_per_day: 20,
        }
    }
}

/// An OpenAI-compatible chat endpoint that classifies instead of the local model.
#[derive(Clone)]
pub struct LlmSettings {
    pub base_url: String,
    pub api_key: String,
    pub model: String,
}

impl std::fmt::Debug for LlmSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmSettings")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// Settings for tests and local development: a fixed secret, generous limits.
    pub fn for_tests() -> Self {
        Self {
            production: false,
            jwt_secret: b"test-secret-test-secret-test-secret!".to_vec(),
            jwt_ttl_secs: 24 * 3600,
            public_url: "http://127.0.0.1:3000".into(),
            limits: LimitSettings {
                login_per_minute: 10,
                register_per_hour: 10_000,
                auto_register_per_hour: 10_000,
                api_per_minute: 100_000,
                models_per_minute: 100_000,
                claims: ClaimLimits::default(),
            },
            smtp_url: None,
            mail_from: "Engram <noreply@engram.local>".into(),
            llm: None,
            claim_ttl_secs: 15 * 60,
            key_cache: true,
            trusted_proxies: Default::default(),
            proxy: super::proxy::ProxySettings::for_tests(),
            billing: BillingSettings::for_tests(),
        }
    }
}

/// Everything a handler or server function reaches: one `Arc`, so the clones every request
/// makes (each extractor takes its own) cost one reference count, not one per field (profiled
/// under load: cloning and dropping the fields one by one, `LeptosOptions` included, was 5 % of
/// the server's CPU per `POST /api/v1/memories`).
#[derive(Clone)]
pub struct AppState(Arc<AppStateInner>);

/// The fields of [`AppState`], reached through it (`state.pool`).
pub struct AppStateInner {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    pub limiter: Arc<RateLimiter>,
    pub usage: Arc<UsageCounter>,
    pub embedder: EmbedderHandle,
    pub leptos_options: LeptosOptions,
    pub http: reqwest::Client,
    /// Group commit of new memories.
    pub writer: Arc<super::memories::EnqueueWriter>,
    /// The owners of API keys presented recently.
    pub keys: Arc<super::keys::KeyCache>,
    /// This process's copy of the public model catalogue.
    pub models: Arc<super::models::ModelCatalog>,
    /// API calls and searches counted, not yet written to the daily roll-ups.
    pub stats: Arc<super::stats::DailyRecorder>,
    /// Plans and quota use of the accounts served (checked without a round trip).
    pub quotas: Arc<super::plans::Quotas>,
}

impl AppState {
    pub fn new(inner: AppStateInner) -> Self {
        Self(Arc::new(inner))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppStateInner;

    fn deref(&self) -> &AppStateInner {
        &self.0
    }
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}
